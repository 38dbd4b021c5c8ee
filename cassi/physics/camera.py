"""A camera: what a reconstruction needs to know about the instrument (conf/camera/*.yaml, ``camera=<name>`` or
``camera.<key>=...`` in every script).

    cam = Camera(mask="mask.mat", masks="crops", bands=28, wavelengths="tsa", step=2, noise={"photons": 3413})
    cam.check(frame=(256, 256))       # one clear line for a bad spec, before any work
    sim = cam.simulator()             # cassi.physics.simulate.Simulator: masks, geometry, noise
    op = cam.operator(mask)           # cassi.CASSI through which a reconstruction sees the same geometry

The mask is a file (any format :mod:`cassi.io` reads; it may be larger than the frame) or generated. ``masks`` says
how training scenes meet it: "fixed" (the mask, centre-cropped to the scene), "crops" (random windows of it, as
real-data training does), "bernoulli" (a fresh Bernoulli(``fill``) mask per sample) or "blocks" (random binary
blocks of ``block`` px, fill ``fill``). Validation and test use the centre crop of a file's mask, or fresh seeded
masks of the same kind. The noise: shot noise of ``photons`` at y = 1 (and ``bit_depth``), then Gaussian
``sigma``; all None is noiseless. The dispersion is one :class:`cassi.geometry.Geometry` (``cam.geometry``) that
the simulator and the operator share.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Sequence

import torch

from cassi import io
from cassi.geometry import Geometry
from cassi.physics.noise import Compose, GaussianNoise, ShotNoise
from cassi.physics.operator import CASSI
from cassi.physics.simulate import BernoulliMasks, BlockMasks, FixedMask, MixedMasks, RandomMaskCrops, Simulator, _fill

__all__ = ["Camera", "resolve", "simulator", "operators", "KINDS"]

KINDS = ("fixed", "crops", "bernoulli", "blocks", "mixture")


class Camera:
    """A CASSI camera (module docstring). Raises ValueError in one line for a spec that cannot work.

    Args:
        mask: the coded aperture: a path, an (H, W) / (C, H, W) tensor, or None for generated masks.
        masks: "fixed", "crops", "bernoulli", "blocks" (how training draws masks), or "mixture": each sample's
            masks from one of ``mixture``'s entries (dicts of ``mask``, ``masks``, ``fill``, ``block``, ``key`` and
            ``weight``, the relative frequency), e.g. one model for many cameras.
        fill: the fill factor of generated masks, in (0, 1], or a range [lo, hi] (drawn per sample).
        block: the block size (px) of "blocks" masks.
        key: the variable holding the mask in its file (None: the only array).
        bands: C. wavelengths: nm per band, "tsa", "cave" or None.
        step: dispersion in px per band (> 0, fractional allowed); offsets: per-band offsets instead (with
            step=None); axis: "w" or "h". Together ``geometry`` (:meth:`cassi.geometry.Geometry.of`).
        noise: None or {"photons", "bit_depth", "sigma"} (missing or None entries are off).
    """

    def __init__(self, mask=None, masks: str = "fixed", fill: float = 0.5, block: int = 1, key: str | None = None,
                 bands: int = 28, wavelengths="tsa", step: float | None = 2, offsets: Sequence[float] | None = None,
                 axis: str = "w", noise: Mapping | None = None, mixture: Sequence[Mapping] | None = None):
        if masks not in KINDS:
            raise ValueError(f"camera.masks must be one of {', '.join(KINDS)}, got {masks!r}")
        if mask is None and masks in ("fixed", "crops"):
            raise ValueError(f"camera.masks={masks} needs camera.mask (a mask file); or use camera.masks=bernoulli")
        if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
            raise ValueError(f"camera.bands must be a positive integer, got {bands!r}")
        try:
            fill = _fill(fill)
        except (TypeError, ValueError):
            raise ValueError(f"camera.fill must be in (0, 1] or a range [lo, hi] within it, got {fill!r}") from None
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"camera.block must be a positive integer (px), got {block!r}")
        try:
            self.wavelengths = io.band_wavelengths(wavelengths, bands, "camera.bands says the camera has")
        except ValueError as e:
            raise ValueError(f"camera.wavelengths: {e}") from None
        if offsets is not None:
            if step is not None:
                raise ValueError(f"camera.offsets replaces camera.step: give camera.step=null with it (got step={step})")
            offsets = [float(o) for o in offsets]
        try:
            self.geometry = Geometry.of(bands, step, offsets, axis)
        except ValueError as e:
            raise ValueError(f"camera.{e}") from None
        self.mixture, self.weights = [], []
        if masks == "mixture":
            if not mixture:
                raise ValueError("camera.masks=mixture needs camera.mixture: a list of {mask, masks, fill, block, "
                                 "weight} entries")
            for i, entry in enumerate(mixture):
                entry = dict(entry)
                self.weights.append(float(entry.pop("weight", 1.0)))
                if entry.get("masks") == "mixture":
                    raise ValueError(f"camera.mixture[{i}]: a mixture cannot hold another mixture")
                try:
                    self.mixture.append(Camera(**entry, bands=bands, wavelengths=wavelengths, step=step,
                                               offsets=offsets, axis=axis))
                except (TypeError, ValueError) as e:
                    raise ValueError(f"camera.mixture[{i}]: {e}") from None
        elif mixture:
            raise ValueError(f"camera.mixture is given but camera.masks={masks}; set camera.masks=mixture")
        self.mask, self.masks, self.fill, self.block, self.key = mask, masks, fill, block, key
        self.bands, self.step, self.offsets, self.axis = bands, step, offsets, axis
        self.noise = {k: v for k, v in dict(noise or {}).items() if v is not None}
        unknown = set(self.noise) - {"photons", "bit_depth", "sigma"}
        if unknown:
            raise ValueError(f"camera.noise has unknown keys {sorted(unknown)}; known: photons, bit_depth, sigma")
        self._noise = self._noise_model()  # checks the values

    # ------------------------------------------------------------------ parts
    def _noise_model(self):
        parts = []
        if "photons" in self.noise:
            parts.append(ShotNoise(self.noise["photons"], bit_depth=self.noise.get("bit_depth")))
        elif "bit_depth" in self.noise:
            raise ValueError("camera.noise.bit_depth needs camera.noise.photons (quantisation follows shot noise)")
        if "sigma" in self.noise:
            parts.append(GaussianNoise(self.noise["sigma"]))
        return None if not parts else parts[0] if len(parts) == 1 else Compose(parts)

    def mask_shape(self) -> tuple[int, ...] | None:
        """The mask's shape, from the file's header (nothing else read), or None for generated masks."""
        if self.mask is None or self.masks == "mixture":
            return None
        if isinstance(self.mask, torch.Tensor):
            return tuple(self.mask.shape)
        try:
            return tuple(io.read_header(self.mask, "mask", key=self.key).shape)
        except io.DataFileError as e:  # e.g. a file of several arrays: which one is the camera's key
            hint = " (here: camera.key=<name>)" if self.key is None and "key=" in str(e) else ""
            raise ValueError(f"camera.mask {e}{hint}") from None

    def check(self, frame: tuple[int, int] | None = None) -> None:
        """ValueError in one line when scenes of ``frame`` (H, W) cannot go through this camera: a mask file that is
        missing or smaller than the frame, a dispersion that spreads the bands beyond the frame's width."""
        for part in self.mixture:
            part.check(frame)
        if self.mask is not None and not isinstance(self.mask, torch.Tensor) and not Path(self.mask).is_file():
            raise ValueError(f"camera.mask {self.mask} does not exist")
        shape = self.mask_shape()
        if frame is None:
            return
        h, w = frame
        if shape is not None and (shape[-2] < h or shape[-1] < w):
            raise ValueError(f"camera.mask {self.mask} is {shape[-2]}×{shape[-1]}, smaller than the {h}×{w} scenes; "
                             f"use a larger mask or smaller scenes")
        span, delta = self.geometry.along(frame), self.geometry.delta
        if delta >= span:
            raise ValueError(f"camera.step/offsets spread the {self.bands} bands over {delta} px along "
                             f"{self.axis!r}, not less than the {span}-px frame: y would hold no whole band")

    def sources(self):
        """(training mask source, evaluation mask source) for :class:`cassi.physics.simulate.Simulator`."""
        if self.masks == "mixture":
            parts = [part.sources() for part in self.mixture]
            return (MixedMasks([t for t, _ in parts], self.weights), MixedMasks([e for _, e in parts], self.weights))
        if self.masks == "bernoulli":
            return BernoulliMasks(self.fill), BernoulliMasks(self.fill)
        if self.masks == "blocks":
            return BlockMasks(self.fill, self.block), BlockMasks(self.fill, self.block)
        fixed = FixedMask(self.mask, crop="center", key=self.key)
        if self.masks == "fixed":
            return fixed, fixed
        return RandomMaskCrops(fixed.mask), fixed

    def simulator(self, backend="auto") -> Simulator:
        """The measurements this camera makes: y = noise(A_M x) with its masks, geometry and noise."""
        train, evaluate = self.sources()
        return Simulator(train, bands=self.bands, step=self.step, offsets=self.offsets, axis=self.axis,
                         backend=backend, noise=self._noise, eval_masks=evaluate)

    def operator(self, mask, backend="auto") -> CASSI:
        """The operator A_M a reconstruction inverts for ``mask`` (H, W), (C, H, W) or (B, 1|C, H, W): this camera's
        geometry, the same as its simulator's."""
        return CASSI(mask, backend=backend, geometry=self.geometry)

    def __repr__(self) -> str:
        geo = f"offsets={self.offsets}" if self.offsets is not None else f"step={self.step}"
        mask = self.mask if self.mask is None or not isinstance(self.mask, torch.Tensor) else "tensor"
        return (f"Camera(mask={mask}, masks={self.masks}, bands={self.bands}, {geo}, axis={self.axis!r}, "
                f"noise={self.noise or None})")


