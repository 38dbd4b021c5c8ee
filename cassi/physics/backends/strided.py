"""The fast eager CPU/GPU backend: per-band fused multiply-adds, in row blocks that stay in cache.

Forward: y = Σ_c shift_{d_c}(M_c ⊙ x_c) accumulates band by band with the mask multiply fused
(``addcmul_``), one block of rows at a time, so the y block (~1 MB) stays in cache while every
band of x streams through it once: x is read once from memory and y written once (a fractional
band's second tap re-reads its x block from cache).
Adjoint: for a uniform integer step the C shifted windows of y are one zero-copy strided view
(B, C, H, W) of y, multiplied by the mask straight into x; otherwise one fused multiply per band
(a fractional band interpolates y into x_c, then multiplies in place).
Data step: x = z + Aᵀ(w ⊙ (y − A z)) with the final add fused into the adjoint (``addcmul``).
"""
import torch

from cassi.physics.backends.base import Backend, empty

#: bytes of y per row block of the forward: fits a 2 MB L2 with room for the x rows streaming
#: through; such blocks speed up fractional A and leave integer A unchanged (measured:
#: docs/benchmarks.md, "`strided`, `loop` and `auto`"); smaller blocks cost more in per-op
#: overhead than they save.
BLOCK_BYTES = 5 << 18


def _blocks(B: int, H: int, row_bytes: int):
    """(batch slice, row slice) pairs covering (B, H) in blocks of about BLOCK_BYTES."""
    rows = max(1, BLOCK_BYTES // max(row_bytes, 1))
    hb = min(H, max(1, rows // B))
    hb = -(-H // -(-H // hb))  # even split of H
    bb = min(B, max(1, rows // hb))
    return [(slice(b, b + bb), slice(h, h + hb)) for b in range(0, B, bb) for h in range(0, H, hb)]


def _band(mask, bs, c, hs):
    """The mask of band c over a (batch, rows) block: (Bm', H', W), broadcasting over batch."""
    return mask[bs if mask.shape[0] > 1 else slice(None), c if mask.shape[1] > 1 else 0, hs]


class StridedBackend(Backend):
    name = "strided"

    def forward(self, x, mask, g, out=None):
        B, C, H, W = x.shape
        y = empty((B, 1, H, g.out_width), x) if out is None else out
        for bs, hs in _blocks(B, H, g.out_width * x.element_size()):
            acc = y[bs, 0, hs]
            acc.zero_()
            for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
                xc, m = x[bs, c, hs], _band(mask, bs, c, hs)
                acc[..., k : k + W].addcmul_(xc, m, value=1 - f)
                if f:
                    acc[..., k + 1 : k + 1 + W].addcmul_(xc, m, value=f)
        return y

    def adjoint(self, y, mask, g, out=None):
        B, _, H, _ = y.shape
        x = empty((B, g.bands, H, g.width), y) if out is None else out
        return _adjoint(y, mask, g, x)

    def data_step(self, z, y, w, mask, g, out=None):
        u = self.forward(z, mask, g)
        torch.sub(y, u, out=u)  # u = y − A z
        return _adjoint(u * w, mask, g, empty(z.shape, z) if out is None else out, z), u


def _adjoint(y, mask, g, x, z=None):
    """x = M ⊙ window(y), or z + M ⊙ window(y) when z is given (the data step's add, fused)."""
    B, C, H, W = x.shape

    def put(src, m, dst, zc):  # dst = (zc +) src ⊙ m in one pass over dst
        return torch.mul(src, m, out=dst) if zc is None else torch.addcmul(zc, src, m, out=dst)

    if g.step is not None:
        sb, _, sh, sw = y.stride()
        view = y.as_strided((B, C, H, W), (sb, g.step * sw, sh, sw), y.storage_offset())
        return put(view, mask, x, z)
    # x_c holds the interpolated window until the mask is applied, unless x is z (an in-place step)
    tmp = torch.empty_like(x[:, 0]) if z is not None and x.data_ptr() == z.data_ptr() else None
    for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
        src = y[:, 0, :, k : k + W]
        if f:  # (1−f)·y[w+k] + f·y[w+k+1] into x_c, then the mask in place (measured faster than blocks)
            src = torch.lerp(src, y[:, 0, :, k + 1 : k + 1 + W], f, out=x[:, c] if tmp is None else tmp)
        put(src, _band(mask, slice(None), c, slice(None)), x[:, c], None if z is None else z[:, c])
    return x
