"""Torch datasets of CASSI samples: synthetic scenes, cube files, real measurements.

Every sample is a dict without the batch dim (``default_collate`` batches it):
``"x"`` ground truth (C, H, W) float32 (absent for real measurements), ``"y"``
a measurement (1, H, W+Δ) (real data only: simulated ones are made per batch by
``cassi.physics.Simulator``), ``"mask"`` (1, H, W) or (C, H, W) (real data
only), ``"name"`` a str. Datasets hold paths, not arrays: files are read in
``__getitem__``. Randomness (crops, augmentation, mosaics) is drawn from a
generator seeded by (seed, epoch, index), so a sample is the same in any worker
and any process; ``set_epoch`` (called by ``CASSIDataModule``'s sampler) draws
new crops every epoch.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import Dataset, default_collate

from cassi import io
from cassi._checks import size_pair as _size_pair
from cassi.data.synthetic import synthetic_cube
from cassi.io import DataFileError
from cassi.physics.masks import center_crop

log = logging.getLogger("cassi")

__all__ = ["SyntheticCubes", "CubeFiles", "MeasurementFiles", "collate", "resolve_paths", "stable_seed"]


def stable_seed(*parts) -> int:
    """A 63-bit seed from ints/strings, equal in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def resolve_paths(patterns) -> list[Path]:
    """Sorted, absolute, de-duplicated data files from files, folders and glob patterns.

    A folder means every file in it with an extension ``cassi.io`` reads; a glob
    keeps only such files too (so ``.npy.json`` sidecars drop out). A plain path
    that does not exist, or no file at all, raises FileNotFoundError naming the patterns.
    """
    pats = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    found: set[Path] = set()
    for pat in (os.path.expanduser(str(p)) for p in pats):
        if glob.has_magic(pat):
            hits = [Path(h) for h in glob.glob(pat, recursive=True)]
        elif os.path.isdir(pat):
            hits = list(Path(pat).iterdir())
        elif os.path.isfile(pat):
            found.add(Path(pat).resolve())
            continue
        else:
            raise FileNotFoundError(f"{pat}: no such file or folder")
        found.update(h.resolve() for h in hits if h.is_file() and h.suffix.lower() in io.FORMATS)
    if not found:
        raise FileNotFoundError(f"no data files ({' '.join(sorted(io.FORMATS))}) match {[str(p) for p in pats]}")
    return sorted(found)


def _optional_size(size) -> tuple[int, int] | None:
    return None if size is None else _size_pair(size if isinstance(size, int) else tuple(size))


