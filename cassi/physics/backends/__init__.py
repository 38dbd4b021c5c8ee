"""Backends of the shift-sum operator, by name.

Every backend computes the same operator (see ``base``); they differ only in
speed and in which geometries/devices they support. ``auto`` times the
candidates once per (device, dtype, shapes, geometry) and keeps the fastest.
"""
from cassi.geometry import Geometry
from cassi.physics.backends.auto import AutoBackend
from cassi.physics.backends.base import Backend, UnsupportedGeometry
from cassi.physics.backends.compiled import CompiledBackend
from cassi.physics.backends.conv import ConvBackend
from cassi.physics.backends.fft import FFTBackend
from cassi.physics.backends.fold import FoldBackend
from cassi.physics.backends.loop import LoopBackend
from cassi.physics.backends.numba import NumbaBackend
from cassi.physics.backends.scatter import ScatterBackend
from cassi.physics.backends.strided import StridedBackend
from cassi.physics.backends.triton import TritonBackend

BACKENDS: dict[str, type[Backend]] = {
    b.name: b
    for b in (LoopBackend, ConvBackend, ScatterBackend, FoldBackend, StridedBackend,
              FFTBackend, CompiledBackend, TritonBackend, NumbaBackend, AutoBackend)
}


def get_backend(backend: str | Backend) -> Backend:
    """A backend instance from its name (see ``BACKENDS``) or an instance."""
    if isinstance(backend, Backend):
        return backend
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)} or a Backend instance, got {backend!r}")
    return BACKENDS[backend]()


__all__ = ["BACKENDS", "Backend", "Geometry", "UnsupportedGeometry", "get_backend", *[c.__name__ for c in BACKENDS.values()]]
