"""Total-variation prior: the TV value and a fast TV denoiser on (B, C, H, W).

    TV(u)  = Σ_{b,c,h,w} sqrt(|∂_h u|² + |∂_w u|² + s²|∂_c u|²)   (forward differences, 0 at the far edge)
    D_w(f) = argmin_u ½‖u − f‖² + w·TV(u)

s = 0 is 2-D isotropic TV of every band on its own; s > 0 adds the band-difference
term (spatial–spectral TV, bands coupled). The denoiser is Chambolle's (2004) semi-implicit
dual iteration, u = f − w·div p:

    g = ∇(div p − f/w);   p ← (p + τ g) / (1 + τ|g|),   τ = 1/(4 + 2s²)

started from p = 0 on every call (the ``TV_denoising`` of Yuan's GAP-TV code, with the exact
adjoint divergence). With s = 0 on the CPU (float32/float64, no autograd) and numba installed, one
numba kernel runs all iterations plane by plane (``cassi.physics.backends.numba.tv_denoise``: p and z of a
plane stay in cache; faster than the torch ops, measured: docs/benchmarks.md, "GAP-TV against a textbook
implementation"). Otherwise torch ops update all bands and samples at once; the only Python loop runs over
blocks of planes sized to stay in the CPU cache (with s = 0 the dual iterations of one plane never read another
plane).
"""
from __future__ import annotations

import math

import torch

from cassi._checks import check_number
from cassi.solvers.base import check_int

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
        impl: "auto" (the numba kernel where it applies, see above) or "torch" (always the torch ops).

    Call as ``den(f)`` or ``den(f, weight)``. A workspace for the last block shape is kept
    between calls (2K+1 blocks, K = 2 or 3 gradient components), so a loop allocates nothing.
    """

    def __init__(self, weight: float = 0.1, iters: int = 5, spectral_weight: float = 0.0, inplace: bool = False,
                 impl: str = "auto"):
        self.weight = check_number("weight", weight)
        self.iters = check_int("iters", iters)
        self.spectral_weight = check_number("spectral_weight", spectral_weight, positive=False)
        self.inplace = bool(inplace)
        if impl not in ("auto", "torch"):
            raise ValueError(f"impl must be 'auto' or 'torch', got {impl!r}")
        self.impl = impl
        self._ws: tuple | None = None

    def __repr__(self) -> str:
        return (f"TVDenoiser(weight={self.weight}, iters={self.iters}, "
                f"spectral_weight={self.spectral_weight}, inplace={self.inplace}, impl={self.impl!r})")

    def __call__(self, f: torch.Tensor, weight: float | None = None) -> torch.Tensor:
        w = self.weight if weight is None else check_number("weight", weight)
        if not isinstance(f, torch.Tensor) or f.ndim != 4 or not f.is_floating_point():
            raise ValueError(f"f must be a float cube (B, C, H, W), got {getattr(f, 'shape', type(f).__name__)}")
        f = f.contiguous()
        out = f if self.inplace else torch.empty_like(f)
        s = self.spectral_weight
        if self.impl == "auto" and s == 0 and f.device.type == "cpu":
            from cassi.physics.backends.numba import tv_denoise

            if tv_denoise(f, out, w, self.iters):
                return out
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

    def _workspace(self, f: torch.Tensor, dim: int) -> _Step:
        """The buffers and views of one Chambolle step for f's block shape (see ``_Step``),
        reallocated only for a larger block, another layout, dtype or device; the views are
        kept per block size (a call has one or two)."""
        k = 3 if self.spectral_weight else 2
        key = (k, dim, f.dtype, f.device, f.shape[:dim] + f.shape[dim + 1:])
        if self._ws is None or self._ws[0] != key or self._ws[1][2].shape[dim] < f.shape[dim]:
            self._ws = key, (f.new_empty((k, *f.shape)), f.new_zeros((k, *f.shape)), f.new_empty(f.shape)), {}
        (P, G, d), steps = self._ws[1:]
        n = f.shape[dim]
        if n not in steps:
            steps[n] = _Step(P.narrow(dim + 1, 0, n), G.narrow(dim + 1, 0, n), d.narrow(dim, 0, n),
                             self.spectral_weight)
        return steps[n]

    def _block(self, f: torch.Tensor, w: float, out: torch.Tensor, dim: int) -> None:
        """Chambolle's iterations on one block (b, c, H, W); writes f − w·div p to out."""
        s = self.spectral_weight
        tau = 1.0 / (4.0 + 2.0 * s * s)
        a = -tau / w
        st = self._workspace(f, dim)
        P, G, d = st.P, st.G, st.d                                 # P holds q = τ·p; d also holds |G|²
        for it in range(self.iters):
            # G = τg = ∇(τz), τz = τ(div p − f/w) = div q + a·f; at it = 0 (q = 0): G = ∇f, τg = a·G
            st.grad(f if it == 0 else st.div(f, a))
            n = torch.mul(st.G0, st.G0, out=d)
            for gi in st.G1:
                n.addcmul_(gi, gi)
            if it == 0:                                           # q = τ·aG / (1 + |aG|) = G / (1/(τa) − |G|/τ)
                den = torch.add(st.scalar(1.0 / (tau * a)), st.sqrt_(n), alpha=-1.0 / tau, out=n)
                torch.div(G, den, out=P)
            else:                                                 # q ← (q + τ·τg) / (1 + |τg|)
                P.add_(G, alpha=tau).div_(st.sqrt_(n).add_(st.one))
        st.div(f, 1.0, -w / tau, out)                             # f − w·div p = f − (w/τ)·div q


