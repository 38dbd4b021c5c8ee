"""The fast eager CPU/GPU backend.

Forward: accumulate band by band into y with the mask multiply fused
(``addcmul_``), so x is read once and no x-sized temporary exists.
Adjoint: for a uniform integer step, the C shifted windows of y are one
zero-copy strided view (B, C, H, W) of y, multiplied by the mask straight
into the output; otherwise one fused multiply per band.
"""
import torch

from cassi.backends.base import Backend, empty


class StridedBackend(Backend):
    name = "strided"

    def forward(self, x, mask, g, out=None):
        B, C, H, W = x.shape
        y = empty((B, 1, H, g.out_width), x) if out is None else out
        y.zero_()
        acc = y[:, 0]
        for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
            m = mask[:, c if mask.shape[1] > 1 else 0]
            acc[..., k : k + W].addcmul_(x[:, c], m, value=1 - f)
            if f:
                acc[..., k + 1 : k + 1 + W].addcmul_(x[:, c], m, value=f)
        return y

    def adjoint(self, y, mask, g, out=None):
        B, _, H, _ = y.shape
        x = empty((B, g.bands, H, g.width), y) if out is None else out
        if g.step is not None:
            sb, _, sh, sw = y.stride()
            view = y.as_strided((B, g.bands, H, g.width), (sb, g.step * sw, sh, sw), y.storage_offset())
            return torch.mul(view, mask, out=x)
        W = g.width
        for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
            m = mask[:, c if mask.shape[1] > 1 else 0]
            if f:
                torch.lerp(y[:, 0, :, k : k + W], y[:, 0, :, k + 1 : k + 1 + W], f, out=x[:, c])
                x[:, c].mul_(m)
            else:
                torch.mul(y[:, 0, :, k : k + W], m, out=x[:, c])
        return x
