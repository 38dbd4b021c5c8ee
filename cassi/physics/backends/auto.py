"""``auto``: check the candidate backends against ``loop``, time the ones that agree, keep the fastest."""
from __future__ import annotations

import logging
import time

import torch

from cassi import threads
from cassi.geometry import Geometry
from cassi.physics.backends.base import Backend, UnsupportedGeometry

log = logging.getLogger("cassi")

#: Tried in this order; ``compiled`` (compile time) and ``conv``/``fft`` (far slower; measured:
#: docs/benchmarks.md, "`strided`, `loop` and `auto`") are left out by default. Pass
#: ``candidates=`` to change.
DEFAULT_CANDIDATES = ("numba", "triton", "strided", "scatter", "fold", "loop")


class AutoBackend(Backend):
    """Chooses among ``candidates`` on the first call for each (device, dtype, x shape, mask shape,
    geometry, layout): first every candidate that supports the case is **checked** on a small problem
    of the same geometry, dtype, device, layout and mask kind (``verify``): A, Aᵀ and the data step (fresh,
    into ``out=`` buffers, the step also in place) and pinv must equal the ``loop`` reference (computed in float64
    on CPU) and satisfy ⟨A x, y⟩ = ⟨x, Aᵀ y⟩; a candidate that raises or differs is dropped and
    logged with the reason (``rejected``). The others are timed (forward + adjoint) and the fastest
    is kept. Choices are cached per process, readable with ``choice(...)``."""

    name = "auto"
    _cache: dict = {}  # shared by all instances with the same candidates
    rejected: dict = {}  # key -> {candidate name: why it was dropped}

    def __init__(self, candidates=DEFAULT_CANDIDATES, repeats: int = 3):
        from cassi.physics.backends import get_backend

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
            self._cache[key] = self._fastest(x, mask, g, key)
        return self._cache[key]

    def _fastest(self, x, mask, g, key=None):
        """Time forward+adjoint into preallocated outputs: the kernels' speed, not the allocator's
        (first touches of fresh memory vary by orders of magnitude with the OS/VM state). The candidates take
        turns, ``repeats`` rounds after a warm-up round, and each one's best round counts: a process that
        wakes up beside the timing slows one round of one candidate, not a candidate's every run (the choice
        must hold when the machine is busy before or after it is made)."""
        sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
        y = torch.zeros(x.shape[0], 1, *x.shape[2:-1], g.out_width, dtype=x.dtype, device=x.device)
        xo = torch.zeros_like(x)
        dropped = self.rejected.setdefault(key, {})
        timed = {}
        for cand in self._supported(g, x.device):
            why = verify(cand, x, mask, g)
            if why is not None:
                dropped[cand.name] = why
                level = logging.INFO if why.startswith("unsupported") else logging.WARNING
                log.log(level, "cassi auto backend: dropped %s for x %s %s on %s: %s",
                        cand.name, tuple(x.shape), x.dtype, x.device, why)
                continue
            timed[cand] = []
        threads.adapt()  # timed with the threads the work will run with
        for _ in range(self.repeats + 1):  # the first round warms up
            for cand in list(timed):
                try:
                    sync()
                    t0 = time.perf_counter()
                    cand.adjoint(cand.forward(x, mask, g, out=y), mask, g, out=xo)
                    sync()
                    timed[cand].append(time.perf_counter() - t0)
                except Exception as e:  # noqa: BLE001 - e.g. out of memory at the full size
                    dropped[cand.name] = f"raised {type(e).__name__} while timed: {e}"
                    log.warning("cassi auto backend: dropped %s: %s", cand.name, dropped[cand.name])
                    del timed[cand]
        best = min(timed, key=lambda c: min(timed[c][1:] or timed[c]), default=None)
        if best is None:
            raise UnsupportedGeometry(f"no candidate of {[c.name for c in self.candidates]} ran on {x.device}"
                                      + "".join(f"; {n}: {w}" for n, w in dropped.items()))
        for cand, times in timed.items():
            log.debug("auto: %s %.3f ms", cand.name, 1e3 * min(times[1:] or times))
        log.info("cassi auto backend: %s for x %s on %s", best.name, tuple(x.shape), x.device)
        return best

    def forward(self, x, mask, g, out=None):
        return self.choice(x, mask, g).forward(x, mask, g, out)

    def adjoint(self, y, mask, g, out=None):
        return self.choice(y, mask, g, adjoint=True).adjoint(y, mask, g, out)

    def data_step(self, z, y, w, mask, g, out=None):
        return self.choice(z, mask, g).data_step(z, y, w, mask, g, out)

    def pinv(self, y, w, mask, g, out=None):
        return self.choice(y, mask, g, adjoint=True).pinv(y, w, mask, g, out)

    def __repr__(self):
        return f"AutoBackend(candidates={[c.name for c in self.candidates]})"


