"""Seed method 3: scatter_add for A, gather for Aᵀ (integer offsets)."""
from functools import lru_cache

import torch

from cassi.physics.backends.base import Backend, require_integer


@lru_cache(maxsize=64)
def _index(g, height, device):
    """Flat index into y (H·(W+Δ)) of every x element (C·H·W): h·(W+Δ) + w + k_c."""
    k = torch.tensor(g.shifts, device=device).view(-1, 1, 1)
    h = torch.arange(height, device=device).view(1, -1, 1)
    w = torch.arange(g.width, device=device).view(1, 1, -1)
    return (h * g.out_width + w + k).reshape(1, -1)


class ScatterBackend(Backend):
    name = "scatter"

    def check(self, g, device=None):
        require_integer(g, self.name)

    def _forward(self, x, mask, g):
        B, _, H, _ = x.shape
        idx = _index(g, H, x.device).expand(B, -1)
        y = x.new_zeros(B, H * g.out_width)
        y.scatter_add_(1, idx, (x * mask).reshape(B, -1))
        return y.view(B, 1, H, g.out_width)

    def _adjoint(self, y, mask, g):
        B, _, H, _ = y.shape
        idx = _index(g, H, y.device).expand(B, -1)
        x = torch.gather(y.reshape(B, -1), 1, idx)
        return x.view(B, g.bands, H, g.width) * mask
