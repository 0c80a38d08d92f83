"""TIR analysis: PrimFunc → axes, accesses, footprint and traffic of a tile."""
from .access import Access
from .func import Axis, BlockInfo, FuncAnalysis, analyze, unwrap_func

__all__ = ["Access", "Axis", "BlockInfo", "FuncAnalysis", "analyze", "unwrap_func"]
