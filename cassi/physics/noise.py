"""Detector noise models for CASSI measurements.

Each model is a small callable: ``noisy = model(y, generator=None)`` takes a
floating tensor y of any shape (typically (B, 1, H, W + Δ)) and returns a new
tensor of the same shape, dtype and device. With a ``torch.Generator`` the
draw is deterministic; the random numbers are drawn on the generator's
device and then moved to y's, so a CPU generator gives the same noise for a
CPU or a GPU y. Without one, the global RNG of y's device is used.
"""
from __future__ import annotations

import math

import torch

from cassi._checks import check_number

__all__ = ["GaussianNoise", "ShotNoise", "Compose"]


def _check_y(y) -> None:
    if not isinstance(y, torch.Tensor) or not y.is_floating_point():
        got = f"dtype {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise TypeError(f"y must be a floating-point torch.Tensor, got {got}")


def _device(y: torch.Tensor, generator: torch.Generator | None) -> torch.device:
    return y.device if generator is None else generator.device


class GaussianNoise:
    """Additive white Gaussian noise: ``y + sigma * N(0, 1)``, elementwise.

    ``sigma`` (>= 0) is in the units of y (e.g. 0.01 of a [0, 1] signal).
    """

    def __init__(self, sigma: float):
        self.sigma = check_number("sigma", sigma, positive=False)

    def __call__(self, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_y(y)
        noise = torch.randn(y.shape, generator=generator, device=_device(y, generator), dtype=y.dtype)
        return y + self.sigma * noise.to(y.device)

    def __repr__(self) -> str:
        return f"GaussianNoise(sigma={self.sigma:g})"


class ShotNoise:
    """Photon (Poisson) noise, optionally followed by ADC quantisation.

    Exactly::

        n     = Poisson(photons * max(y, 0))        # photon counts
        y'    = n / photons                         # back to y's units
        # only if bit_depth is given, with L = 2**bit_depth - 1 and s = full scale:
        y''   = round(min(y', s) / s * L) * s / L

    so E[y'] = y and Var[y'] = y / photons (``photons`` is the expected count
    at y == 1; larger means less noise). With ``bit_depth`` the detector has
    2**bit_depth levels 0, s/L, ..., s. The full scale s is ``full_scale`` if
    given (values above it saturate), else the maximum of y' per sample, i.e.
    over all dimensions but the first (over the whole tensor for 1-D y), so
    nothing saturates. Gradients do not flow through this model.

    For reference, TSA-Net / MST real-data training draws
    ``Binomial(floor(y * 2048 / 0.4), 0.4) / 2048`` (quantum efficiency 0.4):
    mean y, variance 0.6 * y / 2048, integer counts; ``ShotNoise(3413)``
    (= 2048 / 0.6) has the same mean and variance.
    """

    def __init__(self, photons: float | tuple[float, float], bit_depth: int | None = None,
                 full_scale: float | None = None):
        if not isinstance(photons, (int, float)) and hasattr(photons, "__len__"):  # a range [lo, hi]: drawn per
            photons = list(photons)                                                   # sample, log-uniformly
            if len(photons) != 2:
                raise ValueError(f"photons must be a number or a range [lo, hi], got {photons!r}")
            lo, hi = (check_number("photons", v, positive=True) for v in photons)
            if lo > hi:
                raise ValueError(f"photons range [lo, hi] needs lo <= hi, got {photons!r}")
            self.photons = (lo, hi)
        else:
            self.photons = check_number("photons", photons, positive=True)
        if bit_depth is not None and (isinstance(bit_depth, bool) or not isinstance(bit_depth, int) or bit_depth < 1):
            raise ValueError(f"bit_depth must be None or an int >= 1, got {bit_depth!r}")
        self.bit_depth = bit_depth
        self.full_scale = None if full_scale is None else check_number("full_scale", full_scale, positive=True)

    def __call__(self, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_y(y)
        where = _device(y, generator)
        photons = self.photons
        if isinstance(photons, tuple):  # (B, 1, ..., 1): one count per sample, log-uniform in the range
            u = torch.rand((y.shape[0],) + (1,) * (y.ndim - 1), generator=generator, device=where)
            photons = torch.exp(math.log(photons[0]) + u * math.log(photons[1] / photons[0]))
        rate = y.detach().clamp(min=0).to(where) * photons
        out = (torch.poisson(rate, generator=generator) / photons).to(y.device)
        if self.bit_depth is None:
            return out
        levels = 2**self.bit_depth - 1
        if self.full_scale is not None:
            scale = torch.tensor(self.full_scale, dtype=y.dtype, device=y.device)
            out = out.clamp(max=self.full_scale)
        elif out.ndim <= 1:
            scale = out.max()
        else:
            scale = out.amax(dim=tuple(range(1, out.ndim)), keepdim=True)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(out / scale * levels) * (scale / levels)

    def __repr__(self) -> str:
        photons = f"{self.photons:g}" if isinstance(self.photons, float) else f"[{self.photons[0]:g}, {self.photons[1]:g}]"
        return f"ShotNoise(photons={photons}, bit_depth={self.bit_depth}, full_scale={self.full_scale})"


class Compose:
    """Apply noise models in order, e.g. ``Compose([ShotNoise(1e3), GaussianNoise(1e-3)])``
    for Poisson-Gaussian (shot + read) noise. The one generator feeds them all."""

    def __init__(self, models):
        self.models = list(models)
        for m in self.models:
            if not callable(m):
                raise TypeError(f"Compose expects callables model(y, generator=None), got {m!r}")

    def __call__(self, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        for m in self.models:
            y = m(y, generator=generator)
        return y

    def __repr__(self) -> str:
        return f"Compose([{', '.join(map(repr, self.models))}])"