def tolerance(dtype: torch.dtype, bands: int) -> float:
    """Relative tolerance of a backend against the float64 reference: rounding of sums over the bands."""
    return min(0.05, 16 * torch.finfo(dtype).eps * (bands + 2))


def verify(cand: Backend, x: torch.Tensor, mask: torch.Tensor, g: Geometry, rows: int = 3,
           seed: int = 0) -> str | None:
    """None when ``cand`` computes this case correctly on a small problem, else the reason.

    The small problem keeps what a kernel may depend on: the offsets, dtype, device, memory layout
    (axis "h" arrives as a transposed view), the mask kind (per batch, per band) and a batch of up to
    2, with ``rows`` rows and a width of min(W, 2Δ + 5). A, Aᵀ and the data step z + Aᵀ(w ⊙ (y − A z))
    (fresh, into NaN-filled ``out=`` buffers, and the step in place, out = z) and pinv are compared with
    ``loop`` in float64 on CPU (``tolerance``, relative to the largest value), and ⟨A x, y⟩ with ⟨x, Aᵀ y⟩.
    """
    from cassi.physics.backends.loop import LoopBackend

    B, C = min(x.shape[0], 2), g.bands
    W = min(g.width, 2 * g.delta + 5)
    gs = g.with_width(W)
    transposed = x.stride(-1) != 1
    gen = torch.Generator().manual_seed(seed)

    def make(*shape, lo=0.0, zeros=0.0):  # random values in the case's dtype, device and layout
        t = lo + torch.rand(*shape[:-2], shape[-1], shape[-2], generator=gen, dtype=torch.float64)
        if zeros:
            t = t * (torch.rand(t.shape, generator=gen, dtype=torch.float64) >= zeros)
        t = t.to(x.device, x.dtype)
        return t.transpose(-1, -2) if transposed else t.transpose(-1, -2).contiguous()

    m = make(min(mask.shape[0], B), mask.shape[1], rows, W, lo=0.5, zeros=0.35)
    xs, ys = make(B, C, rows, W), make(B, 1, rows, W + g.delta)
    ws = make(1, 1, rows, W + g.delta, lo=0.5)
    ref = LoopBackend()
    m64, x64, y64, w64 = (t.detach().cpu().double() for t in (m, xs, ys, ws))
    expect = {"A": ref.forward(x64, m64, gs), "At": ref.adjoint(y64, m64, gs), "pinv": ref.adjoint(y64 * w64, m64, gs)}
    u64 = y64 - expect["A"]
    expect["step"] = x64 + ref.adjoint(u64 * w64, m64, gs)
    tol = tolerance(x.dtype, C)
    try:
        got = {"A": cand.forward(xs, m, gs), "At": cand.adjoint(ys, m, gs), "pinv": cand.pinv(ys, ws, m, gs)}
        step = cand.data_step(xs, ys, ws, m, gs)
        got["step"] = None if step is None else step[0]
        yo, xo = torch.full_like(ys, float("nan")), torch.full_like(xs, float("nan"))
        cand.forward(xs, m, gs, out=yo)
        cand.adjoint(ys, m, gs, out=xo)
        got["A out="], got["At out="] = yo, xo  # the buffers must hold the results
        expect["A out="], expect["At out="] = expect["A"], expect["At"]
        if step is not None:
            so, zs = torch.full_like(xs, float("nan")), xs.clone()
            cand.data_step(xs, ys, ws, m, gs, out=so)
            cand.data_step(zs, ys, ws, m, gs, out=zs)
            got["step out="], got["step in place"] = so, zs
            expect["step out="] = expect["step in place"] = expect["step"]
    except UnsupportedGeometry as e:
        return f"unsupported: {e}"
    except Exception as e:  # noqa: BLE001 - any failure disqualifies the candidate
        return f"raised {type(e).__name__}: {e}"
    for name, t in got.items():
        if t is None:  # no fused kernel: the operator composes it from A and Aᵀ
            continue
        want = expect[name]
        if tuple(t.shape) != tuple(want.shape):
            return f"{name} has shape {tuple(t.shape)}, expected {tuple(want.shape)}"
        err = float((t.detach().cpu().double() - want).abs().max())
        scale = float(want.abs().max()) or 1.0
        if not err <= tol * scale:  # NaN fails too
            return f"{name} differs from loop by {err:.3g} (tolerance {tol * scale:.3g})"
    lhs = float((got["A"].double() * ys.double()).sum())
    rhs = float((xs.double() * got["At"].double()).sum())
    if not abs(lhs - rhs) <= tol * abs(lhs):
        return f"adjoint identity fails: <A x, y> = {lhs:.6g}, <x, At y> = {rhs:.6g}"
    return None
