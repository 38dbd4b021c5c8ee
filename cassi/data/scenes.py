"""Generated training scenes from measured spectra, and a mixture of scene sources.

* :class:`DeadLeaves`: occluding shapes ("dead leaves": discs, ellipses, rotated rectangles with radii drawn from
  p(r) ∝ r⁻³, so that every scale is present), each carrying a measured reflectance (or two, blended across it),
  textured by a grey photograph or a noise field, shaded, under a random light.
* :class:`PhotoScenes`: photographs (linear sRGB) turned into spectra by :class:`cassi.data.spectra.RGBToSpectrum`,
  a lookup drawn anew per scene, under a random light; crops zoomed, rotated and flipped.
* :class:`Mixture`: sample i drawn from one of several datasets with given weights.

Every scene is (C, H, W) float32 in [0, 1] at the camera's band centres, a function of (seed, index) alone.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, Dataset

from cassi import io
from cassi.data.datasets import stable_seed
from cassi.data.sources import SOURCES, ContentMissing, source_dir
from cassi.data.spectra import REFLECTANCE_SOURCES, RGBToSpectrum, random_illuminant, reflectances

__all__ = ["DeadLeaves", "PhotoScenes", "Mixture", "photo_files", "texture_files"]

_TEXTURES = ("brick.png", "grass.png", "gravel.png")
_PHOTOS_SK = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg")


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _read_image(path: Path) -> torch.Tensor:
    """(H, W, 3) or (H, W) float32 in [0, 1] from an 8-bit PNG/JPEG (Pillow, matplotlib's dependency)."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB") if im.mode not in ("L", "RGB") else im
        return torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0)


def _linear(srgb: torch.Tensor) -> torch.Tensor:
    """sRGB-encoded values in [0, 1] → linear (IEC 61966-2-1)."""
    return torch.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)


def texture_files(root=None) -> list[Path]:
    """The grey texture photographs (scikit-image's brick, grass, gravel): [] when that source is not fetched."""
    try:
        d = source_dir("skimage", root)
    except ContentMissing:
        return []
    return [d / f for f in _TEXTURES if (d / f).is_file()]


def photo_files(sources=("skimage", "mate"), root=None) -> list[Path]:
    """The colour photographs of the given fetched sources (raises ContentMissing for one not fetched)."""
    out = []
    for s in sources:
        d = source_dir(s, root)
        out += [d / f for f in _PHOTOS_SK if (d / f).is_file()] if s == "skimage" else sorted(d.glob("*.jpg"))
    return out


def _smooth(g: torch.Generator, h: int, w: int, cells: int) -> torch.Tensor:
    """(h, w) smooth N(0, 1)-like field from a cells × cells grid (bicubic)."""
    coarse = torch.randn(1, 1, cells + 1, cells + 1, generator=g)
    return F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=True)[0, 0]


def _crop(img: torch.Tensor, h: int, w: int, g: torch.Generator, zoom: float) -> torch.Tensor:
    """A random window of ``img`` (H, W[, 3]) 2^u times (h, w), u ~ U(−zoom, 0) (at most the image), resized to
    (h, w) (antialiased), rotated by k·90° and flipped: (h, w[, 3])."""
    x = img if img.ndim == 3 else img[..., None]
    H, W = x.shape[:2]
    scale = min(2 ** (zoom * float(torch.rand((), generator=g))), H / h, W / w)
    rh, rw = max(1, round(h * scale)), max(1, round(w * scale))
    top, left = (int(torch.randint(n, (), generator=g)) for n in (H - rh + 1, W - rw + 1))
    x = x[top:top + rh, left:left + rw].permute(2, 0, 1)[None]
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    x = torch.rot90(x[0], int(torch.randint(4 if h == w else 1, (), generator=g)) * (1 if h == w else 2), (1, 2))
    x = x.flip(-1) if int(torch.randint(2, (), generator=g)) else x
    return x.permute(1, 2, 0) if img.ndim == 3 else x[0]


