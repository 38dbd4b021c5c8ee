"""Model-based iterative reconstruction: GAP, ADMM, TwIST, plug-and-play, and the TV prior.

Every solver is called as ``solver(op, y, x0=None, gt=None, callback=None) -> Result``
(op a :class:`cassi.CASSI`, y (B, 1, H, W+Δ), x (B, C, H, W)); ``Result`` has ``.x``,
``.history`` and ``.iterations`` and unpacks as ``x, history``. Imports torch only.
"""
from cassi.solvers.base import PseudoInverse, Result, Solver, psnr
from cassi.solvers.pnp import ADMM, ADMMTV, GAP, GAPTV
from cassi.solvers.tv import TVDenoiser, tv_norm
from cassi.solvers.twist import TwIST, twist_parameters

__all__ = ["ADMM", "ADMMTV", "GAP", "GAPTV", "PseudoInverse", "Result", "Solver", "TVDenoiser", "TwIST",
           "psnr", "tv_norm", "twist_parameters"]