def _pair(t: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t[1:], t[:-1]) along ``axis``."""
    m = t.shape[axis] - 1
    return t.narrow(axis, 1, m), t.narrow(axis, 0, m)


class _Step:
    """Buffers P, G (K, b, c, H, W) and d (b, c, H, W) of one block and their views, made once.

    ``grad(x)``: G ← ∇x (forward differences along ∂_h, ∂_w (, s·∂_c), 0 at the far edges).
    ``div(f, a, c, out=d)``: out ← a·f + c·div p in 2K ops (a = 1 or c = 1), div p = −∇ᵀp
    (backward differences with p[−1] = 0: the exact adjoint of ∇, as p stays 0 at the far edges).
    ``sqrt_(n)``: n ← sqrt(n); on CPU as 1/n^(−1/2) (within 2 ulp of sqrt, 0 ↦ 0), as
    ``pow(−0.5)`` is a vectorised rsqrt there, faster than ``sqrt`` (measured: docs/benchmarks.md, "GAP-TV
    against a textbook implementation")."""

    def __init__(self, P: torch.Tensor, G: torch.Tensor, d: torch.Tensor, s: float):
        self.P, self.G, self.d, self.s = P, G, d, s
        self.G0, self.G1 = G[0], list(G[1:])
        self.axes = (-1, -2, 1)[: P.shape[0]]                      # ∂_w first: out = a·f + c·p_w
        self.k = [1, 0, 2][: P.shape[0]]
        self.g = [G[k].narrow(a, 0, d.shape[a] - 1) for k, a in zip(self.k, self.axes)]
        self.d_pairs = [_pair(d, a) for a in self.axes]
        self.terms = [(P[k], _pair(P[k], a)[1], s if a == 1 else 1.0) for k, a in zip(self.k, self.axes)]
        self.d_hi = [hi for hi, _ in self.d_pairs]
        self.one = d.new_ones(())
        self.cpu = d.device.type == "cpu"

    def scalar(self, v: float) -> torch.Tensor:
        return self.d.new_full((), v)

    def grad(self, x: torch.Tensor) -> None:
        pairs = self.d_pairs if x is self.d else [_pair(x, a) for a in self.axes]
        for (hi, lo), g in zip(pairs, self.g):
            torch.sub(hi, lo, out=g)
        if self.s:
            self.G[2].mul_(self.s)

    def div(self, f: torch.Tensor, a: float, c: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
        out, out_hi = (self.d, self.d_hi) if out is None else (out, [_pair(out, ax)[0] for ax in self.axes])
        for i, ((p, p_lo, ck), hi) in enumerate(zip(self.terms, out_hi)):   # out[j] += c·(p[j] − p[j−1])
            if i == 0 and c == 1:
                torch.add(p, f, alpha=a, out=out)
            elif i == 0:
                torch.add(f, p, alpha=c, out=out)
            else:
                out.add_(p, alpha=c * ck)
            hi.sub_(p_lo, alpha=c * ck)
        return out

    def sqrt_(self, n: torch.Tensor) -> torch.Tensor:
        return n.pow_(-0.5).reciprocal_() if self.cpu else n.sqrt_()
