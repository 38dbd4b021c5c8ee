"""Fused Triton kernels (gather formulation, no atomics): one read of x and one
write of y for A; one read of y and one write of x for Aᵀ.

Runs on a CUDA device, or on the CPU under ``TRITON_INTERPRET=1`` (slow: for
testing only). Strides are passed explicitly, so transposed views (axis "h")
and broadcast masks (stride 0) need no copies.
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch

from cassi.backends.base import Backend, UnsupportedGeometry, empty

BLOCK = 128


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def fwd(x_ptr, m_ptr, y_ptr, k_ptr, f_ptr, C, H, W, WY,
            sxb, sxc, sxh, sxw, smb, smc, smh, smw, syb, syh, syw, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # b * H + h
        b = row // H
        h = row % H
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty)
        for c in range(C):
            k = tl.load(k_ptr + c)
            f = tl.load(f_ptr + c).to(acc.dtype)
            w0 = j - k
            ok0 = (w0 >= 0) & (w0 < W)
            x0 = tl.load(x_ptr + b * sxb + c * sxc + h * sxh + w0 * sxw, mask=ok0, other=0.0)
            m0 = tl.load(m_ptr + b * smb + c * smc + h * smh + w0 * smw, mask=ok0, other=0.0)
            w1 = w0 - 1
            ok1 = (w1 >= 0) & (w1 < W)  # f = 0 makes this tap vanish
            x1 = tl.load(x_ptr + b * sxb + c * sxc + h * sxh + w1 * sxw, mask=ok1, other=0.0)
            m1 = tl.load(m_ptr + b * smb + c * smc + h * smh + w1 * smw, mask=ok1, other=0.0)
            acc += (1 - f) * (x0 * m0).to(acc.dtype) + f * (x1 * m1).to(acc.dtype)
        tl.store(y_ptr + b * syb + h * syh + j * syw, acc, mask=j < WY)

    @triton.jit
    def adj(y_ptr, m_ptr, x_ptr, k_ptr, f_ptr, C, H, W, WY,
            syb, syh, syw, smb, smc, smh, smw, sxb, sxc, sxh, sxw, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # (b * C + c) * H + h
        h = row % H
        c = (row // H) % C
        b = row // (H * C)
        w = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = w < W
        k = tl.load(k_ptr + c)
        f = tl.load(f_ptr + c)
        base = y_ptr + b * syb + h * syh
        y0 = tl.load(base + (w + k) * syw, mask=ok, other=0.0)
        y1 = tl.load(base + (w + k + 1) * syw, mask=ok & (w + k + 1 < WY), other=0.0)
        m = tl.load(m_ptr + b * smb + c * smc + h * smh + w * smw, mask=ok, other=0.0)
        val = m * ((1 - f) * y0 + f * y1)
        tl.store(x_ptr + b * sxb + c * sxc + h * sxh + w * sxw, val, mask=ok)

    return triton, fwd, adj


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

    def _tables(self, g, t):
        k = torch.tensor(g.shifts, dtype=torch.int32, device=t.device)
        f = torch.tensor(g.fracs, dtype=t.dtype, device=t.device)
        return k, f

    def forward(self, x, mask, g, out=None):
        self.check(g, x.device)
        triton, fwd, _ = _kernels()
        B, C, H, W = x.shape
        y = empty((B, 1, H, g.out_width), x) if out is None else out
        m = mask.expand(B, C, H, W)
        k, f = self._tables(g, x)
        grid = (B * H, triton.cdiv(g.out_width, BLOCK))
        fwd[grid](x, m, y, k, f, C, H, W, g.out_width, *x.stride(), *m.stride(),
                  y.stride(0), y.stride(2), y.stride(3), BLOCK=BLOCK)
        return y

    def adjoint(self, y, mask, g, out=None):
        self.check(g, y.device)
        triton, _, adj = _kernels()
        B, _, H, WY = y.shape
        C, W = g.bands, g.width
        x = empty((B, C, H, W), y) if out is None else out
        m = mask.expand(B, C, H, W)
        k, f = self._tables(g, y)
        grid = (B * C * H, triton.cdiv(W, BLOCK))
        adj[grid](y, m, x, k, f, C, H, W, WY, y.stride(0), y.stride(2), y.stride(3),
                  *m.stride(), *x.stride(), BLOCK=BLOCK)
        return x
