"""The CASSI shift-sum operator A, its adjoint, Φ = diag(A Aᵀ) and the masked pseudo-inverse.

    A x  = Σ_c shift_{d_c}(M_c ⊙ x_c)            (B, C, H, W) -> (B, 1, H, W+Δ)
    Aᵀ y = M_c ⊙ shift_{-d_c}(y), every c         (B, 1, H, W+Δ) -> (B, C, H, W)
    Φ    = A Aᵀ 1 = Σ_c shift_{d_c}(M_c²)          (1 or B, 1, H, W+Δ)
    A⁺ y = Aᵀ (y ⊘ Φ), 0 where Φ = 0

Fractional offsets d = k + f (0 < f < 1) use pixel-integration (linear)
interpolation: band c lands with weight 1-f on column j+k and f on j+k+1,
which is what a detector pixel integrating a sub-pixel-shifted pixel sees.
The adjoint is the exact transpose of that. A Aᵀ is then no longer diagonal;
Φ is still A Aᵀ 1, the row sums of A Aᵀ (equal to its diagonal for integer
offsets). Because A Aᵀ has non-negative entries, diag(Φ) ⪰ A Aᵀ, so
``pinv`` is the diagonal (Jacobi) approximation of the pseudo-inverse and
``data_step`` a majorised, always-stable step; both are exact for integer offsets.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from cassi.geometry import Geometry
from cassi.physics.backends import Backend, get_backend
from cassi.physics.backends.loop import LoopBackend


def _as_tensor(mask) -> torch.Tensor:
    """A detached float tensor: numpy arrays (scipy.io.loadmat gives float64) and integer or
    bool masks take torch's default dtype (float32); float tensors keep theirs."""
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(np.ascontiguousarray(mask)).to(torch.get_default_dtype())
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or numpy array, got {type(mask).__name__}")
    if not mask.is_floating_point():
        mask = mask.to(torch.get_default_dtype())
    return mask.detach()


class _Apply(torch.autograd.Function):
    """y = A t (or Aᵀ t); the backward of a linear map is its transpose."""

    @staticmethod
    def forward(ctx, t, op, adjoint):
        ctx.op, ctx.adjoint = op, adjoint
        return op._run(t, adjoint, None)

    @staticmethod
    def backward(ctx, grad):
        return _Apply.apply(grad, ctx.op, not ctx.adjoint), None, None


class _DataStep(torch.autograd.Function):
    """x = z + Aᵀ(w ⊙ (y − A z)) through the backend's fused step. Its backward is the same step
    on the gradient: with y = 0 it gives x' = g − Aᵀ(w ⊙ A g) = ∂L/∂z and u' = −A g, hence
    ∂L/∂y = w ⊙ A g and ∂L/∂w = (A g) ⊙ (y − A z)."""

    @staticmethod
    def forward(ctx, z, y, w, op):
        x, u = op._step(z, y, w)
        ctx.op = op
        ctx.save_for_backward(z, y, w, u)
        return x

    @staticmethod
    def backward(ctx, g):
        op, (z, y, w, u) = ctx.op, ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiable maps, u recomputed from z and y
            ag = op(g)
            gz, u = g - op.adjoint(ag * w), y - op(z)
        else:
            gz, ag = op._step(g, torch.zeros_like(y), w)
            ag = ag.neg_()
        gy = ag * w if ctx.needs_input_grad[1] else None
        gw = (ag * u).sum_to_size(w.shape) if ctx.needs_input_grad[2] else None
        return gz, gy, gw, None


