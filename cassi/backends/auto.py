"""``auto``: time the candidate backends once per case and keep the fastest."""
from __future__ import annotations

import logging
import time

import torch

from cassi.backends.base import Backend, UnsupportedGeometry

log = logging.getLogger("cassi")

#: Tried in this order; ``compiled`` (compile time) and ``conv``/``fft`` (measured
#: 10-80x slower) are left out by default. Pass ``candidates=`` to change.
DEFAULT_CANDIDATES = ("triton", "strided", "scatter", "fold", "loop")


class AutoBackend(Backend):
    """Chooses among ``candidates`` by timing forward+adjoint on the first call
    for each (device, dtype, x shape, mask shape, geometry); the choice is cached
    per process and readable with ``choice(...)``/``choices``."""

    name = "auto"
    _cache: dict = {}  # shared by all instances with the same candidates

    def __init__(self, candidates=DEFAULT_CANDIDATES, repeats: int = 3):
        from cassi.backends import get_backend

        self.candidates = tuple(get_backend(c) for c in candidates)
        if not self.candidates or any(isinstance(c, AutoBackend) for c in self.candidates):
            raise ValueError(f"candidates must name concrete backends, got {candidates!r}")
        self.repeats = repeats

    def check(self, g, device=None):
        if not self._supported(g, device):
            raise UnsupportedGeometry(f"no candidate of {[c.name for c in self.candidates]} supports this geometry")

    def _supported(self, g, device):
        ok = []
        for c in self.candidates:
            try:
                c.check(g, device)
                ok.append(c)
            except UnsupportedGeometry:
                pass
        return ok

    def choice(self, t: torch.Tensor, mask: torch.Tensor, g, adjoint: bool = False) -> Backend:
        """The backend used for input ``t`` (x, or y when ``adjoint``); times the candidates on first use."""
        B = t.shape[0]
        transposed = t.stride(-1) != 1  # axis "h" arrives as a transposed view: time that layout
        key = (tuple(c.name for c in self.candidates), t.device, t.dtype, B, tuple(mask.shape), g, transposed)
        if key not in self._cache:
            x = torch.rand(B, g.bands, g.width, t.shape[2], device=t.device, dtype=t.dtype)
            x = x.transpose(-1, -2) if transposed else x.transpose(-1, -2).contiguous()
            self._cache[key] = self._fastest(x, mask, g)
        return self._cache[key]

    def _fastest(self, x, mask, g):
        """Time forward+adjoint into preallocated outputs: the kernels' speed, not the allocator's
        (first touches of fresh memory vary by orders of magnitude with the OS/VM state)."""
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        y = torch.zeros(x.shape[0], 1, *x.shape[2:-1], g.out_width, dtype=x.dtype, device=x.device)
        xo = torch.zeros_like(x)
        best, best_t = None, float("inf")
        for cand in self._supported(g, x.device):
            times = []
            try:
                for _ in range(self.repeats + 1):  # the first run warms up
                    sync()
                    t0 = time.perf_counter()
                    cand.adjoint(cand.forward(x, mask, g, out=y), mask, g, out=xo)
                    sync()
                    times.append(time.perf_counter() - t0)
            except (RuntimeError, UnsupportedGeometry) as e:  # e.g. a missing compiler
                log.debug("auto: backend %s failed: %s", cand.name, e)
                continue
            t = sorted(times[1:])[len(times[1:]) // 2]
            log.debug("auto: %s %.3f ms", cand.name, 1e3 * t)
            if t < best_t:
                best, best_t = cand, t
        if best is None:
            raise UnsupportedGeometry(f"no candidate of {[c.name for c in self.candidates]} ran on {x.device}")
        log.info("cassi auto backend: %s for x %s on %s", best.name, tuple(x.shape), x.device)
        return best

    def forward(self, x, mask, g, out=None):
        return self.choice(x, mask, g).forward(x, mask, g, out)

    def adjoint(self, y, mask, g, out=None):
        return self.choice(y, mask, g, adjoint=True).adjoint(y, mask, g, out)

    def data_step(self, z, y, w, mask, g):
        return self.choice(z, mask, g).data_step(z, y, w, mask, g)

    def pinv(self, y, w, mask, g, out=None):
        return self.choice(y, mask, g, adjoint=True).pinv(y, w, mask, g, out)

    def __repr__(self):
        return f"AutoBackend(candidates={[c.name for c in self.candidates]})"
