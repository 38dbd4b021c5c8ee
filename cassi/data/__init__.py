"""Data: synthetic scenes, masks, noise, datasets and measurement simulation, and windows of a solver's
reconstructions (``FirstIterates``) (torch only; the Lightning DataModule over them is
``cassi.lightning.CASSIDataModule``)."""
from cassi.data.datasets import CubeFiles, MeasurementFiles, SyntheticCubes, resolve_paths
from cassi.data.first_iterates import FirstIterates
from cassi.data.synthetic import default_wavelengths, synthetic_batch, synthetic_cube
from cassi.physics import (BernoulliMasks, BlockMasks, Camera, Compose, FixedMask, GaussianNoise,  # re-exported
                           RandomMaskCrops, ShotNoise, Simulator, bernoulli_mask, center_crop, random_crops)

__all__ = [
    "BernoulliMasks", "BlockMasks", "Camera", "Compose", "CubeFiles", "FirstIterates", "FixedMask", "GaussianNoise",
    "MeasurementFiles", "RandomMaskCrops", "ShotNoise", "Simulator", "SyntheticCubes", "bernoulli_mask",
    "center_crop", "default_wavelengths", "random_crops", "resolve_paths", "synthetic_batch", "synthetic_cube",
]