def resolve(camera: Mapping, bands: int | None = None, wavelengths="camera") -> Camera:
    """The :class:`Camera` of a spec (a mapping of its arguments: the ``camera`` config node), with the run's band
    count where given and not the camera's (``bands=6``; its wavelengths are then not checked) and ``wavelengths``
    ("camera": the camera's; None: not checked). Every script's simulator and operator come from it."""
    spec = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in dict(camera).items()}
    if bands is not None and bands != spec.get("bands"):
        spec["bands"] = bands
        spec["wavelengths"] = None if wavelengths == "camera" else wavelengths
    elif wavelengths != "camera":
        spec["wavelengths"] = wavelengths
    return Camera(**spec)


def simulator(camera: Mapping, bands: int | None = None, wavelengths="camera", backend="auto") -> Simulator:
    """The measurements of a camera spec: ``resolve(camera, bands, wavelengths).simulator(backend)``
    (conf/data/simulator/camera.yaml)."""
    return resolve(camera, bands, wavelengths).simulator(backend)


def operators(camera: Mapping, bands: int | None = None, backend="auto") -> Callable[..., CASSI]:
    """``mask -> CASSI`` through a camera spec's geometry (conf/operator/auto.yaml): the operator every script
    reconstructs through, the same camera as its simulator's."""
    return functools.partial(resolve(camera, bands, wavelengths=None).operator, backend=backend)
