"""``numba``: one-pass CPU kernels compiled at first use (numba JIT, no build step).

Parallel over (sample, block of rows): a task sums all C bands into its y rows while they stay in
cache (A: x read once, y written once), or spreads its y rows into a group of bands (Aᵀ: y from
cache, x written once); bands go a few at a time, so that a task streams a few x rows at once.
``pinv`` = Aᵀ(w ⊙ y) scales the y rows on the fly; the data step x = z + Aᵀ(w ⊙ (y − A z)) computes
u = y − A z for a block of rows and at once x for those rows (z's block is
read again from cache). Integer and fractional (two-tap) offsets, both dispersion axes (axis "h"
runs row kernels on the stored layout, no transposed copies), one mask or a batch of masks,
float32 and float64; other dtypes and non-CPU devices raise ``UnsupportedGeometry``, which ``auto``
takes as "not a candidate" (it falls back to another backend). With axis "h" the data step makes
two passes (u first, then x).

* Inputs are passed to numba as zero-copy ``.numpy()`` views (a copy only when a tensor is neither
  contiguous nor a transposed contiguous view); ``out=`` buffers are written directly when
  contiguous. Autograd is the operator's: A's backward is Aᵀ and the reverse.
* Threads: every call runs with ``torch.get_num_threads()`` threads (capped at numba's pool,
  ``NUMBA_NUM_THREADS``, default: the CPU count), so ``torch.set_num_threads`` / ``OMP_NUM_THREADS``
  set both; in a forked child each kernel's serial twin runs (compiled there, or loaded from the on-disk cache,
  on its first call). numba's threading
  layer is OpenMP where it can load (one thread pool with torch's, see ``_kernels``).
* Stores: Aᵀ, ``pinv`` and the data step write an x larger than the last-level cache with non-temporal stores
  (``_streams``), which skip reading x's lines before writing them; a cache-sized x (a solver's cube) is written
  through the cache, where its next step reads it.
* Compilation: a few seconds per dtype and layout on first use; ``cache=True`` keeps the machine
  code on disk (``cassi/physics/backends/__pycache__``, or ``NUMBA_CACHE_DIR``), so a later process loads
  it instead of compiling. ``import cassi`` does not import numba: the kernels are imported on the
  first call.
"""
from __future__ import annotations

import glob
import os
import threading
from functools import lru_cache

import torch

from cassi.physics.backends.base import Backend, UnsupportedGeometry, empty

DTYPES = (torch.float32, torch.float64)
_LOCK = threading.Lock()


_FORKED = False  # set in a child forked from this process: it runs the serial kernels only


def _forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_forked)


