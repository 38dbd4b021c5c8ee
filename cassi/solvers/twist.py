"""TwIST: two-step iterative shrinkage/thresholding (Bioucas-Dias & Figueiredo 2007) with TV.

Minimises f(x) = ½‖(y − A x) ⊘ √Φ‖² + λ·TV(x), the data term weighted by Φ⁻¹ = diag(A Aᵀ)⁻¹
so that the normalised operator Φ^{-1/2} A has ‖·‖ = 1 (λ_N = 1) and the Landweber step is
the GAP projection. With Ψ_λ the TV denoiser (weight λ):

    ξ_t     = Ψ_λ(x_t + Aᵀ((y − A x_t) ⊘ Φ))                 (IST step)
    x_{t+1} = (1 − α) x_{t−1} + (α − β) x_t + β ξ_t          (two-step)

α = 2/(1 + √(1 − ρ₀²)), β = 2α/(λ_1 + λ_N), ρ₀ = (1 − κ)/(1 + κ), κ = λ_1/λ_N (the paper's
choice for an operator whose AᵀA has eigenvalues in [λ_1, λ_N]). Monotone safeguard: a sample
whose objective would increase takes the IST step ξ_t instead (per sample, so a batch
gives the same results as its samples one by one). The first step is an IST step.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from cassi._checks import check_number
from cassi.registry import register
from cassi.solvers.base import Solver
from cassi.solvers.tv import TVDenoiser, tv_norm

__all__ = ["TwIST", "twist_parameters"]


def twist_parameters(lam1: float = 1e-4, lamN: float = 1.0) -> tuple[float, float]:
    """(α, β) of Bioucas-Dias & Figueiredo (2007, eqs. 26–27) for eigenvalues of AᵀA in [λ_1, λ_N]."""
    kappa = check_number("lam1", lam1) / check_number("lamN", lamN)
    if kappa > 1:
        raise ValueError(f"lam1 must be <= lamN, got lam1={lam1}, lamN={lamN}")
    rho0 = (1 - kappa) / (1 + kappa)
    alpha = 2 / (1 + math.sqrt(1 - rho0 * rho0))
    return alpha, 2 * alpha / (lam1 + lamN)


@register
class TwIST(Solver):
    """TwIST with the TV denoiser Ψ (see module doc). x (B, C, H, W) from y (B, 1, H, W+Δ).

    Args: tv_weight λ > 0; alpha, beta (None: from lam1 via :func:`twist_parameters`);
    lam1 λ_1 in (0, 1]; iters; tv_iters dual steps per Ψ; spectral_weight (spatial–spectral
    TV); monotone safeguard on/off; tol. history["objective"] (K+1, B) holds f(x_k).
    """

    def __init__(self, tv_weight: float = 0.005, alpha: float | None = None, beta: float | None = None,
                 iters: int = 100, lam1: float = 1e-4, tv_iters: int = 5, spectral_weight: float = 0.0,
                 monotone: bool = True, tol: float = 0.0):
        super().__init__(iters, tol)
        a, b = twist_parameters(lam1, 1.0)
        self.alpha = a if alpha is None else check_number("alpha", alpha)
        self.beta = b if beta is None else check_number("beta", beta)
        self.tv_weight, self.lam1, self.monotone = check_number("tv_weight", tv_weight), lam1, bool(monotone)
        self.denoiser = TVDenoiser(tv_weight, tv_iters, spectral_weight, inplace=True)

    def _objective(self, op, y, x, ax, r):
        """f(x) per sample (B,): ½‖(y − A x) ⊘ √Φ‖² + λ TV(x)."""
        torch.sub(y, ax, out=r)
        data = 0.5 * (r.square_().mul_(op.phi_inv)).flatten(1).sum(1)
        return data + self.tv_weight * tv_norm(x, self.denoiser.spectral_weight)

    def _init(self, op, y, x):
        s = SimpleNamespace(x=x, xm1=None, ax=op(x), r=torch.empty_like(y),
                            bufs=[torch.empty_like(x), torch.empty_like(x)])
        s.f = self._objective(op, y, x, s.ax, s.r)
        s.fs = [s.f]
        return s

    def _step(self, op, y, s, k):
        xi = s.bufs.pop()                                              # scratch → ξ_t
        torch.sub(y, s.ax, out=s.r).mul_(op.phi_inv)
        xi = self.denoiser(op.adjoint(s.r, out=xi).add_(s.x))           # Ψ(x_t + Aᵀ((y − A x_t) ⊘ Φ))
        if s.xm1 is None:                                              # first step: IST
            new, anew = xi, op(xi)
        else:
            new = s.xm1.mul_(1 - self.alpha).add_(s.x, alpha=self.alpha - self.beta).add_(xi, alpha=self.beta)
            anew = op(new)
        fnew = self._objective(op, y, new, anew, s.r)
        if self.monotone and s.xm1 is not None:
            bad = fnew > s.f                                           # (B,) objective went up: take ξ_t
            if bool(bad.any()):
                axi = op(xi)
                fxi = self._objective(op, y, xi, axi, s.r)
                b4 = bad.view(-1, 1, 1, 1)
                new = torch.where(b4, xi, new, out=new)
                anew = torch.where(b4, axi, anew)
                fnew = torch.where(bad, fxi, fnew)
        # rotate buffers: x_{t−1} ← x_t, x_t ← new; the rest is scratch
        used = {t.data_ptr() for t in (s.x, new)}
        spare = [t for t in (s.xm1, xi) if t is not None and t.data_ptr() not in used]
        s.bufs.extend(spare)
        s.xm1, s.x, s.ax, s.f = s.x, new, anew, fnew
        s.fs.append(fnew)
        return s.x, s.ax

    def _history(self, s, k: int) -> dict:
        return {"objective": torch.stack(s.fs).cpu()}
