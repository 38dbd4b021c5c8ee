"""Simulated measurements, batch-wise on the batch's device: y = noise(A_M x).

A mask source is a callable ``source(batch, height, width, device, generator) ->
(B, 1, H, W)`` (or (B, C, H, W) for a per-band mask) giving one mask per sample;
random sources draw on the generator's device (the global RNG without one), so a
CPU generator gives the same masks for a CPU or a GPU batch.
:class:`Simulator` turns a batch {"x": (B, C, H, W), ...} into one with "mask" and
"y" = noise(A x): (B, 1, H, W+Δ), using one ``cassi.CASSI`` per batch.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable, Sequence

import torch

from cassi import io
from cassi.geometry import Geometry
from cassi.physics.masks import center_crop, mask_stats, random_crops, segment_hashes
from cassi.physics.noise import Compose
from cassi.physics.operator import CASSI

__all__ = ["FixedMask", "RandomMaskCrops", "BernoulliMasks", "BlockMasks", "MixedMasks", "Simulator"]


def _fill(p) -> float | tuple[float, float]:
    """A fill factor in (0, 1], or a range [lo, hi] of them (drawn uniformly per sample)."""
    lo, hi = (p, p) if isinstance(p, (int, float)) and not isinstance(p, bool) else tuple(p)
    if not 0 < lo <= hi <= 1:
        raise ValueError(f"p must be in (0, 1], or a range [lo, hi] with 0 < lo <= hi <= 1; got {p!r}")
    return float(lo) if lo == hi else (float(lo), float(hi))


def _draw_fill(p, batch: int, where, generator) -> torch.Tensor:
    """(B, 1, 1, 1) fill factors: ``p`` itself, or uniform in the range ``p``."""
    if isinstance(p, float):
        return torch.full((batch, 1, 1, 1), p, device=where)
    return p[0] + (p[1] - p[0]) * torch.rand((batch, 1, 1, 1), generator=generator, device=where)


class _FromMask:
    """A mask source built on one mask: a path (``cassi.io.load_mask``), tensor or array, kept on the CPU."""

    def __init__(self, mask, key: str | None = None):
        if isinstance(mask, (str, os.PathLike)):
            mask = io.load_mask(mask, key=key)
        self.mask = torch.as_tensor(mask, dtype=torch.float32)
        self._on: dict[torch.device, torch.Tensor] = {}  # copies per device, moved once

    def on(self, device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = self.mask.to(device)
        return self._on[device]

    def __repr__(self) -> str:
        """What it draws, the same in every process (caches are keyed on it): the mask's size and content hash."""
        crop = f", crop={self.crop!r}" if hasattr(self, "crop") else ""
        digest = hashlib.blake2b(self.mask.numpy().tobytes(), digest_size=8).hexdigest()
        return f"{type(self).__name__}(mask={'×'.join(map(str, self.mask.shape))} {digest}{crop})"

    def describe(self) -> dict:
        """The mask's record in a checkpoint's camera (:mod:`cassi.models.camera`): kind, fingerprint, statistics."""
        # windows of it (random crops, or the centre crop of a mask larger than the scenes) are recognised by the
        # hashes of its row segments
        kind = "crops" if isinstance(self, RandomMaskCrops) else "fixed"
        return {"kind": kind, **mask_stats(self.mask), "segments": segment_hashes(self.mask)}

    def _fits(self, height: int, width: int) -> None:
        H, W = self.mask.shape[-2:]
        if height > H or width > W:
            raise ValueError(f"the mask of size {H}×{W} is smaller than the scene ({height}×{width}); "
                             f"use a larger mask or smaller scenes")


class FixedMask(_FromMask):
    """The same mask (H, W) or (C, H, W) for every sample, cropped ("center" or "topleft")
    to the scene size when larger: returns an expanded (B, 1|C, h, w) view."""

    def __init__(self, mask, crop: str = "center", key: str | None = None):
        super().__init__(mask, key)
        if crop not in ("center", "topleft"):
            raise ValueError(f"crop must be 'center' or 'topleft', got {crop!r}")
        if self.mask.ndim not in (2, 3):
            raise ValueError(f"FixedMask needs an (H, W) or (C, H, W) mask, got shape {tuple(self.mask.shape)}")
        self.crop = crop

    def __call__(self, batch: int, height: int, width: int, device=None, generator=None) -> torch.Tensor:
        self._fits(height, width)
        m = self.on(device or "cpu")
        m = center_crop(m, (height, width)) if self.crop == "center" else m[..., :height, :width]
        return m.reshape(1, -1, height, width).expand(batch, -1, -1, -1)


