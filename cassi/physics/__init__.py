"""The camera's physics: the dispersion geometry, the CASSI operator and its backends, masks, noise, the
simulator and the camera that hands out both the simulator and the reconstruction operator.

    Geometry (cassi.geometry)   offsets d (min 0), axis, Δ = ceil(max d), the measurement's shape
    CASSI (operator)            A, Aᵀ, Φ, A⁺ and the data step for a mask and a geometry; backends/ compute it
    masks, noise                mask generators and statistics; shot, read and composed noise
    Simulator (simulate)        y = noise(A_M x) per batch, masks drawn from a source
    Camera (camera)             a spec (mask, bands, dispersion, noise): .geometry, .simulator(), .operator(mask)

Importing it stays light (torch, numpy): ``Camera``, ``Simulator`` and the mask sources, which read mask files
through :mod:`cassi.io`, load on first use.
"""
from importlib import import_module

from cassi.geometry import Geometry
from cassi.physics.masks import bernoulli_mask, center_crop, mask_stats, random_crops
from cassi.physics.noise import Compose, GaussianNoise, ShotNoise
from cassi.physics.operator import CASSI

_LATER = {"Camera": "camera", "Simulator": "simulate", "FixedMask": "simulate",
          "RandomMaskCrops": "simulate", "BernoulliMasks": "simulate", "BlockMasks": "simulate",
          "MixedMasks": "simulate"}


def __getattr__(name: str):
    if name in _LATER:
        return getattr(import_module(f"cassi.physics.{_LATER[name]}"), name)
    raise AttributeError(f"module 'cassi.physics' has no attribute {name!r}")


__all__ = ["CASSI", "Geometry", "Compose", "GaussianNoise", "ShotNoise", "bernoulli_mask", "center_crop",
           "mask_stats", "random_crops", *_LATER]
