"""Cost check: roller's analytical micro-model against measurements, with an XGBoost second opinion.

``sample`` draws valid rTiles from the same space the policy searches, ``dataset`` measures them
(with the model's prediction and its terms), ``report`` computes rank correlations, top-1 regret and
top-k recall per workload, cross-validates an XGBoost regressor by workload, and draws the plots.
"""
from tvm_roller.tools.costcheck.dataset import Candidate, measure_workloads
from tvm_roller.tools.costcheck.report import build_report
from tvm_roller.tools.costcheck.sample import random_tiles

__all__ = ["Candidate", "measure_workloads", "build_report", "random_tiles"]