def _light(x: torch.Tensor, wavelengths, g: torch.Generator, shade: float) -> torch.Tensor:
    """x (C, H, W) under a random light (mean 1), with probability ``shade`` falling off smoothly across the
    scene, then scaled so that its 99.9th percentile lies in [0.6, 1]; clipped to [0, 1]."""
    c, h, w = x.shape
    x = x * random_illuminant(wavelengths, g).float()[:, None, None]
    if float(torch.rand((), generator=g)) < shade:
        x = x * torch.exp(0.5 * _smooth(g, h, w, 2))[None]
    top = torch.quantile(x.flatten()[::7], 0.999).clamp_min(1e-6)
    return (x * (0.6 + 0.4 * float(torch.rand((), generator=g))) / top).clamp(0, 1)


def _describe(obj) -> str:
    """A dataset as its class and public settings (stable across processes, unlike the default repr)."""
    plain = (int, float, str, bool, type(None), tuple, list)
    keys = {k: v for k, v in sorted(vars(obj).items()) if not k.startswith("_") and k not in ("epoch", "seeds")
            and isinstance(v, plain)}
    return f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in keys.items())})"


class _Generated(Dataset):
    """``n`` scenes of ``height`` × ``width``, sample i seeded by (seed, i); a repr listing the settings (what a
    cache of first iterates is keyed on)."""

    def __init__(self, n: int, height: int, width: int, wavelengths, seed: int):
        self.n, self.height = _check_count("n", n), _check_count("height", height)
        self.width = _check_count("width", width)
        self.wavelengths = io.band_wavelengths(wavelengths if wavelengths is not None else "tsa")
        self.seed = int(seed)
        self.seeds = range(self.seed, self.seed + n)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return _describe(self)

    def _generator(self, index: int) -> torch.Generator:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} scenes")
        return torch.Generator().manual_seed(stable_seed(type(self).__name__, self.seed, index))


