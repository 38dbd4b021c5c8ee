"""Reference backend: the seed's for-loop over bands (slice-add), generalised."""
import torch

from cassi.physics.backends.base import Backend


class LoopBackend(Backend):
    """Per-band slice-add into y; adjoint by slicing y and concatenating. The reference."""

    name = "loop"

    def _forward(self, x, mask, g):
        z = x * mask
        B, _, H, W = z.shape
        y = z.new_zeros(B, 1, H, g.out_width)
        for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
            y[..., k : k + W] += (1 - f) * z[:, c : c + 1]
            if f:
                y[..., k + 1 : k + 1 + W] += f * z[:, c : c + 1]
        return y

    def _adjoint(self, y, mask, g):
        W = g.width
        bands = []
        for k, f in zip(g.shifts, g.fracs):
            band = (1 - f) * y[..., k : k + W]
            if f:
                band = band + f * y[..., k + 1 : k + 1 + W]
            bands.append(band)
        return torch.cat(bands, dim=1) * mask
