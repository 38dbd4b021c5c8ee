"""Backend interface and output allocation.

A backend computes the two kernels of the shift-sum operator with the
dispersion along the **last** axis (the operator transposes for ``axis="h"``):

    forward:  y[b, 0, h, j] = Σ_c (1-f_c)·z_c[h, j-k_c] + f_c·z_c[h, j-k_c-1],  z = M ⊙ x
    adjoint:  x[b, c, h, w] = M_c[h, w]·((1-f_c)·y[h, w+k_c] + f_c·y[h, w+k_c+1])

with d_c = k_c + f_c (k_c integer, 0 ≤ f_c < 1) the offset of band c.
x is (B, C, H, W), the mask (Bm, Cm, H, W) with Bm ∈ {1, B}, Cm ∈ {1, C},
y is (B, 1, H, W + Δ), Δ = ceil(max d); the geometry is :class:`cassi.geometry.Geometry`.
"""
from __future__ import annotations

import ctypes
import sys

import torch

from cassi.geometry import Geometry


class UnsupportedGeometry(ValueError):
    """A backend cannot compute this geometry (e.g. fractional offsets)."""


class Backend:
    """One implementation of the forward and adjoint kernels.

    Subclasses implement ``_forward(x, mask, g)`` and ``_adjoint(y, mask, g)``
    returning fresh tensors, or override ``forward``/``adjoint`` to write into
    a caller-given ``out`` directly. ``check`` raises ``UnsupportedGeometry``.
    Optional hooks ``data_step`` and ``pinv`` fuse the solvers' hot spots; the
    defaults return None and the operator composes them from the two kernels.
    """

    name = "base"

    def check(self, g: Geometry, device: torch.device) -> None:
        """Raise UnsupportedGeometry if this backend cannot compute ``g`` on ``device``."""

    def forward(self, x, mask, g: Geometry, out=None):
        return _emit(self._forward(x, mask, g), out)

    def adjoint(self, y, mask, g: Geometry, out=None):
        return _emit(self._adjoint(y, mask, g), out)

    def data_step(self, z, y, w, mask, g: Geometry, out=None):
        """Fused data step, or None where this backend has none (the operator then composes it):
        (x, u) with u = y − A z (B, 1, H, W') and x = z + Aᵀ(w ⊙ u) (B, C, H, W), x written into
        ``out`` when given (which may be z itself); w broadcasts to y's shape (the operator passes
        w = 1/(Φ + ρ), 0 where Φ + ρ = 0)."""
        return None

    def pinv(self, y, w, mask, g: Geometry, out=None):
        """Fused Aᵀ(w ⊙ y) (B, 1, H, W') -> (B, C, H, W), or None where this backend has none."""
        return None

    def _forward(self, x, mask, g):  # pragma: no cover - interface
        raise NotImplementedError

    def _adjoint(self, y, mask, g):  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _emit(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    out.copy_(result)
    return out


def require_integer(g: Geometry, name: str) -> None:
    if not g.integer:
        raise UnsupportedGeometry(
            f"backend {name!r} supports integer offsets only, got fractional offsets "
            f"{[k + f for k, f in zip(g.shifts, g.fracs)]}; use 'strided', 'loop', 'conv' or 'fft'"
        )


# --------------------------------------------------------------------------- allocation
_HUGE = 2 << 20
_MADV_HUGEPAGE = 14
try:  # Linux/glibc only; elsewhere fresh outputs are plain torch.empty
    _libc = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None
    if _libc is not None:
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except OSError:  # pragma: no cover
    _libc = None


def empty(shape, like: torch.Tensor) -> torch.Tensor:
    """A fresh uninitialised tensor on ``like``'s device/dtype.

    Large CPU buffers are advised as transparent huge pages before first touch:
    a fresh 100 MB output otherwise spends most of its time in 4 KiB page faults.
    """
    t = torch.empty(shape, dtype=like.dtype, device=like.device)
    nbytes = t.numel() * t.element_size()
    if _libc is not None and t.device.type == "cpu" and nbytes >= 4 * _HUGE:
        start = -(-t.data_ptr() // _HUGE) * _HUGE
        end = (t.data_ptr() + nbytes) // _HUGE * _HUGE
        if end > start:
            _libc.madvise(start, end - start, _MADV_HUGEPAGE)  # advisory: failure is harmless
    return t