class DeadLeaves(_Generated):
    """Occluding shapes with measured reflectances (see the module docstring).

    Args:
        n, height, width: scenes and their size; wavelengths: band centres (nm list, 'tsa', 'cave');
        seed: scene i comes from (seed, i).
        library: reflectance sources (:data:`cassi.data.spectra.REFLECTANCE_SOURCES`); root: the fetched content.
        radius: (r_min, r_max) in pixels (r_max default: half the larger side); shapes: at most this many.
        blend: probability that a shape blends two spectra across itself; texture: probability that a shape is
        textured by a grey photograph (when fetched; else by noise) instead of a smooth noise field.
        shade: probability of light falling off across the scene.

    Sample i: {"x": (C, height, width) float32 in [0, 1], "name": "leaves_<seed>_<i>"}.
    """

    def __init__(self, n: int, height: int = 256, width: int = 256, wavelengths=None, seed: int = 0,
                 library=REFLECTANCE_SOURCES, root: str | os.PathLike | None = None, radius=(3.0, None),
                 shapes: int = 2000, blend: float = 0.3, texture: float = 0.5, shade: float = 0.5):
        super().__init__(n, height, width, wavelengths, seed)
        self.library, self.root = tuple(library), None if root is None else str(root)
        self.radius = (float(radius[0]), float(radius[1] if radius[1] is not None else max(height, width) / 2))
        if not 0 < self.radius[0] < self.radius[1]:
            raise ValueError(f"radius must be (r_min, r_max) with 0 < r_min < r_max, got {radius!r}")
        self.shapes, self.blend, self.texture, self.shade = _check_count("shapes", shapes), blend, texture, shade
        self._spectra = reflectances(self.wavelengths, self.library, root).values.float()  # (N, C)
        self._textures = [_read_image(p) for p in texture_files(root)]

    def _radius(self, g: torch.Generator) -> float:
        lo, hi = self.radius  # inverse CDF of p(r) ∝ r⁻³ on [lo, hi]
        u = float(torch.rand((), generator=g))
        return (lo ** -2 - u * (lo ** -2 - hi ** -2)) ** -0.5

    def _gain(self, g: torch.Generator, h: int, w: int) -> torch.Tensor:
        """(h, w) intensity texture of mean ~1 for one shape."""
        amount = 0.6 * float(torch.rand((), generator=g))
        if self._textures and float(torch.rand((), generator=g)) < self.texture:
            t = self._textures[int(torch.randint(len(self._textures), (), generator=g))]
            t = _crop(t.mean(-1) if t.ndim == 3 else t, h, w, g, zoom=2.0)
            t = (t - t.mean()) / t.std().clamp_min(1e-3)
        else:
            t = _smooth(g, h, w, int(torch.randint(2, 16, (), generator=g)))
        return (1 + amount * t.clamp(-2.5, 2.5)).clamp_min(0.05)

    def __getitem__(self, index: int) -> dict:
        g = self._generator(index)
        H, W = 2 * self.height, 2 * self.width  # drawn at twice the size, averaged down: soft edges
        c = self._spectra.shape[1]
        x = torch.empty(c, H, W)
        covered = torch.zeros(H, W, dtype=torch.bool)
        yy, xx = torch.arange(H, dtype=torch.float32)[:, None], torch.arange(W, dtype=torch.float32)[None]
        for k in range(self.shapes):  # front to back: a shape paints only what nothing in front covers
            r = 2 * self._radius(g)
            cy, cx = float(torch.rand((), generator=g)) * H, float(torch.rand((), generator=g)) * W
            kind, theta = int(torch.randint(3, (), generator=g)), math.pi * float(torch.rand((), generator=g))
            aspect = 2 ** (1.5 * float(torch.rand((), generator=g)) - 0.75) if kind else 1.0
            y0, y1 = max(0, int(cy - 1.5 * r)), min(H, int(cy + 1.5 * r) + 2)
            x0, x1 = max(0, int(cx - 1.5 * r)), min(W, int(cx + 1.5 * r) + 2)
            if y0 >= y1 or x0 >= x1:
                continue
            dy, dx = yy[y0:y1] - cy, xx[:, x0:x1] - cx
            u = (dx * math.cos(theta) + dy * math.sin(theta)) / (r * aspect)
            v = (-dx * math.sin(theta) + dy * math.cos(theta)) * aspect / r
            inside = (u * u + v * v <= 1) if kind < 2 else ((u.abs() <= 1) & (v.abs() <= 1))
            paint = inside & ~covered[y0:y1, x0:x1]
            if not bool(paint.any()):
                continue
            h, w = y1 - y0, x1 - x0
            s = self._spectra[int(torch.randint(len(self._spectra), (), generator=g))]
            patch = s[:, None, None] * self._gain(g, h, w)[None]
            if float(torch.rand((), generator=g)) < self.blend:
                s2 = self._spectra[int(torch.randint(len(self._spectra), (), generator=g))]
                t = torch.sigmoid(2 * _smooth(g, h, w, 3))[None]
                patch = patch * (1 - t) + s2[:, None, None] * t * self._gain(g, h, w)[None]
            region = x[:, y0:y1, x0:x1]
            region[:, paint] = patch[:, paint]
            covered[y0:y1, x0:x1] |= paint
            if k % 64 == 63 and float(covered.float().mean()) > 0.999:
                break  # what is left: the background's
        if not bool(covered.all()):  # the background: one more spectrum, behind every shape
            s = self._spectra[int(torch.randint(len(self._spectra), (), generator=g))]
            x[:, ~covered] = s[:, None]
        x = F.avg_pool2d(x[None], 2)[0]
        x = _light(x, self.wavelengths, g, self.shade)
        return {"x": x.contiguous(), "name": f"leaves_{self.seed}_{index}"}


