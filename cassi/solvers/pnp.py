"""Plug-and-play GAP and ADMM with any denoiser, and their TV instances GAPTV / ADMMTV.

A denoiser is any callable on (B, C, H, W) -> (B, C, H, W), called as ``denoiser(x)``, or as
``denoiser(x, sigma_k)`` when the solver has a strength schedule (``sigma``/``stages``): the
noise level for a denoising network, the TV weight for :class:`TVDenoiser`. The input is a
scratch tensor that the solver never reads again: a denoiser may overwrite and return it.

Both data steps are ``op.data_step`` written into preallocated buffers, with Φ = op.phi
(precomputed by the operator) and, in GAP, A v reused from the residual of the last step.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

import torch

from cassi._checks import check_number
from cassi.registry import register
from cassi.solvers.base import Solver, schedule
from cassi.solvers.tv import TVDenoiser

__all__ = ["GAP", "ADMM", "GAPTV", "ADMMTV"]


def _other(bufs: tuple[torch.Tensor, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """The buffer of the pair that does not hold v (v may be one of them after an in-place denoiser)."""
    return bufs[1] if bufs[0].data_ptr() == v.data_ptr() else bufs[0]


class _PnP(Solver):
    """A solver with a denoiser and an optional strength schedule (see ``base.schedule``)."""

    def __init__(self, denoiser: Callable, iters: int | None, sigma: float | None, decay: float,
                 sigma_min: float, stages: Sequence | None, tol: float):
        if not callable(denoiser):
            raise TypeError(f"denoiser must be callable (B, C, H, W) -> (B, C, H, W), got {type(denoiser).__name__}")
        iters, self._sigmas = schedule(iters, sigma, decay, sigma_min, stages)
        super().__init__(iters, tol)
        self.denoiser = denoiser
        self.sigma, self.decay, self.sigma_min, self.stages = sigma, decay, sigma_min, stages

    @property
    def sigmas(self) -> list[float] | None:
        """The strength σ_k of every iteration (None: the denoiser is called without one)."""
        return None if self._sigmas is None else list(self._sigmas)

    def _denoise(self, x: torch.Tensor, k: int) -> torch.Tensor:
        v = self.denoiser(x) if self._sigmas is None else self.denoiser(x, self._sigmas[k])
        if not isinstance(v, torch.Tensor) or v.shape != x.shape:
            raise ValueError(f"the denoiser must return a tensor of shape {tuple(x.shape)}, "
                             f"got {getattr(v, 'shape', type(v).__name__)}")
        return v

    def _history(self, state, k: int) -> dict:
        return {} if self._sigmas is None else {"sigma": torch.tensor(self._sigmas[:k])}


@register
class GAP(_PnP):
    """Generalized alternating projection (Liao, Li & Carin 2014), accelerated as in GAP-TV (Yuan 2016).

        y_k = y_{k−1} + (y − A v)   (accelerate; y_0 = y; else y_k = y)
        x   = v + λ·Aᵀ((y_k − A v) ⊘ Φ)        = op.data_step(v, y_k) for λ = 1
        v   = D(x[, σ_k])
    Returns v. Args: denoiser D; iters (default 100); accelerate; step λ in (0, 2); the schedule
    sigma (σ_0), decay (σ_k = max(σ_0·decay^k, sigma_min)) or stages [(n, σ), ...]; tol.
    """

    def __init__(self, denoiser: Callable, iters: int | None = None, accelerate: bool = True, step: float = 1.0,
                 sigma: float | None = None, decay: float = 1.0, sigma_min: float = 0.0,
                 stages: Sequence | None = None, tol: float = 0.0):
        super().__init__(denoiser, iters, sigma, decay, sigma_min, stages, tol)
        self.accelerate = bool(accelerate)
        self.step = check_number("step", step, below=2.0)

    def _init(self, op, y, x):
        return SimpleNamespace(v=x, av=op(x), yk=y.clone() if self.accelerate else y, r=torch.empty_like(y),
                               bufs=(x, torch.empty_like(x)))

    def _step(self, op, y, s, k):
        if self.accelerate:
            s.yk.add_(y).sub_(s.av)
        r = torch.sub(s.yk, s.av, out=s.r).mul_(op.phi_inv)
        if self.step != 1.0:
            r.mul_(self.step)
        x = op.adjoint(r, out=_other(s.bufs, s.v)).add_(s.v)
        s.v = self._denoise(x, k)
        return s.v, op(s.v, out=s.av)


@register
class ADMM(_PnP):
    """ADMM / PnP-ADMM (Chan et al. 2017; for SCI: Yuan et al. 2020), scaled dual u.

        x = op.data_step(v − u, y, ρ) = (v − u) + Aᵀ((y − A(v − u)) ⊘ (Φ + ρ))
        v = D(x + u[, σ_k]);   u ← u + x − v
    Returns v. Args: denoiser D; rho ρ > 0; iters (default 100); schedule as in :class:`GAP`; tol.
    """

    def __init__(self, denoiser: Callable, rho: float = 0.1, iters: int | None = None, sigma: float | None = None,
                 decay: float = 1.0, sigma_min: float = 0.0, stages: Sequence | None = None, tol: float = 0.0):
        super().__init__(denoiser, iters, sigma, decay, sigma_min, stages, tol)
        self.rho = check_number("rho", rho)

    def _init(self, op, y, x):
        return SimpleNamespace(v=x, u=torch.zeros_like(x), x=torch.empty_like(x), z=torch.empty_like(x),
                               w=1 / (op.phi + self.rho), r=torch.empty_like(y), av=torch.empty_like(y))

    def _step(self, op, y, s, k):
        z = torch.sub(s.v, s.u, out=s.z)                               # z = v − u
        r = torch.sub(y, op(z, out=s.r), out=s.r).mul_(s.w)            # (y − A z) ⊘ (Φ + ρ)
        x = op.adjoint(r, out=s.x).add_(z)
        s.v = self._denoise(torch.add(x, s.u, out=s.z), k)
        s.u.add_(x).sub_(s.v)
        return s.v, op(s.v, out=s.av)


@register
class GAPTV(GAP):
    """GAP with the TV denoiser (GAP-TV, Yuan 2016): weight schedule w_k = max(tv_weight·decay^k, weight_min)
    or stages [(n, w), ...]; tv_iters dual steps per call; spectral_weight > 0: spatial–spectral TV.
    Defaults: 80 iterations (Σ n with stages), tuned on 256×256×28 synthetic scenes."""

    def __init__(self, iters: int | None = None, tv_weight: float = 0.4, tv_iters: int = 5, decay: float = 0.95,
                 weight_min: float = 0.0, stages: Sequence | None = None, spectral_weight: float = 0.0,
                 accelerate: bool = True, step: float = 1.0, tol: float = 0.0):
        it, *sched = _tv_schedule(iters, tv_weight, decay, weight_min, stages)
        super().__init__(TVDenoiser(tv_weight, tv_iters, spectral_weight, inplace=True), it, accelerate, step,
                         *sched, tol=tol)


@register
class ADMMTV(ADMM):
    """ADMM with the TV denoiser; parameters and defaults as in :class:`GAPTV`, plus rho ρ."""

    def __init__(self, rho: float = 0.1, iters: int | None = None, tv_weight: float = 0.4, tv_iters: int = 5,
                 decay: float = 0.95, weight_min: float = 0.0, stages: Sequence | None = None,
                 spectral_weight: float = 0.0, tol: float = 0.0):
        it, *sched = _tv_schedule(iters, tv_weight, decay, weight_min, stages)
        super().__init__(TVDenoiser(tv_weight, tv_iters, spectral_weight, inplace=True), rho, it, *sched, tol=tol)


def _tv_schedule(iters, tv_weight, decay, weight_min, stages):
    """(iters, sigma, decay, sigma_min, stages) for _PnP from the TV solvers' arguments (checked
    here so that errors name them); stages, when given, replace tv_weight and decay."""
    check_number("tv_weight", tv_weight)
    iters = _TV_ITERS if iters is None and stages is None else iters
    schedule(iters, tv_weight, 1.0 if stages is not None else decay, weight_min, stages, "weight", "weight_min")
    return (iters, None, 1.0, weight_min, stages) if stages is not None else (iters, tv_weight, decay, weight_min, None)


_TV_ITERS = 80
