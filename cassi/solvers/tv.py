"""Total-variation prior: the TV value and a fast TV denoiser on (B, C, H, W).

    TV(u)  = Σ_{b,c,h,w} sqrt(|∂_h u|² + |∂_w u|² + s²|∂_c u|²)   (forward differences, 0 at the far edge)
    D_w(f) = argmin_u ½‖u − f‖² + w·TV(u)

s = 0 is 2-D isotropic TV of every band on its own; s > 0 adds the band-difference
term (spatial–spectral TV, bands coupled). The denoiser is Chambolle's (2004) semi-implicit
dual iteration, u = f − w·div p:

    g = ∇(div p − f/w);   p ← (p + τ g) / (1 + τ|g|),   τ = 1/(4 + 2s²)

started from p = 0 on every call (the ``TV_denoising`` of Yuan's GAP-TV code, with the exact
adjoint divergence). All bands and samples are updated at once; the only Python loop runs
over blocks of planes sized to stay in the CPU cache (with s = 0 the dual iterations of one
plane never read another plane).
"""
from __future__ import annotations

import math

import torch

from cassi.solvers.base import check_int, check_number

__all__ = ["TVDenoiser", "tv_norm"]

_BLOCK_BYTES = 12 << 20  # working set per block on CPU (about a third of a 32 MB L3 cache)


def tv_norm(x: torch.Tensor, spectral_weight: float = 0.0) -> torch.Tensor:
    """TV(x) per sample, (B, C, H, W) -> (B,): Σ sqrt(|∂_h x|² + |∂_w x|² + s²|∂_c x|²)."""
    if x.ndim != 4:
        raise ValueError(f"x must be a cube (B, C, H, W), got shape {tuple(x.shape)}")
    g = torch.zeros((3 if spectral_weight else 2, *x.shape), dtype=x.dtype, device=x.device)
    torch.sub(x[..., 1:, :], x[..., :-1, :], out=g[0, ..., :-1, :])
    torch.sub(x[..., 1:], x[..., :-1], out=g[1, ..., :-1])
    if spectral_weight:
        torch.sub(x[:, 1:], x[:, :-1], out=g[2, :, :-1]).mul_(spectral_weight)
    return g.square_().sum(0).sqrt_().flatten(1).sum(1)