class RandomMaskCrops(_FromMask):
    """Random (h, w) windows of one larger (H, W) mask, one per sample, as in real-data
    training (e.g. of the 660×660 TSA mask): (B, 1, h, w) via ``masks.random_crops``."""

    def __init__(self, mask, key: str | None = None):
        super().__init__(mask, key)
        if self.mask.ndim != 2:
            raise ValueError(f"RandomMaskCrops needs an (H, W) mask, got shape {tuple(self.mask.shape)}")

    def __call__(self, batch: int, height: int, width: int, device=None, generator=None) -> torch.Tensor:
        self._fits(height, width)
        return random_crops(self.on(device or "cpu"), (height, width), batch, generator=generator)


class BernoulliMasks:
    """A fresh binary mask per sample, each pixel 1 with probability ``p`` (or with a probability drawn per sample
    uniformly in the range ``p = [lo, hi]``): (B, 1, H, W)."""

    def __init__(self, p: float | Sequence[float] = 0.5):
        self.p = _fill(p)

    def describe(self) -> dict:
        return {"kind": "bernoulli", "p": self.p if isinstance(self.p, float) else list(self.p)}

    def __repr__(self) -> str:
        return f"BernoulliMasks(p={self.p!r})"

    def __call__(self, batch: int, height: int, width: int, device=None, generator=None) -> torch.Tensor:
        where = generator.device if generator is not None else device
        u = torch.rand((batch, 1, height, width), generator=generator, device=where)
        return (u < _draw_fill(self.p, batch, where, generator)).float().to(device)