class SyntheticCubes(Dataset):
    """``n`` synthetic scenes (``cassi.data.synthetic.synthetic_cube``), generated lazily.

    Sample i is {"x": (C, H, W) float32, "name": "synthetic_<seed+i>"}, always the
    same cube (seed ``seed + i``); ``seeds`` is that range, so splits can be
    checked for overlap. C = ``bands`` or len(``wavelengths``) (a list of nm, 'tsa', 'cave').
    """

    def __init__(self, n: int, height: int = 256, width: int = 256, bands: int = 28, seed: int = 0,
                 wavelengths=None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        self.n, self.height, self.width, self.bands, self.seed = n, height, width, bands, seed
        self.wavelengths = io.band_wavelengths(wavelengths)
        self.seeds = range(seed, seed + n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        s = self.seeds[index]
        x = synthetic_cube(self.height, self.width, self.bands, self.wavelengths, seed=s)
        return {"x": x, "name": f"synthetic_{s}"}


def relight_gain(bands: int, generator: torch.Generator) -> torch.Tensor:
    """A random smooth gain per band (C, 1, 1): a·exp(b·t + c·(t² − 1/3)), t ∈ [−1, 1] over the bands,
    a ~ logU(0.6, 1.6), b, c ~ U(−0.5, 0.5) (another illuminant and exposure)."""
    a, b, c = torch.rand(3, generator=generator, dtype=torch.float64)
    t = torch.linspace(-1, 1, bands, dtype=torch.float64)
    gain = torch.exp(math.log(0.6) + a * math.log(1.6 / 0.6) + (b - 0.5) * t + (c - 0.5) * (t ** 2 - 1 / 3))
    return gain.float()[:, None, None]


def shading_gain(bands: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """A random gain that changes smoothly across the crop (C, H, W): exp((d·u + e·v)·(1 + f·t)), u, v ∈ [−1, 1]
    down and across, t ∈ [−1, 1] over the bands, d, e, f ~ U(−0.5, 0.5) (light falling off across
    the scene, redder or bluer where it is dimmer)."""
    d, e, f = torch.rand(3, generator=generator, dtype=torch.float64)
    u, v, t = (torch.linspace(-1, 1, n, dtype=torch.float64) for n in (height, width, bands))
    field = (d - 0.5) * u[:, None] + (e - 0.5) * v[None, :]  # (H, W)
    return torch.exp(field[None] * (1 + (f - 0.5) * t)[:, None, None]).float()


class CubeFiles(Dataset):
    """Ground-truth cubes from files (any format ``cassi.io.load_cube`` reads), loaded per sample.

    Args:
        paths: files, folders and/or glob patterns (see :func:`resolve_paths`).
        key, layout: passed to ``load_cube`` (variable name; 'hwc' / 'chw').
        wavelengths: target band centres (nm list, 'tsa' or 'cave'): every cube is
            linearly resampled to them from ``source_wavelengths`` (which wins) or the
            file's own stored wavelengths, e.g. CAVE 31 bands -> TSA 28.
        patch_size: int or (h, w): a random crop per sample; None: whole cubes,
            center-cropped to ``crop_to`` when given.
        crop_grid: n > 1: every file gives n × n ``crop_to`` windows instead of its centre, their corners
            evenly spread from edge to edge (n = 2 on a cube twice the size: its four quadrants), named
            ``<stem>_y<top>x<left>``: fixed evaluation windows that cover whole scenes.
        samples_per_epoch: dataset length (default: one sample per file); sample i
            comes from file i mod n_files.
        augment: a random rotation by k·90° (k even for non-square patches) and flip.
        mosaic: probability (True = 1) that a sample is MST's 2×2 splice of four
            quarter-size crops from four random files (needs ``patch_size``); its
            name joins the four stems in the order top-left, top-right, bottom-left, bottom-right.
        relight: probability that a sample is multiplied by :func:`relight_gain` (a random exposure and smooth
            illuminant: new spectra from the same scenes).
        shade: probability that a sample is multiplied by :func:`shading_gain` (brightness and colour of the
            light changing across the crop), drawn after ``relight``.
        spectral_shift: s nm: every sample is resampled at ``wavelengths`` + δ, δ ~ U(−s, s) drawn per sample
            (clipped to the file's wavelength range): the same scenes' spectra moved along the wavelength
            axis, new spectra of the same smoothness (needs ``wavelengths``; 0: none).
        spectral_stretch: e: every sample's band centres are spread about their middle by a factor 1 + σ,
            σ ~ U(−e, e) drawn per sample (after δ; less where the file's range is too narrow), then moved by δ
            (clipped so that all stay in the file's range): spectral features narrower or wider than the
            scenes' own (needs ``wavelengths``; 0: none).
        zoom: z: every random crop is read over a window 2^u times its size, u ~ U(−z, z) (at most the whole
            file), and resized to its size (bilinear, antialiased): the scenes' textures finer (u > 0) or coarser
            than the files' own pixels show them (0: none).
        cache: False/0: no cache; int k: an LRU cache of k cubes; True: all files.
        seed: randomness of sample i in epoch e comes from (seed, e, i).
        max_bytes: a file whose header declares a cube taking more memory once read is refused before any of
            its data is read (DataFileError naming the file, the declared shape and why); None: no bound.

    Memory bound: the dataset holds only paths plus at most ``cache`` cubes per process
    (0 with cache=False); one ``__getitem__`` holds at most 4 more (a mosaic) and
    releases them on return: samples are copies, never views of a file's cube.
    Returns {"x": (C, h, w) float32, "name": file stem}.
    """

    def __init__(self, paths, key: str | None = None, layout: str | None = None, wavelengths=None,
                 source_wavelengths=None, patch_size=None, crop_to=None, samples_per_epoch: int | None = None,
                 augment: bool = False, mosaic: bool | float = False, relight: float = 0.0,
                 shade: float = 0.0, cache: bool | int = False, seed: int = 0, crop_grid: int = 1,
                 spectral_shift: float = 0.0, spectral_stretch: float = 0.0, zoom: float = 0.0,
                 max_bytes: int | None = io.MAX_BYTES):
        self.files = resolve_paths(paths)
        self.key, self.layout, self.seed, self.augment, self.epoch = key, layout, seed, augment, 0
        self.max_bytes = max_bytes
        self.wavelengths = io.band_wavelengths(wavelengths)
        self.source_wavelengths = io.band_wavelengths(source_wavelengths)
        self.patch_size, self.crop_to = _optional_size(patch_size), _optional_size(crop_to)
        if self.patch_size and self.crop_to:
            raise ValueError("give patch_size= (random crops) or crop_to= (center crop), not both")
        self.crop_grid = int(crop_grid)
        if self.crop_grid < 1 or self.crop_grid != crop_grid:
            raise ValueError(f"crop_grid must be an integer >= 1 (windows per side), got {crop_grid!r}")
        if self.crop_grid > 1 and (not self.crop_to or samples_per_epoch is not None):
            raise ValueError("crop_grid needs crop_to (the window size) and no samples_per_epoch (a sample per window)")
        self.mosaic = float(mosaic)
        if not 0 <= self.mosaic <= 1:
            raise ValueError(f"mosaic must be a bool or a probability in [0, 1], got {mosaic!r}")
        if self.mosaic and not self.patch_size:
            raise ValueError("mosaic needs patch_size (the mosaic's size)")
        self.relight, self.shade = float(relight), float(shade)
        for name, p in (("relight", relight), ("shade", shade)):
            if not 0 <= float(p) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        self.spectral_shift = float(spectral_shift)
        if not self.spectral_shift >= 0:
            raise ValueError(f"spectral_shift must be >= 0 nm, got {spectral_shift!r}")
        self.spectral_stretch = float(spectral_stretch)
        if not 0 <= self.spectral_stretch < 1:
            raise ValueError(f"spectral_stretch must be in [0, 1) (a fraction of the band span), got {spectral_stretch!r}")
        self.zoom = float(zoom)
        if not 0 <= self.zoom <= 4:
            raise ValueError(f"zoom must be in [0, 4] (log2 of the largest scale), got {zoom!r}")
        self._resampled = bool(self.spectral_shift or self.spectral_stretch)  # per sample, from the stored bands
        if self._resampled and self.wavelengths is None:
            raise ValueError("spectral_shift and spectral_stretch need wavelengths= (the band centres they move)")
        if self.zoom and not self.patch_size:
            raise ValueError("zoom needs patch_size (random crops)")
        if self.crop_grid > 1 and (augment or self.relight or self.shade or self._resampled):
            raise ValueError("crop_grid gives fixed evaluation windows: drop augment, relight, shade, spectral_shift "
                             "and spectral_stretch")
        self.cache = len(self.files) if cache is True else int(cache or 0)
        self.cache = max(self.cache, 1) if self.crop_grid > 1 else self.cache  # a file's windows: one read
        self._cache: OrderedDict[Path, tuple] = OrderedDict()
        self.length = len(self.files) * self.crop_grid ** 2 if samples_per_epoch is None else int(samples_per_epoch)
        if self.length < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch!r}")

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """Draw new crops/augmentations: sample i of epoch e is seeded by (seed, e, i)."""
        self.epoch = int(epoch)

    def cube(self, i: int) -> torch.Tensor:
        """(C, H, W) cube of file i: from the LRU cache or loaded, resampled and size-checked."""
        data, src = self._source(i)
        return data if src is None else io.resample_bands(data, src, self.wavelengths)

    def _source(self, i: int) -> tuple[torch.Tensor, list[float] | None]:
        """File i's cube, cached: resampled to ``wavelengths`` (src None) or, with ``spectral_shift`` or
        ``spectral_stretch``, as stored with its wavelengths src (resampled per sample)."""
        path = self.files[i]
        if path in self._cache:
            self._cache.move_to_end(path)
            return self._cache[path]
        need = self.patch_size or self.crop_to

        def large_enough(h: io.ArrayHeader) -> None:  # from the file's header, before its data are read
            if need and (h.shape[-2] < need[0] or h.shape[-1] < need[1]):
                raise DataFileError(path, f"cube of size {h.shape[-2]}×{h.shape[-1]} is smaller than the "
                                          f"{'patch_size' if self.patch_size else 'crop_to'} {need[0]}×{need[1]}")

        cube = io.load_cube(path, key=self.key, layout=self.layout, max_bytes=self.max_bytes, check=large_enough)
        data, src = cube.data, None
        if self.wavelengths is not None:
            src = self.source_wavelengths or cube.wavelengths
            if src is None:
                raise DataFileError(path, "stores no wavelengths: pass source_wavelengths= to resample it")
            try:  # resampled per sample: resampling one pixel checks the file's range now
                resampled = io.resample_bands(data[..., :1, :1] if self._resampled else data, src, self.wavelengths)
            except ValueError as err:
                raise DataFileError(path, str(err)) from None
            data, src = (data, list(src)) if self._resampled else (resampled, None)
        if self.cache:
            self._cache[path] = (data, src)
            if len(self._cache) > self.cache:
                self._cache.popitem(last=False)
        return data, src

    def _patch(self, i: int, size: tuple[int, int] | None, g: torch.Generator, shift: float = 0.0,
               stretch: float = 0.0) -> torch.Tensor:
        """A random (C, h, w) window of file i (or the whole / center-cropped cube), zoomed, augmented, its band
        centres spread by 1 + ``stretch`` about their middle and moved by ``shift`` nm (both limited to the file's
        range)."""
        x, src = self._source(i)
        if size is None:
            x = center_crop(x, self.crop_to) if self.crop_to else x
        else:
            (h, w), (H, W) = size, x.shape[-2:]
            scale = 2 ** (self.zoom * (2 * float(torch.rand((), generator=g)) - 1)) if self.zoom else 1.0
            scale = min(scale, H / h, W / w)  # at most the whole file, the crop's shape kept
            rh, rw = (max(1, round(n * scale)) for n in (h, w))
            top, left = (int(torch.randint(n, (), generator=g)) for n in (H - rh + 1, W - rw + 1))
            x = x[:, top:top + rh, left:left + rw]
            if (rh, rw) != (h, w):
                x = torch.nn.functional.interpolate(x[None], size=(h, w), mode="bilinear", antialias=True,
                                                    align_corners=False)[0]
        if self.augment:
            square = x.shape[-1] == x.shape[-2]
            k = int(torch.randint(4, (), generator=g)) if square else 2 * int(torch.randint(2, (), generator=g))
            x = torch.rot90(x, k, (-2, -1))  # with one flip: uniform over the 8 (or 4 off-square) symmetries
            x = x.flip(-1) if int(torch.randint(2, (), generator=g)) else x
        if src is not None:
            lo, hi = min(self.wavelengths), max(self.wavelengths)
            mid, factor = (lo + hi) / 2, 1 + stretch
            if hi > lo:  # no wider than the file's range
                factor = min(factor, (max(src) - min(src)) / (hi - lo))
            target = [mid + (w - mid) * factor for w in self.wavelengths]
            shift = min(max(shift, min(src) - min(target)), max(src) - max(target))
            x = io.resample_bands(x, src, [w + shift for w in target])
        return x

    def _window(self, f: int, k: int) -> dict:
        """Window k (row-major) of the crop_grid × crop_grid windows of file f."""
        x, (h, w), n = self.cube(f), self.crop_to, self.crop_grid
        if min(x.shape[-2] - h, x.shape[-1] - w) < n - 1:
            raise DataFileError(self.files[f], f"cube of size {x.shape[-2]}×{x.shape[-1]} is too small for "
                                               f"crop_grid={n} distinct {h}×{w} windows per side")
        top, left = ((x.shape[d] - s) * j // (n - 1) for d, s, j in ((-2, h, k // n), (-1, w, k % n)))
        return {"x": x[:, top:top + h, left:left + w].clone(memory_format=torch.contiguous_format),
                "name": f"{self.files[f].stem}_y{top}x{left}"}

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        if self.crop_grid > 1:
            return self._window(*divmod(index, self.crop_grid ** 2))
        g = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch, index))
        shift = self.spectral_shift * (2 * float(torch.rand((), generator=g)) - 1) if self.spectral_shift else 0.0
        stretch = self.spectral_stretch * (2 * float(torch.rand((), generator=g)) - 1) if self.spectral_stretch else 0.0
        if self.mosaic and float(torch.rand((), generator=g)) < self.mosaic:
            (h, w), n = self.patch_size, len(self.files)
            files = torch.randint(n, (4,), generator=g).tolist()
            sizes = [(a, b) for a in (h // 2, h - h // 2) for b in (w // 2, w - w // 2)]
            q = [self._patch(f, s, g, shift, stretch) for f, s in zip(files, sizes)]
            x = torch.cat([torch.cat(q[:2], -1), torch.cat(q[2:], -1)], -2)
            name = "+".join(self.files[f].stem for f in files)
        else:
            f = index % len(self.files)
            x, name = self._patch(f, self.patch_size, g, shift, stretch), self.files[f].stem
        if self.relight and float(torch.rand((), generator=g)) < self.relight:
            x = x * relight_gain(x.shape[0], g)
        if self.shade and float(torch.rand((), generator=g)) < self.shade:
            x = x * shading_gain(*x.shape, g)
        # a copy, never a view: a view would keep the whole (cached) file cube alive
        return {"x": x.clone(memory_format=torch.contiguous_format), "name": name}


def _three(shape: Sequence[int]) -> tuple[int, ...]:
    """A mask shape (H, W) or (C, H, W) as (1, H, W) or (C, H, W)."""
    return (1, *shape) if len(shape) == 2 else tuple(shape)


def _reason(path: Path, err: BaseException) -> str:
    """One line naming the file and the problem: a DataFileError's own message, else `path: Type: message`."""
    text = str(err) if isinstance(err, DataFileError) else f"{path}: {type(err).__name__}: {err}"
    return " ".join(text.split())


def collate(samples: list) -> dict:
    """``default_collate`` of the samples that loaded; samples that failed (``{"name", "error"}``, as
    :class:`MeasurementFiles` with ``skip_invalid`` returns them) go to ``batch["failed"]`` as (name, reason)
    pairs, so a batch can hold good inputs and failed ones (only failed ones: ``{"name": [], "failed": [...]}``)."""
    bad = [isinstance(s, Mapping) and "error" in s for s in samples]
    if not any(bad):
        return default_collate(samples)
    good = [s for s, b in zip(samples, bad) if not b]
    batch = default_collate(good) if good else {"name": []}
    batch["failed"] = [(s["name"], s["error"]) for s, b in zip(samples, bad) if b]
    return batch


class MeasurementFiles(Dataset):
    """Real snapshot measurements with their coded aperture, for reconstruction.

    Args:
        entries: measurement files, folders or globs (see :func:`resolve_paths`), and/or
            dicts {"y": path, "mask": path (optional), "gt": path (optional), "name": str (optional)}.
        mask: the mask shared by all entries (path, tensor or array; (H, W) or (C, H, W));
            an entry's own "mask" wins.
        gt: optional ground-truth cubes (files/folders/globs) matched to measurements by
            file stem; every measurement then needs one.
        key, mask_key, gt_key, gt_layout: variable names / layout for ``cassi.io``.
        bands, step, offsets, axis: the operator geometry; each (mask, measurement) pair
            must fit it (``check_mask_fits``: y is H×(W+Δ) along 'w'), else DataFileError
            naming the measurement file.
        skip_invalid: one bad input does not stop the others. Now, every entry's files are
            checked from their headers alone (nothing else is read): those refused (missing,
            corrupt, wrong size for the mask and geometry, a declared array larger than
            ``max_bytes``...) are dropped and listed in ``skipped`` as (path, message). Later,
            an entry whose data fail to load (NaN, corrupt data, out of memory...) gives the
            sample {"name", "error": message} instead of raising (:func:`collate` puts it in
            the batch's "failed" list).
        max_bytes: every file (measurement, mask, ground truth) whose header declares an array
            taking more memory once read is refused before its data are read; None: no bound.

    Sample: {"y": (1, H, W+Δ), "mask": (1, H, W) or (C, H, W), "name": stem or entry name,
    "x": (C, H, W) when ground truth is given}. Files are read per sample, after their headers
    are checked (a mask of an entry's own and the ground truth against the measurement's frame,
    the measurement against the mask and the geometry); a shared mask is loaded once.
    """

    def __init__(self, entries, mask=None, gt=None, key: str | None = None, mask_key: str | None = None,
                 gt_key: str | None = None, gt_layout: str | None = None, bands: int | None = None,
                 step: float | None = 2, offsets: Sequence[float] | None = None, axis: str = "w",
                 skip_invalid: bool = False, max_bytes: int | None = io.MAX_BYTES):
        items = [entries] if isinstance(entries, (str, os.PathLike, Mapping)) else list(entries)
        dicts = [dict(e) for e in items if isinstance(e, Mapping)]
        patterns = [e for e in items if not isinstance(e, Mapping)]
        self.entries = [{"y": Path(d["y"]).resolve(), **{k: d[k] for k in ("mask", "gt", "name") if d.get(k)}}
                        for d in dicts] + [{"y": p} for p in (resolve_paths(patterns) if patterns else [])]
        if not self.entries:
            raise FileNotFoundError(f"no measurements given: {entries!r}")
        if gt is not None:
            by_stem = {p.stem: p for p in resolve_paths(gt)}
            for e in self.entries:
                if "gt" not in e:
                    if e["y"].stem not in by_stem:
                        raise DataFileError(e["y"], f"no ground-truth file with stem {e['y'].stem!r} in {gt!r}")
                    e["gt"] = by_stem[e["y"].stem]
        self.key, self.mask_key, self.gt_key, self.gt_layout = key, mask_key, gt_key, gt_layout
        self.bands, self.axis, self.max_bytes, self.skip_invalid = bands, axis, max_bytes, skip_invalid
        self.dispersion = list(offsets) if offsets is not None else (2 if step is None else step)
        self.mask = None if mask is None else self._mask(mask)
        if bands is None and offsets is None and self.mask is not None and self.mask.shape[0] == 1:
            raise ValueError("a 2-D mask with a dispersion step needs bands= (or offsets=)")
        missing = [str(e["y"]) for e in self.entries if self.mask is None and "mask" not in e]
        if missing:
            raise ValueError(f"no mask for {missing[:3]}: pass mask= or give each entry a 'mask'")
        self.skipped: list[tuple[str, str]] = []
        if skip_invalid:
            good = []
            for e in self.entries:
                try:
                    self._entry(e, read=False)  # the headers only: no data are read here
                    good.append(e)
                except Exception as err:  # noqa: BLE001 - this input's failure, not the dataset's
                    reason = _reason(e["y"], err)
                    log.warning("skipping %s: %s", e["y"], reason)
                    self.skipped.append((str(e["y"]), reason))
            self.entries = good
        self.files = [e["y"] for e in self.entries] + [Path(e["gt"]).resolve() for e in self.entries if "gt" in e]

    def _mask(self, mask, check: Callable[[io.ArrayHeader], None] | None = None) -> torch.Tensor:
        """(1, H, W) or (C, H, W) float32 mask from a path (its header checked by ``check`` and ``max_bytes``
        first), tensor or array."""
        if isinstance(mask, (str, os.PathLike)):
            m = io.load_mask(mask, key=self.mask_key, max_bytes=self.max_bytes, check=check)
        else:
            m = torch.as_tensor(mask, dtype=torch.float32)
        if m.ndim not in (2, 3):
            raise ValueError(f"mask must be (H, W) or (C, H, W), got shape {tuple(m.shape)}")
        return m[None] if m.ndim == 2 else m

    def _fit(self, mask_shape: Sequence[int], meas_shape: Sequence[int], path: Path) -> None:
        """DataFileError naming ``path`` unless a (1, H, W') measurement fits a (1 | C, H, W) mask and the geometry."""
        shape, bands = (mask_shape[-2:], self.bands) if mask_shape[0] == 1 else (mask_shape, None)
        io.check_mask_fits(shape, meas_shape, self.dispersion, self.axis, bands=bands, path=path)

    def _entry(self, e: dict, read: bool = True) -> dict | None:
        """Entry ``e``'s sample. Every file's header is checked before its data are read: a mask file of the
        entry's own against the measurement's frame, the measurement against the mask and the geometry, the
        ground truth against the mask's frame, each against ``max_bytes``. Without ``read``, only those header
        checks run (None)."""
        own, mask_shape = e.get("mask"), None
        mask = self.mask if own is None else None
        if isinstance(own, (str, os.PathLike)):  # a mask file of its own: checked against the measurement's frame
            y = io.read_header(e["y"], "measurement", key=self.key, max_bytes=self.max_bytes)
            fits_y = lambda h: self._fit(_three(h.shape), y.shape, e["y"])  # noqa: E731
            if read:
                mask = self._mask(own, check=fits_y)
            else:
                mask_shape = _three(io.read_header(own, "mask", key=self.mask_key, max_bytes=self.max_bytes,
                                                   check=fits_y).shape)
        elif own is not None:
            mask = self._mask(own)
        mask_shape = tuple(mask.shape) if mask is not None else mask_shape

        def same_frame(h: io.ArrayHeader) -> None:
            if h.shape[-2:] != mask_shape[-2:]:
                raise DataFileError(h.path, f"cube of size {h.shape[-2]}×{h.shape[-1]} does not match the "
                                            f"{mask_shape[-2]}×{mask_shape[-1]} mask")

        y_kw = dict(key=self.key, max_bytes=self.max_bytes, check=lambda h: self._fit(mask_shape, h.shape, e["y"]))
        gt_kw = dict(key=self.gt_key, layout=self.gt_layout, max_bytes=self.max_bytes, check=same_frame)
        if not read:
            io.read_header(e["y"], "measurement", **y_kw)
            if "gt" in e:
                io.read_header(e["gt"], "cube", **gt_kw)
            return None
        out = {"y": io.load_measurement(e["y"], **y_kw).data, "mask": mask, "name": e.get("name", e["y"].stem)}
        if "gt" in e:
            out["x"] = io.load_cube(e["gt"], **gt_kw).data
        return out

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> dict:
        e = self.entries[index]
        if not self.skip_invalid:
            return self._entry(e)
        try:
            return self._entry(e)
        except Exception as err:  # noqa: BLE001 - a MemoryError too: this input's failure, never the run's
            reason = _reason(e["y"], err)
            log.warning("%s failed to load: %s", e["y"], reason)
            return {"name": e.get("name", e["y"].stem), "error": reason}