class CASSI(nn.Module):
    """Single-disperser CASSI forward model with swappable backends.

    Args:
        mask: coded aperture, (H, W) [needs ``bands`` or ``offsets``], (C, H, W) per
            band, or (B, C, H, W) / (B, 1, H, W) one per sample (an ``expand``-ed view of one
            mask is stored once and broadcasts over any batch). A float tensor sets the
            operator's dtype; a numpy array or integer/bool tensor gives float32 (the default dtype).
        bands: number of spectral bands C (implied by a 3-D/4-D mask or ``offsets``).
        step: dispersion in pixels per band, d_c = c·step (default 2, the TSA/MST geometry);
            fractional steps are allowed.
        offsets: per-band dispersion d_c in pixels (any order, fractional allowed),
            normalised so that min(d) = 0. Exclusive with ``step``.
        axis: "w" (dispersion along width, default) or "h" (along height).
        backend: a name from ``cassi.physics.backends.BACKENDS`` or a ``Backend`` instance.
        geometry: a :class:`cassi.geometry.Geometry` instead of ``step``/``offsets``/``axis`` (e.g. a camera's).

    Shapes: x (B, C, H, W); y (B, 1, H, W+Δ) for axis "w", (B, 1, H+Δ, W) for "h",
    Δ = ceil(max d) (``op.geometry``: offsets, axis, Δ). ``op(x)`` = A x, ``op.adjoint(y)`` = Aᵀ y, ``op.pinv(y)`` = Aᵀ(y ⊘ Φ).
    All maps return fresh tensors or write into ``out=``; they are differentiable.
    """

    def __init__(self, mask, bands: int | None = None, step: float | None = None,
                 offsets: Sequence[float] | None = None, axis: str | None = None,
                 backend: str | Backend = "auto", geometry: Geometry | None = None):
        super().__init__()
        m = _as_tensor(mask)
        if bands is not None and (isinstance(bands, bool) or not isinstance(bands, int) or bands < 1):
            raise ValueError(f"bands must be a positive integer, got {bands!r}")
        if m.ndim == 2:
            m, mask_bands = m[None, None], None
        elif m.ndim == 3:
            m, mask_bands = m[None], m.shape[0]
        elif m.ndim == 4:
            mask_bands = m.shape[1] if m.shape[1] > 1 else None
            if m.shape[0] > 1 and m.stride(0) == 0:  # one mask expanded over a batch: keep one copy
                m = m[:1]
        else:
            raise ValueError(f"mask must be (H, W), (C, H, W) or (B, C, H, W), got shape {tuple(m.shape)}")
        if mask_bands is not None and bands is not None and bands != mask_bands:
            raise ValueError(f"bands={bands} does not match the mask's {mask_bands} bands (shape {tuple(m.shape)})")
        if m.numel() == 0:
            raise ValueError(f"mask is empty, shape {tuple(m.shape)}")
        if not torch.isfinite(m).all():
            raise ValueError("mask contains NaN or Inf values")
        if not m.any():
            raise ValueError(f"mask is all zeros (shape {tuple(m.shape)}): nothing reaches the detector")
        geometry = self._geometry(geometry, bands if mask_bands is None else mask_bands, step, offsets, axis,
                                  mask_bands)
        self.geometry = geometry.with_width(geometry.along(m.shape))
        self.backend = get_backend(backend)
        self.backend.check(self.geometry, None)
        self._checked: set = set()
        self.register_buffer("mask", m.contiguous())
        ref = LoopBackend()  # Φ = A(Aᵀ 1) = A_M(M) once, in float64
        m64 = self._t(m.double())
        phi = ref.forward(m64.expand(-1, self.bands, -1, -1), m64, self.geometry)
        self.register_buffer("phi", self._t(phi).to(m.dtype).contiguous())
        self.register_buffer("phi_inv", torch.where(self.phi > 0, 1 / self.phi, torch.zeros_like(self.phi)))

    @staticmethod
    def _geometry(geometry, bands, step, offsets, axis, mask_bands) -> Geometry:
        """The dispersion: ``geometry`` as given, or one of ``step`` (default 2) / ``offsets`` along ``axis``."""
        if geometry is not None:
            if step is not None or offsets is not None or axis not in (None, geometry.axis):
                raise ValueError("geometry= replaces step=, offsets= and axis=: give none of them with it")
            if bands is not None and bands != geometry.bands:
                raise ValueError(f"the geometry has {geometry.bands} bands but the mask or bands= has {bands}")
            return geometry
        if offsets is not None and mask_bands is not None and len(offsets) != mask_bands:
            raise ValueError(f"offsets has length {len(offsets)} but the mask has {mask_bands}")
        if offsets is None and bands is None:
            raise ValueError("a 2-D mask (H, W) needs bands= (or offsets=) to know the number of bands")
        return Geometry.of(bands, 2.0 if step is None and offsets is None else step, offsets, axis or "w")

    # ------------------------------------------------------------------ shapes
    @property
    def offsets(self) -> list[float]:
        """d_c in px, min d = 0 (the geometry's)."""
        return list(self.geometry.offsets)

    @property
    def bands(self) -> int:
        """C."""
        return self.geometry.bands

    @property
    def axis(self) -> str:
        """"w" or "h": the dispersion axis."""
        return self.geometry.axis

    @property
    def delta(self) -> int:
        """Δ = ceil(max d): how much longer y is than x along the axis (the geometry's)."""
        return self.geometry.delta

    @property
    def x_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of a cube."""
        return (self.bands, *self.mask.shape[-2:])

    @property
    def y_shape(self) -> tuple[int, int, int]:
        """(1, H, W+Δ) or (1, H+Δ, W) of a measurement."""
        return (1, *self.geometry.measurement_shape(self.mask.shape))

    def _t(self, t: torch.Tensor) -> torch.Tensor:
        """View with the dispersed axis last."""
        return t.transpose(-1, -2) if self.axis == "h" else t

    def _check(self, t: torch.Tensor, name: str, shape: tuple[int, ...], out: torch.Tensor | None):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        what = "a cube (B, C, H, W)" if shape == self.x_shape else "a measurement (B, 1, H', W')"
        if t.ndim != 4 or tuple(t.shape[1:]) != shape:
            raise ValueError(f"{name} must be {what} with (C, H, W)={shape}, got shape {tuple(t.shape)}")
        if t.dtype != self.mask.dtype or t.device != self.mask.device:
            raise TypeError(
                f"{name} has dtype {t.dtype} on {t.device} but the operator has {self.mask.dtype} on "
                f"{self.mask.device}; use op.to({name}.device, {name}.dtype) or convert {name}"
            )
        if self.mask.shape[0] not in (1, t.shape[0]):
            raise ValueError(f"{name} has batch {t.shape[0]} but the operator has a batch of {self.mask.shape[0]} masks")
        if out is not None:
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
            if out.dtype != t.dtype or out.device != t.device:
                raise TypeError(f"out has dtype {out.dtype} on {out.device}, expected {t.dtype} on {t.device}")
            if torch.is_grad_enabled() and (t.requires_grad or out.requires_grad):
                raise RuntimeError("out= is not differentiable; call without out= when gradients are needed")
        key = (t.device, t.dtype)
        if key not in self._checked:
            self.backend.check(self.geometry, t.device)
            self._checked.add(key)

    def _run(self, t, adjoint: bool, out):
        m = self._t(self.mask)
        o = None if out is None else self._t(out)
        if adjoint:
            r = self.backend.adjoint(self._t(t), m, self.geometry, o)
        else:
            r = self.backend.forward(self._t(t), m, self.geometry, o)
        return out if out is not None else self._t(r)

    @staticmethod
    def _check_out(t, out, shape_out):
        want = (t.shape[0], *shape_out)
        if tuple(out.shape) != want:
            raise ValueError(f"out must have shape {want}, got {tuple(out.shape)}")

    def _map(self, t, adjoint: bool, out, name: str, shape_in, shape_out):
        self._check(t, name, shape_in, out)
        if out is not None:
            self._check_out(t, out, shape_out)
            return self._run(t, adjoint, out)
        if torch.is_grad_enabled() and t.requires_grad:
            return _Apply.apply(t, self, adjoint)
        return self._run(t, adjoint, None)

    # ------------------------------------------------------------------ maps
    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """A x: (B, C, H, W) -> (B, 1, H, W+Δ)."""
        return self._map(x, False, out, "x", self.x_shape, self.y_shape)

    def adjoint(self, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Aᵀ y: (B, 1, H, W+Δ) -> (B, C, H, W)."""
        return self._map(y, True, out, "y", self.y_shape, self.x_shape)

    def pinv(self, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """A⁺ y = Aᵀ(y ⊘ Φ), 0 where Φ = 0: (B, 1, H, W+Δ) -> (B, C, H, W)."""
        self._check(y, "y", self.y_shape, out)
        if not (torch.is_grad_enabled() and y.requires_grad):  # a fused kernel where the backend has one
            if out is not None:
                self._check_out(y, out, self.x_shape)
            x = self.backend.pinv(self._t(y), self._t(self.phi_inv), self._t(self.mask), self.geometry,
                                  None if out is None else self._t(out))
            if x is not None:
                return out if out is not None else self._t(x)
        return self.adjoint(y * self.phi_inv, out=out)

    def _weights(self, rho) -> torch.Tensor:
        """w = 1/(Φ + ρ), 0 where Φ + ρ = 0 (differentiable in ρ): (1 or B, 1, H, W+Δ)."""
        if not isinstance(rho, torch.Tensor) and rho == 0:
            return self.phi_inv
        t = self.phi + rho
        pos = t > 0
        return torch.where(pos, 1 / torch.where(pos, t, 1.0), 0.0).to(self.phi.dtype)

    def _step(self, z, y, w, out=None):
        """(z + Aᵀ(w ⊙ u), u = y − A z): the backend's fused step, or composed from A and Aᵀ."""
        r = self.backend.data_step(self._t(z), self._t(y), self._t(w), self._t(self.mask), self.geometry,
                                   None if out is None else self._t(out))
        if r is not None:
            return (out if out is not None else self._t(r[0])), self._t(r[1])
        u = y - self._run(z, False, None)
        return torch.add(z, self._run(u * w, True, None), out=out), u

    def data_step(self, z: torch.Tensor, y: torch.Tensor, rho: float | torch.Tensor = 0.0,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """argmin_x ½‖Ax − y‖² + ρ/2‖x − z‖² = z + Aᵀ((y − A z) ⊘ (Φ + ρ)), 0-weighted where Φ + ρ = 0.

        ρ = 0 is the GAP projection onto {A x = y}. ρ may be a tensor that broadcasts against
        (B, 1, 1, 1) (per-sample, learned; autograd flows into it). Exact for integer offsets; a
        majorised step for fractional ones. Backends with a fused step (``numba``, ``strided``,
        ``triton``) compute it in one call, without the composed path's temporaries. ``out`` (not
        differentiable) receives x and may be z itself. (B, C, H, W), (B, 1, H, W+Δ) -> (B, C, H, W).
        """
        self._check(z, "z", self.x_shape, out)
        self._check(y, "y", self.y_shape, out)
        if y.shape[0] != z.shape[0]:
            raise ValueError(f"z has batch {z.shape[0]} but y has batch {y.shape[0]}")
        w = self._weights(rho)
        if out is not None:
            self._check_out(z, out, self.x_shape)
            if w.requires_grad and torch.is_grad_enabled():
                raise RuntimeError("out= is not differentiable; call without out= when gradients are needed")
        fused = type(self.backend).data_step is not Backend.data_step
        if fused and torch.broadcast_shapes(w.shape, y.shape) == y.shape:
            if torch.is_grad_enabled() and (z.requires_grad or y.requires_grad or w.requires_grad):
                return _DataStep.apply(z, y, w, self)
            return self._step(z, y, w, out)[0]
        r = self.adjoint((y - self.forward(z)) * w)
        return torch.add(z, r, out=out)

    def norm(self) -> float:
        """‖A‖₂ (largest singular value). Exact for integer offsets: sqrt(max Φ);
        for fractional offsets sqrt(max Φ) is an upper bound (Φ ⪰ A Aᵀ)."""
        return float(self.phi.max().sqrt())

    def extra_repr(self) -> str:
        offs = self.offsets if len(self.offsets) <= 6 else f"[{self.offsets[0]}, {self.offsets[1]}, ..., {self.offsets[-1]}]"
        return (f"bands={self.bands}, mask={tuple(self.mask.shape)}, offsets={offs}, axis={self.axis!r}, "
                f"backend={self.backend!r}")
