"""TIR analysis: PrimFunc → axes, accesses, footprint and traffic of a tile."""
from tvm_roller.analysis.access import Access
from tvm_roller.analysis.func import Axis, BlockInfo, FuncAnalysis, analyze, unwrap_func

__all__ = ["Access", "Axis", "BlockInfo", "FuncAnalysis", "analyze", "unwrap_func"]
