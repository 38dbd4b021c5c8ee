"""Shift as a phase ramp in the Fourier domain along the dispersed axis.

Band c is filtered by H_c(ω) = e^{-iωk_c}·((1-f_c) + f_c·e^{-iω}), the
transform of the same two-tap kernel every backend uses, on a length W+Δ
grid (no wrap-around), so it is the same operator, fractional offsets included.
"""
import math
from functools import lru_cache

import torch

from cassi.physics.backends.base import Backend


@lru_cache(maxsize=64)
def _response(g, dtype, device):
    """(C, F) complex frequency responses, F = (W+Δ)//2 + 1."""
    omega = 2 * math.pi * torch.fft.rfftfreq(g.out_width, dtype=torch.float64)
    k = torch.tensor(g.shifts, dtype=torch.float64).view(-1, 1)
    f = torch.tensor(g.fracs, dtype=torch.float64).view(-1, 1)
    resp = torch.exp(-1j * omega * k) * ((1 - f) + f * torch.exp(-1j * omega))
    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    return resp.to(device=device, dtype=cdtype)


class FFTBackend(Backend):
    name = "fft"

    def _forward(self, x, mask, g):
        Z = torch.fft.rfft(x * mask, n=g.out_width, dim=-1)  # (B, C, H, F)
        Y = torch.einsum("bchf,cf->bhf", Z, _response(g, x.dtype, x.device))
        return torch.fft.irfft(Y, n=g.out_width, dim=-1).unsqueeze(1)

    def _adjoint(self, y, mask, g):
        Y = torch.fft.rfft(y, n=g.out_width, dim=-1)  # (B, 1, H, F)
        X = Y * _response(g, y.dtype, y.device).conj()[:, None, :]
        return torch.fft.irfft(X, n=g.out_width, dim=-1)[..., : g.width] * mask
