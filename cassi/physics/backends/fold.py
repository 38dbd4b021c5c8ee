"""F.fold / F.unfold with kernel (1, C) and dilation (1, S): exactly the shift-sum (seed 004)."""
import torch.nn.functional as F

from cassi.physics.backends.base import Backend, UnsupportedGeometry


class FoldBackend(Backend):
    name = "fold"

    def check(self, g, device=None):
        if g.step is None:
            raise UnsupportedGeometry(
                "backend 'fold' needs a uniform integer step (d_c = c·S), got offsets "
                f"{[k + f for k, f in zip(g.shifts, g.fracs)]}; use 'strided' or 'loop'"
            )

    def _forward(self, x, mask, g):
        B, C, H, W = x.shape
        z = (x * mask).reshape(B, C, H * W)
        return F.fold(z, (H, g.out_width), kernel_size=(1, C), dilation=(1, g.step))

    def _adjoint(self, y, mask, g):
        B, _, H, _ = y.shape
        cols = F.unfold(y, kernel_size=(1, g.bands), dilation=(1, g.step))
        return cols.view(B, g.bands, H, g.width) * mask