class PhotoScenes(_Generated):
    """Photographs as spectral scenes (see the module docstring).

    Args:
        n, height, width, wavelengths, seed: as :class:`DeadLeaves`.
        photos: file names (stems or names) to use, or None for all of ``sources``; exclude: names left out (the
            held-back photographs of a test split).
        sources: fetched photo sources (:data:`cassi.data.sources.SOURCES` 'skimage', 'mate').
        library: reflectance sources of the RGB → spectrum lookup; zoom: crops read over up to 2^zoom times
            their size; shade: probability of light falling off across the scene.

    Sample i: {"x": (C, height, width) float32 in [0, 1], "name": "photo_<stem>_<seed>_<i>"}.
    """

    def __init__(self, n: int, height: int = 256, width: int = 256, wavelengths=None, seed: int = 0,
                 photos=None, exclude=(), sources=("skimage", "mate"), library=REFLECTANCE_SOURCES,
                 root: str | os.PathLike | None = None, zoom: float = 2.0, shade: float = 0.5):
        super().__init__(n, height, width, wavelengths, seed)
        for s in sources:
            if s not in SOURCES or s in ("earthlib", "psychtoolbox"):
                raise ValueError(f"photo source must be 'skimage' or 'mate', got {s!r}")
        files = photo_files(tuple(sources), root)
        named = {p.stem: p for p in files} | {p.name: p for p in files}
        wanted = list(photos) if photos is not None else [p.name for p in files]
        unknown = [p for p in list(wanted) + list(exclude) if p not in named]
        if unknown:
            raise ValueError(f"photos {unknown} are not among {sorted(p.name for p in files)}")
        drop = {named[p] for p in exclude}
        self.files = [named[p] for p in wanted if named[p] not in drop]
        if not self.files:
            raise ValueError("no photograph left after exclude=")
        self.sources, self.library, self.root = tuple(sources), tuple(library), None if root is None else str(root)
        self.zoom, self.shade = float(zoom), float(shade)
        self._lookup = RGBToSpectrum(self.wavelengths, self.library, root)
        self._images: dict[Path, torch.Tensor] = {}

    def _image(self, path: Path) -> torch.Tensor:
        if path not in self._images:
            self._images[path] = _linear(_read_image(path))
        return self._images[path]

    def __getitem__(self, index: int) -> dict:
        g = self._generator(index)
        path = self.files[int(torch.randint(len(self.files), (), generator=g))]
        rgb = _crop(self._image(path), self.height, self.width, g, self.zoom)
        x = self._lookup(rgb, self._lookup.table(g))
        x = _light(x, self.wavelengths, g, self.shade)
        return {"x": x.contiguous(), "name": f"photo_{path.stem}_{self.seed}_{index}"}


class Mixture(Dataset):
    """``samples_per_epoch`` samples drawn from ``sources`` (datasets of {"x", "name"}, a list or a dict) with
    probabilities ∝ ``weights`` (a source of weight 0 is never read): sample i
    is item j of source k, both drawn from (seed, i). ``files`` and ``seeds`` join the sources' own (for split
    checks); names are prefixed by the source's index ``k:``."""

    def __init__(self, sources, weights=None, samples_per_epoch: int = 256, seed: int = 0):
        self.sources = list(sources.values()) if isinstance(sources, Mapping) else list(sources)
        if not self.sources:
            raise ValueError("a mixture needs at least one source")
        w = [1.0] * len(self.sources) if weights is None else [float(v) for v in weights]
        if len(w) != len(self.sources) or min(w) < 0 or sum(w) <= 0:
            raise ValueError(f"weights must be {len(self.sources)} non-negative numbers, not all 0; got {weights!r}")
        self.weights = w
        self.n, self.seed, self.epoch = _check_count("samples_per_epoch", samples_per_epoch), int(seed), 0
        self.files = [f for s in self.sources for f in (getattr(s, "files", None) or [])]
        self.seeds = None

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Mixture(sources=[{', '.join(map(_describe, self.sources))}], weights={self.weights}, n={self.n}, " \
               f"seed={self.seed})"

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        for s in self.sources:
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        g = torch.Generator().manual_seed(stable_seed("mixture", self.seed, self.epoch, index))
        k = int(torch.multinomial(torch.tensor(self.weights), 1, generator=g))
        j = int(torch.randint(len(self.sources[k]), (), generator=g))
        item = self.sources[k][j]
        return {**item, "name": f"{k}:{item['name']}"}


class Joined(ConcatDataset):
    """Datasets of {"x", "name"} one after another (a validation set of several kinds of content): ``parts`` a
    mapping {label: dataset}, labels only for configs (``data.val.parts.leaves.n=8``). Split checks see each part."""

    def __init__(self, parts: Mapping):
        if not isinstance(parts, Mapping) or not parts:
            raise ValueError(f"parts must be a non-empty mapping {{label: dataset}}, got {parts!r}")
        super().__init__(list(parts.values()))
        self.labels = list(parts)