class BlockMasks:
    """A fresh binary mask per sample of square blocks of ``block`` px, each block 1 with probability ``p``
    (a coarser aperture than :class:`BernoulliMasks`, which is ``block=1``): (B, 1, H, W)."""

    def __init__(self, p: float | Sequence[float] = 0.5, block: int = 2):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be a positive integer (px), got {block!r}")
        self.p, self.block = _fill(p), block

    def describe(self) -> dict:
        return {"kind": "blocks", "p": self.p if isinstance(self.p, float) else list(self.p), "block": self.block}

    def __repr__(self) -> str:
        return f"BlockMasks(p={self.p!r}, block={self.block})"

    def __call__(self, batch: int, height: int, width: int, device=None, generator=None) -> torch.Tensor:
        where = generator.device if generator is not None else device
        b = self.block
        u = torch.rand((batch, 1, -(-height // b), -(-width // b)), generator=generator, device=where)
        m = (u < _draw_fill(self.p, batch, where, generator)).float().repeat_interleave(b, -2).repeat_interleave(b, -1)
        return m[..., :height, :width].contiguous().to(device)


class MixedMasks:
    """Masks from several sources: each sample's source drawn with probabilities ``weights`` (default: equal),
    e.g. a camera's mask, random crops of a larger one and Bernoulli masks in one training set: (B, 1, H, W)."""

    def __init__(self, sources: Sequence[Callable], weights: Sequence[float] | None = None):
        self.sources = list(sources)
        if not self.sources or not all(callable(s) for s in self.sources):
            raise ValueError(f"MixedMasks needs one or more mask sources, got {sources!r}")
        w = [1.0] * len(self.sources) if weights is None else [float(v) for v in weights]
        if len(w) != len(self.sources) or min(w) < 0 or sum(w) <= 0:
            raise ValueError(f"MixedMasks: {len(w)} weights (>= 0, not all 0) for {len(self.sources)} sources")
        self.weights = [v / sum(w) for v in w]

    def describe(self) -> dict:
        return {"kind": "mixture", "weights": self.weights,
                "sources": [s.describe() if hasattr(s, "describe") else {"kind": type(s).__name__}
                            for s in self.sources]}

    def __repr__(self) -> str:
        return f"MixedMasks(sources={self.sources!r}, weights={self.weights!r})"

    def __call__(self, batch: int, height: int, width: int, device=None, generator=None) -> torch.Tensor:
        where = generator.device if generator is not None else device
        pick = torch.multinomial(torch.tensor(self.weights, device=where), batch, replacement=True,
                                 generator=generator)
        masks = [self.sources[int(k)](1, height, width, device, generator) for k in pick.tolist()]
        return torch.cat(masks)  # (B, 1, H, W): every source gives 2-D masks (per-band ones are not mixed)


class Simulator:
    """Adds "mask" and "y" = noise(A x) to a batch {"x": (B, C, H, W), ...}.

    Args:
        masks: a mask source (see the module docstring), or a mask / path, taken as ``FixedMask``.
        eval_masks: the mask source for validation/test/predict batches (default: ``masks``), e.g.
            training on random crops of a real mask and evaluating on its fixed center crop.
        bands: expected C (checked against x when given).
        step, offsets, axis, backend: the ``cassi.CASSI`` geometry (``step`` is ignored
            when ``offsets`` is given): ``geometry``, a :class:`cassi.geometry.Geometry` (None while the band
            count of a step is not known: then one per batch).
        noise: a callable ``noise(y, generator=None)`` or a list of them (applied in order).

    ``__call__(batch, generator=None, training=True)`` returns a new dict (masks from ``eval_masks``
    when not training); a "mask" already in the batch
    is used as is. y is computed without gradients on x's device, with one operator for
    the whole batch; with a generator the masks and the noise are deterministic.
    """

    def __init__(self, masks, bands: int | None = None, step: float | None = 2,
                 offsets: Sequence[float] | None = None, axis: str = "w", backend="auto",
                 noise: Callable | Sequence[Callable] | None = None, eval_masks=None):
        self.masks = masks if callable(masks) else FixedMask(masks)
        self.eval_masks = self.masks if eval_masks is None else (
            eval_masks if callable(eval_masks) else FixedMask(eval_masks))
        self.bands, self.axis, self.backend = bands, axis, backend
        self.offsets = None if offsets is None else [float(o) for o in offsets]
        self.step = None if offsets is not None else (2 if step is None else step)  # the operator's default
        known = bands is not None or offsets is not None
        self.geometry = Geometry.of(bands, self.step, self.offsets, axis) if known else None
        self.noise = Compose(noise) if isinstance(noise, Sequence) else noise

    def operator(self, mask: torch.Tensor, bands: int | None = None) -> CASSI:
        """``cassi.CASSI`` of this geometry for masks (B, 1|C, H, W); an expanded mask
        (the same for all samples) gives one operator of batch 1 that broadcasts."""
        geometry = self.geometry
        if bands is not None and (geometry is None or bands != geometry.bands):
            geometry = Geometry.of(bands, self.step, self.offsets, self.axis)
        if geometry is None:  # a step, and the band count of a per-band mask
            return CASSI(mask, step=self.step, axis=self.axis, backend=self.backend)
        return CASSI(mask, backend=self.backend, geometry=geometry)

    def __call__(self, batch: dict, generator: torch.Generator | None = None, training: bool = True) -> dict:
        x = batch["x"]
        if x.ndim != 4:
            raise ValueError(f"batch['x'] must be (B, C, H, W), got shape {tuple(x.shape)}")
        B, C, H, W = x.shape
        if self.bands is not None and C != self.bands:
            raise ValueError(f"batch['x'] has {C} bands but the simulator expects bands={self.bands}")
        mask = batch.get("mask")
        if mask is None:
            mask = (self.masks if training else self.eval_masks)(B, H, W, x.device, generator)
        mask = mask.to(x.device, x.dtype)
        with torch.no_grad():
            y = self.operator(mask, C)(x)
            y = y if self.noise is None else self.noise(y, generator=generator)
        return {**batch, "mask": mask, "y": y}

    def __repr__(self) -> str:
        """The measurement it makes (the backend, which computes the same y, is left out: caches keyed on it,
        e.g. ``cassi.data.FirstIterates``, stay valid under another backend)."""
        geo = f"offsets={self.offsets}" if self.offsets is not None else f"step={self.step}"
        return (f"Simulator(masks={type(self.masks).__name__}, bands={self.bands}, {geo}, axis={self.axis!r}, "
                f"noise={self.noise!r})")