class TVDenoiser:
    """TV denoiser D_w(f) = argmin_u ½‖u − f‖² + w·TV(u) on (B, C, H, W), ``iters`` dual steps.

    Args:
        weight: w > 0, the default strength (a solver's schedule passes its own as ``weight``).
        iters: dual (Chambolle) iterations per call, from p = 0.
        spectral_weight: s ≥ 0; s > 0 adds s·|∂_c u| inside the norm (spatial–spectral TV).
        inplace: overwrite and return the input if contiguous (the solvers in ``cassi.solvers``
            give the denoiser a scratch tensor, so ``inplace=True`` saves an allocation per call).

    Call as ``den(f)`` or ``den(f, weight)``. A workspace for the last block shape is kept
    between calls (2K+1 blocks, K = 2 or 3 gradient components), so a loop allocates nothing.
    """

    def __init__(self, weight: float = 0.1, iters: int = 5, spectral_weight: float = 0.0, inplace: bool = False):
        self.weight = check_number("weight", weight)
        self.iters = check_int("iters", iters)
        self.spectral_weight = check_number("spectral_weight", spectral_weight, positive=False)
        self.inplace = bool(inplace)
        self._ws: tuple | None = None

    def __repr__(self) -> str:
        return (f"TVDenoiser(weight={self.weight}, iters={self.iters}, "
                f"spectral_weight={self.spectral_weight}, inplace={self.inplace})")

    def __call__(self, f: torch.Tensor, weight: float | None = None) -> torch.Tensor:
        w = self.weight if weight is None else check_number("weight", weight)
        if not isinstance(f, torch.Tensor) or f.ndim != 4 or not f.is_floating_point():
            raise ValueError(f"f must be a float cube (B, C, H, W), got {getattr(f, 'shape', type(f).__name__)}")
        f = f.contiguous()
        out = f if self.inplace else torch.empty_like(f)
        s = self.spectral_weight
        # Blocks of independent planes: (1, B·C, H, W) split along planes (s = 0) or samples (s > 0).
        planes = f.reshape(1, -1, *f.shape[-2:]) if s == 0 else f
        dst = out.view(planes.shape)
        dim = 1 if s == 0 else 0
        n = planes.shape[dim]
        per = n
        if f.device.type == "cpu":
            per_bytes = planes.select(dim, 0).numel() * f.element_size() * (6 if s == 0 else 8)
            per = max(1, min(n, _BLOCK_BYTES // per_bytes))
            per = math.ceil(n / math.ceil(n / per))  # equal blocks
        for i in range(0, n, per):
            self._block(planes.narrow(dim, i, min(per, n - i)), w, dst.narrow(dim, i, min(per, n - i)), dim)
        return out

    def _workspace(self, f: torch.Tensor, dim: int):
        """(P, G, d) views of size f.shape (P, G with K leading components), reallocated only
        for a larger block, another layout, dtype or device. G's far edges stay 0."""
        k = 3 if self.spectral_weight else 2
        key = (k, dim, f.dtype, f.device, f.shape[:dim] + f.shape[dim + 1:])
        if self._ws is None or self._ws[0] != key or self._ws[1][2].shape[dim] < f.shape[dim]:
            self._ws = key, (f.new_empty((k, *f.shape)), f.new_zeros((k, *f.shape)), f.new_empty(f.shape))
        P, G, d = self._ws[1]
        n = f.shape[dim]
        return P.narrow(dim + 1, 0, n), G.narrow(dim + 1, 0, n), d.narrow(dim, 0, n)

    def _block(self, f: torch.Tensor, w: float, out: torch.Tensor, dim: int) -> None:
        """Chambolle's iterations on one block (b, c, H, W); writes f − w·div p to out."""
        s = self.spectral_weight
        tau = 1.0 / (4.0 + 2.0 * s * s)
        P, G, d = self._workspace(f, dim)                         # P holds q = τ·p; d also holds |τg|²
        axes = (-2, -1, 1)[: P.shape[0]]                           # ∂_h, ∂_w (, ∂_c)
        dz = [_pair(d, a) for a in axes]                           # views made once per block
        g = [G[i].narrow(a, 0, f.shape[a] - 1) for i, a in enumerate(axes)]
        div = _Div(P, d, axes, s)
        for it in range(self.iters):
            if it == 0:
                torch.mul(f, -tau / w, out=d)                     # τz = τ(div p − f/w), p = 0
            else:
                div().add_(f, alpha=-tau / w)
            for (hi, lo), gi in zip(dz, g):                       # τg = ∇(τz), far edges stay 0
                torch.sub(hi, lo, out=gi)
            if s:
                G[2].mul_(s)
            n = torch.mul(G[0], G[0], out=d)
            for gi in G[1:]:
                n.addcmul_(gi, gi)
            den = n.sqrt_().add_(1.0)
            if it == 0:
                torch.div(G, den, out=P).mul_(tau)                # q ← (q + τ·τg) / (1 + τ|g|), q = 0
            else:
                P.add_(G, alpha=tau).div_(den)
        torch.add(f, div(), alpha=-w / tau, out=out)


def _pair(t: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t[1:], t[:-1]) along ``axis``."""
    m = t.shape[axis] - 1
    return t.narrow(axis, 1, m), t.narrow(axis, 0, m)


class _Div:
    """d = div p = −∇ᵀp (backward differences, p[−1] = 0: the exact adjoint of ∇); views made once."""

    def __init__(self, P: torch.Tensor, d: torch.Tensor, axes: tuple[int, ...], s: float):
        self.d = d
        self.row0 = (d.narrow(-2, 0, 1), P[0].narrow(-2, 0, 1))          # d[0] = p_h[0]
        self.rows = (*_pair(P[0], -2), _pair(d, -2)[0])                   # d[i] = p_h[i] − p_h[i−1]
        self.rest = [(P[i], _pair(d, a)[0], _pair(P[i], a)[1], s if a == 1 else 1.0)
                     for i, a in enumerate(axes) if i > 0]                # d += c·(p[j] − p[j−1])

    def __call__(self) -> torch.Tensor:
        self.row0[0].copy_(self.row0[1])
        torch.sub(self.rows[0], self.rows[1], out=self.rows[2])
        for p, d_hi, p_lo, c in self.rest:
            self.d.add_(p, alpha=c)
            d_hi.sub_(p_lo, alpha=c)
        return self.d
