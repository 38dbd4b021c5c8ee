"""torch.compile of the gather form: y = Σ_c pad(z_c) and x_c = M_c ⊙ window_c(y).

Inductor fuses each map into one kernel. Compiling costs seconds to minutes per
geometry (measured in docs/benchmarks.md), so ``auto`` does not try it.
"""
from functools import lru_cache

import torch
import torch.nn.functional as F

from cassi.physics.backends.base import Backend


def _gather_forward(x, mask, g):
    z = x * mask
    y = 0
    for c, (k, f) in enumerate(zip(g.shifts, g.fracs)):
        y = y + F.pad(z[:, c : c + 1], (k, g.delta - k)) * (1 - f)
        if f:
            y = y + F.pad(z[:, c : c + 1], (k + 1, g.delta - k - 1)) * f
    return y


def _gather_adjoint(y, mask, g):
    W = g.width
    bands = [
        y[..., k : k + W] * (1 - f) + (y[..., k + 1 : k + 1 + W] * f if f else 0)
        for k, f in zip(g.shifts, g.fracs)
    ]
    return torch.cat(bands, dim=1) * mask


@lru_cache(maxsize=32)
def _compiled(fn, g):
    # one code object serves every geometry: allow as many specialisations as the cache holds
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(lambda t, m: fn(t, m, g), dynamic=False, fullgraph=True)


class CompiledBackend(Backend):
    name = "compiled"

    def _forward(self, x, mask, g):
        return _compiled(_gather_forward, g)(x, mask)

    def _adjoint(self, y, mask, g):
        return _compiled(_gather_adjoint, g)(y, mask)
