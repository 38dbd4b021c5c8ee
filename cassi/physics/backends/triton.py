"""Fused Triton kernels (gather formulation, no atomics).

* A:    one program per (sample, row block, column block) of y sums the C bands it gathers:
        x read once (a fractional band's second tap hits the same cache lines), y written once.
* Aᵀ:   one program per (sample, band, row block, column block) of x: y (small) read from
        cache, x written once. ``pinv`` is the same kernel with y scaled by w = 1/Φ on load.
* data step x = z + Aᵀ(w ⊙ (y − A z)): one program per row block does both halves: it gathers
        A z for its rows, stores u = y − A z (y-sized, kept for the backward), then writes
        x = z + M ⊙ window(w ⊙ u) for every band of those rows. z is read twice, the second time
        from cache; y read once; x written once.

Inputs may be float32, bfloat16 or float16, accumulated in float32 (float64 in float64, for the
adjointness tests). Index arithmetic switches to 64 bits when a tensor spans 2³¹ elements or more.
Strides are passed explicitly, so transposed views (axis "h") and broadcast masks or weights
(stride 0) need no copies. Block sizes are chosen per (kernel, device, dtype, B, H, geometry,
layout) by timing the candidates on the first call, and cached per process; under
``TRITON_INTERPRET=1`` (the CPU test mode, slow) ``INTERPRET_CONFIG`` is used without timing.
The kernels live in ``_triton_kernels`` (imported on first use).
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch

from cassi.physics.backends.base import Backend, UnsupportedGeometry, empty

#: (BLOCK_H, BLOCK_W, num_warps) candidates timed on a GPU
CONFIGS = ((1, 128, 4), (1, 256, 4), (2, 256, 4), (1, 512, 4), (4, 128, 4), (2, 512, 8), (4, 256, 8))
#: the data step's programs loop over whole rows: fewer, smaller tiles
STEP_CONFIGS = ((1, 128, 4), (1, 256, 4), (2, 128, 4), (1, 512, 8), (2, 256, 8), (4, 128, 8))
#: under the interpreter (tiny test sizes) few, large programs run fastest
INTERPRET_CONFIG = (8, 32, 1)
_TUNED: dict = {}


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@lru_cache(maxsize=1)
def _kernels():
    """(fwd, adj, step): imported on first use, so that ``import cassi`` does not import triton."""
    from cassi.physics.backends import _triton_kernels as k

    return k.fwd, k.adj, k.step


def _wide(*tensors) -> bool:
    """True when some tensor spans 2³¹ elements or more: index arithmetic must be 64-bit."""
    return any(sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1 >= 2**31 for t in tensors)


def _launch(name: str, kernel, configs, grid, key, args, consts):
    """Run ``kernel`` with the block sizes tuned for ``key`` (timed once per key on a GPU)."""
    key = (name, *key)
    if key not in _TUNED:
        if _interpret():
            _TUNED[key] = INTERPRET_CONFIG
        elif len(configs) == 1:
            _TUNED[key] = configs[0]
        else:
            _TUNED[key] = _fastest(kernel, configs, grid, args, consts)
    bh, bw, warps = _TUNED[key]
    kernel[grid(bh, bw)](*args, **consts, BLOCK_H=bh, BLOCK_W=bw, num_warps=warps)


def _fastest(kernel, configs, grid, args, consts):
    """The config with the smallest median time of 5 runs (after one compiling run). The kernels
    are pure (outputs depend only on inputs; ``data_step`` never tunes in place), so repeating them is harmless."""
    best, best_t = configs[0], float("inf")
    for bh, bw, warps in configs:
        def run():
            kernel[grid(bh, bw)](*args, **consts, BLOCK_H=bh, BLOCK_W=bw, num_warps=warps)
        try:
            run()
        except Exception:  # e.g. out of resources for this block size
            continue
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        t = sorted(times)[2]
        if t < best_t:
            best, best_t = (bh, bw, warps), t
    return best


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _consts(g, dtype, *tensors) -> dict:
    import triton.language as tl

    return dict(FRAC=not g.integer, I64=_wide(*tensors), ACC=tl.float64 if dtype == torch.float64 else tl.float32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TritonBackend(Backend):
    name = "triton"

    def check(self, g, device=None):
        if device is None:
            return
        if device.type != "cuda" and not _interpret():
            raise UnsupportedGeometry(
                f"backend 'triton' needs a CUDA device or TRITON_INTERPRET=1, got device {device}"
            )
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise UnsupportedGeometry("backend 'triton' needs the triton package: pip install triton") from e

    @staticmethod
    @lru_cache(maxsize=64)
    def _tables(g, device, dtype):
        """Per-band integer shifts and fractions (in the accumulation dtype)."""
        k = torch.tensor(g.shifts, dtype=torch.int32, device=device)
        f = torch.tensor(g.fracs, dtype=_acc(dtype), device=device)
        return k, f

    @staticmethod
    def _key(t, g, B, H):
        return t.device, t.dtype, B, H, g, t.stride(-1) == 1

    def forward(self, x, mask, g, out=None):
        self.check(g, x.device)
        B, C, H, W = x.shape
        y = empty((B, 1, H, g.out_width), x) if out is None else out
        m = mask.expand(B, C, H, W)
        fwd, _, _ = _kernels()
        _launch("fwd", fwd, CONFIGS, lambda bh, bw: (B * _cdiv(H, bh), _cdiv(g.out_width, bw)),
                self._key(x, g, B, H),
                (x, m, y, *self._tables(g, x.device, x.dtype), C, H, W, g.out_width, *x.stride(), *m.stride(),
                 y.stride(0), y.stride(2), y.stride(3)),
                _consts(g, x.dtype, x, m, y))
        return y

    def _adjoint(self, y, s, mask, g, out):
        self.check(g, y.device)
        B, _, H, WY = y.shape
        C, W = g.bands, g.width
        x = empty((B, C, H, W), y) if out is None else out
        m = mask.expand(B, C, H, W)
        sv = y if s is None else s.expand(B, 1, H, WY)
        _, adj, _ = _kernels()
        _launch("adj", adj, CONFIGS, lambda bh, bw: (B * C * _cdiv(H, bh), _cdiv(W, bw)),
                self._key(y, g, B, H) + (s is None,),
                (y, sv, m, x, *self._tables(g, y.device, y.dtype), C, H, W, WY, y.stride(0), y.stride(2),
                 y.stride(3), sv.stride(0), sv.stride(2), sv.stride(3), *m.stride(), *x.stride()),
                dict(SCALE=s is not None, **_consts(g, y.dtype, y, sv, m, x)))
        return x

    def adjoint(self, y, mask, g, out=None):
        return self._adjoint(y, None, mask, g, out)

    def pinv(self, y, w, mask, g, out=None):
        return self._adjoint(y, w, mask, g, out)

    def data_step(self, z, y, w, mask, g, out=None):
        self.check(g, z.device)
        B, C, H, W = z.shape
        WY = g.out_width
        if out is not None and out.data_ptr() == z.data_ptr() and ("step", *self._key(z, g, B, H)) not in _TUNED:
            self.data_step(z, y, w, mask, g)  # tuning runs the kernel many times: tune on a fresh x, not on z
        x = empty(z.shape, z) if out is None else out  # any strides; element-wise, so out may be z
        u = torch.empty(B, 1, H, WY, dtype=_acc(z.dtype), device=z.device)
        m = mask.expand(B, C, H, W)
        s = w.expand(B, 1, H, WY)
        _, _, step = _kernels()
        _launch("step", step, STEP_CONFIGS, lambda bh, bw: (B * _cdiv(H, bh),), self._key(z, g, B, H),
                (z, y, s, m, x, u, *self._tables(g, z.device, z.dtype), C, H, W, WY, *z.stride(), y.stride(0),
                 y.stride(2), y.stride(3), s.stride(0), s.stride(2), s.stride(3), *m.stride(), *x.stride(),
                 u.stride(0), u.stride(2), u.stride(3)),
                _consts(g, z.dtype, z, y, s, m, x, u))
        return x, u.to(z.dtype)