@lru_cache(maxsize=1)
def _kernels():
    """The compiled kernels (``_numba_kernels``), imported on first use. Unless NUMBA_THREADING_LAYER(_PRIORITY)
    is set, numba prefers its OpenMP layer: it then shares torch's OpenMP runtime and thread pool (with its own
    pool, torch's idle OpenMP workers spin on the cores that numba's workers need; measured: docs/benchmarks.md,
    "Threads"). GNU OpenMP cannot run a parallel region in a forked child (numba aborts it), so a forked child
    (a DataLoader worker) runs the ``_serial`` kernels."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    from cassi.physics.backends import _numba_kernels

    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts the layer, which sets the shared OpenMP runtime to numba's pool size:
    torch.set_num_threads(threads)  # give torch its setting back

    return _numba_kernels


def _run(name: str, *args) -> None:
    """Run kernel ``name`` with ``torch.get_num_threads()`` threads (capped at numba's pool); in a forked
    child, its ``_serial`` twin (no faster than the parallel kernel at one thread, so the parent runs the
    parallel kernel even then; measured: docs/benchmarks.md, "Threads"). Parallel
    calls are serialised (numba's workqueue layer, used where OpenMP and TBB are missing, must not be entered
    by two threads at once); serial ones take no lock (a child forked while another thread held it would wait
    on it forever)."""
    kernels = _kernels()
    if _FORKED:
        getattr(kernels, name + "_serial")(*args)
        return
    _parallel(getattr(kernels, name), *args)


def _parallel(kernel, *args) -> None:
    """Run a parallel numba kernel with ``torch.get_num_threads()`` threads (capped at numba's pool), under the
    lock (see ``_run``); never in a forked child."""
    import numba

    with _LOCK:
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        kernel(*args)


@lru_cache(maxsize=1)
def available() -> bool:
    """True when numba can be imported (tried once per process: the TV denoiser asks on every call)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _rows(t: torch.Tensor) -> bool:
    """True when ``t`` (dispersed axis last) is a transposed view of a contiguous tensor, i.e. the
    operator's axis "h": then the row kernels run on the stored layout."""
    return not t.is_contiguous() and t.transpose(-1, -2).is_contiguous()


def _np(t: torch.Tensor, rows: bool):
    """A numpy view (a copy only if needed) of ``t`` in the kernels' layout."""
    t = t.transpose(-1, -2) if rows else t
    return t.detach().contiguous().numpy()


def _dest(out: torch.Tensor | None, shape, like: torch.Tensor, rows: bool):
    """(tensor to write, numpy view of it in the kernel layout): ``out`` itself when its layout fits,
    else a fresh buffer (copied into ``out`` by ``_finish``). ``shape`` is in the dispersed-last view."""
    if out is not None:
        o = out.transpose(-1, -2) if rows else out
        if o.is_contiguous():
            return out, o.numpy()
    if rows:
        t = empty((*shape[:-2], shape[-1], shape[-2]), like)
        return t.transpose(-1, -2), t.numpy()
    t = empty(shape, like)
    return t, t.numpy()


def _finish(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None or result is out:
        return result
    return out.copy_(result)


def _rows_per_task(outer: int, H: int, cap: int) -> int:
    """R, the rows of a kernel task: as many as ``cap`` allows, yet about 4 tasks per thread over the
    ``outer`` × ⌈H/R⌉ tasks (outer: samples, or samples × band groups) where H allows."""
    threads = 1 if _FORKED else torch.get_num_threads()
    blocks = -(-4 * threads // max(1, outer))  # row blocks wanted per outer item
    return max(1, min(cap, -(-H // blocks)))


def _y_rows(g, t: torch.Tensor) -> int:
    """The most y rows (W+Δ wide) a task of A or Aᵀ takes: 512 KB of them, which stay in L2 while the task's
    bands stream past. Long blocks mean long x streams (a band's R rows are contiguous), which bring A nearer its
    floor (measured: docs/benchmarks.md, "Block sizes")."""
    return max(1, 2**19 // (g.out_width * t.element_size()))


@lru_cache(maxsize=1)
def _last_level_cache() -> int:
    """Bytes of the CPU's largest cache (Linux sysfs; 32 MiB where it cannot be read)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
            sizes.append(int(text.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1))
        except (OSError, ValueError):
            pass
    return max(sizes, default=32 * 2**20)


def _streams(t: torch.Tensor) -> bool:
    """Write x with non-temporal stores: only when it cannot stay in the last-level cache anyway (a solver's
    next step reads a cache-sized x back from cache; streamed, it would come from memory)."""
    return t.numel() * t.element_size() > _last_level_cache()


def _taps(g, dtype: torch.dtype):
    """(k, a, f) per band as numpy arrays: integer shift, weights 1 − f and f in the data's dtype."""
    import numpy as np

    nd = np.float32 if dtype == torch.float32 else np.float64
    k = np.asarray(g.shifts, dtype=np.int64)
    f = np.asarray(g.fracs, dtype=nd)
    return k, (1 - f).astype(nd), f


def _weights(w: torch.Tensor, y: torch.Tensor, rows: bool):
    """w broadcast to (Bw, H', W') of y's kernel layout, Bw ∈ {1, B}."""
    w = w.expand(w.shape[0], 1, *y.shape[-2:])
    return _np(w[:, 0], rows)


class NumbaBackend(Backend):
    """Fused one-pass CPU kernels (numba JIT) for A, Aᵀ, pinv and the data step."""

    name = "numba"

    def check(self, g, device=None):
        if device is not None and torch.device(device).type != "cpu":
            raise UnsupportedGeometry(f"backend 'numba' runs on CPU only, got device {device}; use 'auto'")
        if not available():
            raise UnsupportedGeometry("backend 'numba' needs the numba package: pip install numba")

    @staticmethod
    def _dtype(t: torch.Tensor) -> None:
        if t.dtype not in DTYPES:
            raise UnsupportedGeometry(
                f"backend 'numba' computes float32 and float64 only, got {t.dtype}; "
                "use backend='auto' (falls back to another backend) or 'strided'")
        if t.device.type != "cpu":
            raise UnsupportedGeometry(f"backend 'numba' runs on CPU only, got device {t.device}; use 'auto'")

    def forward(self, x, mask, g, out=None):
        """A x: (B, C, H, W) -> (B, 1, H, W+Δ), dispersed axis last (the operator's view)."""
        self._dtype(x)
        rows = _rows(x)
        B, _, H, _ = x.shape
        y, yn = _dest(out, (B, 1, H, g.out_width), x, rows)
        k, a, f = _taps(g, x.dtype)
        if rows:
            _run("fwd_h", _np(x, rows), _np(mask, rows), k, a, f, yn)
        else:  # a task's y rows stay in L2 while the bands are summed into them
            _run("fwd_w", _np(x, rows), _np(mask, rows), k, a, f, yn, _rows_per_task(B, H, _y_rows(g, x)))
        return _finish(y, out)

    def _adjoint(self, y, w, mask, g, out):
        """Aᵀ(w ⊙ y) (w None: Aᵀ y): (B, 1, H, W+Δ) -> (B, C, H, W)."""
        self._dtype(y)
        rows = _rows(y)
        B, _, H, _ = y.shape
        x, xn = _dest(out, (B, g.bands, H, g.width), y, rows)
        k, a, f = _taps(g, y.dtype)
        yn = _np(y if w is None else y * w, rows)  # w ⊙ y once (y-sized), not once per band group
        if rows:
            _run("adj_h", yn, _np(mask, rows), k, a, f, xn, xn, False)
        else:
            groups = -(-g.bands // _kernels()._CB)
            # a task's y rows (R × (W+Δ)) are read once per band group: kept in L2
            _run("adj_w", yn, _np(mask, rows), k, a, f, xn, xn, False, _rows_per_task(B * groups, H, _y_rows(g, y)),
                 _streams(x))
        return _finish(x, out)

    def adjoint(self, y, mask, g, out=None):
        """Aᵀ y: (B, 1, H, W+Δ) -> (B, C, H, W)."""
        return self._adjoint(y, None, mask, g, out)

    def pinv(self, y, w, mask, g, out=None):
        """Aᵀ(w ⊙ y), w = 1/Φ (0 where Φ = 0): (B, 1, H, W+Δ) -> (B, C, H, W)."""
        return self._adjoint(y, w, mask, g, out)

    def data_step(self, z, y, w, mask, g, out=None):
        """(x, u): u = y − A z (B, 1, H, W+Δ), x = z + Aᵀ(w ⊙ u) (B, C, H, W), into ``out`` if given."""
        self._dtype(z)
        rows = _rows(z)
        B, _, H, _ = z.shape
        x, xn = _dest(out, z.shape, z, rows)
        u, un = _dest(None, (B, 1, H, g.out_width), z, rows)
        k, a, f = _taps(g, z.dtype)
        zn, yn, mn, wn = _np(z, rows), _np(y, rows), _np(mask, rows), _weights(w, y, rows)
        if rows:
            rn = un.copy()  # r = w ⊙ u, y-sized scratch
            _run("residual_h", zn, yn, wn, mn, k, a, f, un, rn)
            _run("adj_h", rn, mn, k, a, f, xn, zn, True)
        else:
            # a task's block of z (R × C × W) is read twice, the second time from cache: ≤ 2 MiB (L2 or L3;
            # nearer the floor than blocks of ≤ 512 KB, measured: docs/benchmarks.md, "Block sizes")
            cap = max(1, 2 ** 21 // (g.bands * g.width * z.element_size()))
            _run("step_w", zn, yn, wn, mn, k, a, f, xn, un, _rows_per_task(B, H, cap), _streams(x))
        return _finish(x, out), u


def tv_denoise(f: torch.Tensor, out: torch.Tensor, weight: float, iters: int) -> bool:
    """Chambolle's 2-D TV denoiser (``cassi.solvers.TVDenoiser`` with spectral_weight 0) of every plane of the
    contiguous CPU float32/float64 cube f (B, C, H, W) into ``out`` (may be f), as one numba kernel; False
    (nothing done) when numba is missing or f does not qualify, so that the caller runs its torch ops."""
    if (f.device.type != "cpu" or f.dtype not in DTYPES or not f.is_contiguous() or not out.is_contiguous()
            or (torch.is_grad_enabled() and f.requires_grad) or not available()):
        return False
    planes = f.detach().reshape(-1, *f.shape[-2:]).numpy()
    dst = out.detach().view(planes.shape).numpy()
    import numpy as np

    c = np.array([1.0, 1.0 / weight, 0.25, weight], dtype=planes.dtype)  # 1, 1/w, τ, w in the data's dtype
    _run("tv_planes", planes, dst, c, int(iters))
    return True
