"""Seed method 2: one large-kernel conv2d over bands (slow; kept for comparison)."""
from functools import lru_cache

import torch
import torch.nn.functional as F

from cassi.physics.backends.base import Backend


@lru_cache(maxsize=64)
def _kernel(g, dtype, device):
    """(1, C, 1, Δ+1) cross-correlation kernel: tap Δ-k_c carries 1-f_c, tap Δ-k_c-1 carries f_c."""
    K = torch.zeros(1, g.bands, 1, g.delta + 1, dtype=torch.float64)
    for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
        K[0, c, 0, g.delta - k] += 1 - f
        if f:
            K[0, c, 0, g.delta - k - 1] += f
    return K.to(device=device, dtype=dtype)


class ConvBackend(Backend):
    """A x = conv2d(M ⊙ x, K); Aᵀ y = M ⊙ conv_transpose2d(y, K)."""

    name = "conv"

    def _forward(self, x, mask, g):
        return F.conv2d(x * mask, _kernel(g, x.dtype, x.device), padding=(0, g.delta))

    def _adjoint(self, y, mask, g):
        return F.conv_transpose2d(y, _kernel(g, y.dtype, y.device), padding=(0, g.delta)) * mask
