"""Data: synthetic scenes, masks, noise, datasets, measurement simulation and the DataModule.

Importing ``cassi.data`` stays light (torch only); ``CASSIDataModule`` (Lightning)
is imported on first access.
"""
from cassi.data.datasets import CubeFiles, MeasurementFiles, SyntheticCubes, resolve_paths
from cassi.data.masks import bernoulli_mask, center_crop, random_crops
from cassi.data.noise import Compose, GaussianNoise, ShotNoise
from cassi.data.simulate import BernoulliMasks, FixedMask, RandomMaskCrops, Simulator
from cassi.data.synthetic import default_wavelengths, synthetic_batch, synthetic_cube

__all__ = [
    "BernoulliMasks", "CASSIDataModule", "Compose", "CubeFiles", "FixedMask", "GaussianNoise",
    "MeasurementFiles", "RandomMaskCrops", "ShotNoise", "Simulator", "SyntheticCubes", "bernoulli_mask",
    "center_crop", "default_wavelengths", "random_crops", "resolve_paths", "synthetic_batch", "synthetic_cube",
]


def __getattr__(name):
    if name == "CASSIDataModule":
        from cassi.data.datamodule import CASSIDataModule
        return CASSIDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
