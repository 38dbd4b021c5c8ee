"""Cubes, masks and measurements: load with validation, save atomically with metadata.

Rules shared by every loader:
- Which array: `key=` wins; else the file's only numeric array with >= 2 non-singleton
  dims; else the one its cassi metadata names; else the only one that can be what is
  loaded (a cube: 3-D, beside 2-D label images, masks or spectra tables); else the one
  of those with a usual name (CUBE_KEYS, MASK_KEYS, MEAS_KEYS). Otherwise DataFileError
  listing the candidates and asking for `key=`.
- Wavelengths: stored metadata, or a vector stored beside the data under a usual name
  (`cassi.io.formats.WAVELENGTH_NAMES`: wavelength(s), wl, lambda, bands_nm, ...), travel
  with a cube as Cube.wavelengths.
- Layout: a 3-D array on disk is H×W×C ('hwc', MATLAB habit) or C×H×W ('chw').
  `layout=` wins; else the file's metadata (written by the savers, OME-TIFF axes);
  else the stored wavelength vector, when its length matches the first or the last
  axis but not both (a 20×20×224 crop with 224 wavelengths -> hwc); else the band
  axis is the first or last one when it is at most half of both spatial sizes
  (256×256×28 -> hwc, 31×150×150 -> chw); anything else raises DataFileError naming
  the possible readings and asking for `layout=`.
- Values: 8- and 16-bit integers, signed or unsigned, are divided by `max_value`
  (default 2**bit_depth − 1 when the file stores `bit_depth`, else the dtype's positive
  maximum: 255 uint8, 65535 uint16, 127 int8, 32767 int16); wider integers (32/64-bit)
  have no implied full scale and need `max_value=` or a stored `bit_depth`; a mask
  holding only 0/1 integers (MATLAB logical) is kept as is; float data are only cast
  unless `max_value` is given. Results must be finite and non-negative: negative values
  (e.g. int16 radiance below the dark level) raise unless `clip_negative=True` clamps
  them to 0.
- Sizes: every loader learns the array's shape and dtype from the file's header and checks
  them before reading a byte of data: the number of dims, the layout, the memory the array
  takes once read (at most `max_bytes`, default `MAX_BYTES` = 4 GiB; None: no bound) and
  whatever the caller's `check` demands of the header (`ArrayHeader`), e.g. a measurement
  that fits the mask and geometry (`check_mask_fits`). `read_header` does those checks
  alone. A refused file, or one that runs out of memory while read, raises DataFileError
  naming the file, the declared shape and the reason.
- Savers write the data in their dtype, in layout 'hwc' for .mat and 'chw' elsewhere
  (OME-TIFF only 'chw'), refuse to overwrite unless `overwrite=True`, and store
  wavelengths and geometry (`bands`, `step` or `offsets`, `axis`) with the data.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from cassi.geometry import Geometry
from cassi.io.formats import MAX_BYTES, DataFileError, read_array, size_text, squeezed_shape, write_array

CUBE_KEYS = ("cube", "img", "img_expand", "data_slice", "Omsi", "HSI", "truth", "data", "rad", "gt")
MASK_KEYS = ("mask", "mask3d", "mask_3d", "mask_3d_shift", "Phi")
MEAS_KEYS = ("meas", "meas_real", "measurement", "meas_sim", "y")
_LOAD_ONLY = ("source", "key", "layout")  # meta entries describing a loaded file, not stored back

PathLike = str | os.PathLike


@dataclass
class Cube:
    """A spectral cube: `data` (C,H,W) float, optional `wavelengths` (nm, C of them), `meta` (geometry, source)."""
    data: torch.Tensor
    wavelengths: list[float] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.data.ndim != 3:
            raise ValueError(f"Cube.data must be (C,H,W), got shape {tuple(self.data.shape)}")
        if self.wavelengths is not None:
            self.wavelengths = [float(w) for w in self.wavelengths]
            if len(self.wavelengths) != self.data.shape[0]:
                raise ValueError(f"{len(self.wavelengths)} wavelengths for {self.data.shape[0]} bands")


@dataclass
class Measurement:
    """A snapshot measurement: `data` (1,H,W') float, `meta` (geometry when stored, source)."""
    data: torch.Tensor
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ArrayHeader:
    """What a file declares about the array a loader reads, learnt from its header without reading the data.

    `shape`: as it will be loaded: a cube (C, H, W), a mask (H, W) or (C, H, W), a measurement (1, H, W');
    `stored_shape`, `dtype`: as stored; `layout`: 'hwc'/'chw' of a 3-D array on disk (else None);
    `nbytes`: the memory it takes once read (elements × the larger of the stored and the loaded item size).
    """
    path: str
    what: str
    name: str
    shape: tuple[int, ...]
    stored_shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    layout: str | None = None
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    def refuse(self, reason: str) -> DataFileError:
        """A DataFileError naming the file, this array's declared shape and `reason`."""
        return DataFileError(self.path, f"{self.what} {self.name!r} declares shape {self.stored_shape} {self.dtype} "
                                        f"({size_text(self.nbytes)} once read): {reason}")


HeaderCheck = Callable[[ArrayHeader], None]

_KINDS = {  # what: (its dims once squeezed, the expected array in words, usual variable names)
    "cube": ((3,), "3-D cube (H,W,C) or (C,H,W)", CUBE_KEYS),
    "mask": ((2, 3), "2-D mask (H,W) or a 3-D one (H,W,C)/(C,H,W)", MASK_KEYS),
    "measurement": ((2,), "2-D measurement (H,W')", MEAS_KEYS),
}


def _header(path: PathLike, what: str, shape: tuple, stored: np.dtype, name: str, meta: dict, layout: str | None,
            dtype: torch.dtype, max_bytes: int | None, check: HeaderCheck | None) -> ArrayHeader:
    """Check the declared `shape` and `stored` dtype of a `what` ('cube', 'mask', 'measurement') before its data
    are read: dims, layout, then the caller's `check`, then `max_bytes`; the ArrayHeader, else DataFileError."""
    ndims, words, _ = _KINDS[what]
    squeezed = squeezed_shape(shape, ndims)
    if len(squeezed) not in ndims:
        raise DataFileError(path, f"expected a {words}, got a {len(shape)}-D array {name!r} of shape {tuple(shape)}")
    lay, loaded = None, squeezed
    if len(squeezed) == 3:
        wavelengths = meta.get("wavelengths") if what == "cube" else None
        wavelengths = None if wavelengths is None else [float(w) for w in np.atleast_1d(wavelengths)]
        lay = _layout(squeezed, layout, meta, path, wavelengths)
        loaded = (squeezed[2], squeezed[0], squeezed[1]) if lay == "hwc" else squeezed
    elif what == "measurement":
        loaded = (1, *squeezed)
    itemsize = max(stored.itemsize, dtype.itemsize)
    nbytes = math.prod(squeezed) * itemsize
    header = ArrayHeader(str(path), what, name, tuple(loaded), tuple(squeezed), stored, nbytes, lay, meta)
    if check is not None:
        check(header)
    if max_bytes is not None and nbytes > max_bytes:
        raise header.refuse(f"more than max_bytes={max_bytes} ({size_text(max_bytes)}); "
                            f"pass max_bytes= (None: no bound) to read it")
    return header


@contextmanager
def _headed(path: PathLike, what: str, key: str | None, layout: str | None, dtype: torch.dtype,
            max_bytes: int | None, check: HeaderCheck | None,
            read: bool = True) -> Iterator[tuple[np.ndarray | None, ArrayHeader]]:
    """Read a `what` after checking its header (`_header`); yields (array in file orientation, squeezed to the
    header's stored shape; None without `read`, header). A MemoryError meanwhile is the file's DataFileError."""
    found: list[ArrayHeader] = []

    def inspect(shape, stored, name, meta):
        found.append(_header(path, what, shape, stored, name, meta, layout, dtype, max_bytes, check))

    ndims, _, names = _KINDS[what]
    try:
        array, _, _ = read_array(path, key, names, what, ndims=ndims, check=inspect, read=read)
        yield (None if array is None else array.reshape(found[0].stored_shape)), found[0]
    except MemoryError:
        declared = "" if not found else (f" {found[0].name!r} of declared shape {found[0].stored_shape} "
                                         f"{found[0].dtype} ({size_text(found[0].nbytes)})")
        raise DataFileError(path, f"not enough memory to load the {what}{declared}") from None


def read_header(path: PathLike, what: str, key: str | None = None, layout: str | None = None,
                dtype: torch.dtype = torch.float32, *, max_bytes: int | None = MAX_BYTES,
                check: HeaderCheck | None = None) -> ArrayHeader:
    """The header of the `what` ('cube', 'mask' or 'measurement') that `load_<what>(path, key, ...)` would load,
    checked as the loader checks it (dims, layout, `check`, `max_bytes`), without reading its data."""
    if what not in _KINDS:
        raise ValueError(f"what must be one of {sorted(_KINDS)}, got {what!r}")
    with _headed(path, what, key, layout, dtype, max_bytes, check, read=False) as (_, header):
        return header


# ----------------------------------------------------------------------------- helpers

def _layout(shape: tuple, layout: str | None, meta: dict, path: PathLike, wavelengths: list | None = None) -> str:
    """'hwc' or 'chw' for a 3-D array of `shape` (see the module docstring)."""
    layout = layout if layout is not None else meta.get("layout")
    if layout is None:
        by_shape = {"hwc"} if 2 * shape[2] <= min(shape[:2]) else set()
        by_shape |= {"chw"} if 2 * shape[0] <= min(shape[1:]) else set()
        by_wl = {lay for lay, axis in (("chw", 0), ("hwc", 2)) if shape[axis] == len(wavelengths or ())}
        readings = by_wl if len(by_wl) == 1 else (by_shape & by_wl if by_wl else by_shape)
        if len(readings) != 1:
            why = (f"its {len(wavelengths)} wavelengths fit both the first and the last axis" if by_wl else
                   "no axis is clearly the band axis")
            raise DataFileError(path, f"cannot tell the band axis of an array of shape {tuple(shape)} ({why}): "
                                      "pass layout='hwc' (H,W,C) or layout='chw' (C,H,W)")
        layout = readings.pop()
    if layout not in ("hwc", "chw"):
        raise ValueError(f"{path}: layout must be 'hwc' or 'chw', got {layout!r}")
    return layout


def _to_tensor(array: np.ndarray, meta: dict, max_value: float | None, dtype: torch.dtype,
               path: PathLike, what: str, clip_negative: bool = False) -> torch.Tensor:
    """Copy to a C-contiguous float tensor, scale integers, check finite and non-negative (or clip)."""
    kind = array.dtype.kind
    if max_value is None and kind in "iu":
        bits = meta.get("bit_depth")
        if not bits and array.dtype.itemsize > 2:
            raise DataFileError(path, f"{what} holds {array.dtype} data, which has no implied full scale: pass "
                                      "max_value= (the raw value that maps to 1.0) or store bit_depth with it")
        max_value = float(2 ** int(bits) - 1) if bits else float(np.iinfo(array.dtype).max)
    work = np.float64 if dtype == torch.float64 else np.float32
    out = np.array(array, dtype=work, order="C")
    if max_value is not None and max_value != 1:
        out /= work(max_value)
    t = torch.from_numpy(out)
    bad = (~torch.isfinite(t)).sum().item()
    if bad:
        raise DataFileError(path, f"{what} contains {bad} NaN/Inf values")
    if clip_negative:
        t.clamp_(min=0)
    elif t.numel() and t.min() < 0:
        raw = f"; raw {array.dtype} minimum {array.min()}" if kind == "i" else ""
        raise DataFileError(path, f"{what} contains negative values (min {t.min().item():.4g}{raw}): "
                                  "pass clip_negative=True to clamp them to 0")
    return t.to(dtype)


def _save(path: PathLike, data: Any, key: str, meta: dict, layout: str | None, overwrite: bool) -> Path:
    """Store a (H,W) or (C,H,W) tensor/array, in `layout` for 3-D data; shared by the savers."""
    data = torch.as_tensor(data).detach().cpu()
    data = data.float() if data.dtype in (torch.float16, torch.bfloat16) else data  # no half in MATLAB/TIFF readers
    array = data.numpy()
    meta = {k: v for k, v in meta.items() if k not in _LOAD_ONLY and v is not None}
    if array.ndim == 3:
        layout = layout or ("hwc" if Path(path).suffix.lower() == ".mat" else "chw")
        if layout not in ("hwc", "chw"):
            raise ValueError(f"{path}: layout must be 'hwc' or 'chw', got {layout!r}")
        array = np.ascontiguousarray(array.transpose(1, 2, 0)) if layout == "hwc" else array
        meta["layout"] = layout
    return write_array(path, array, key, meta, overwrite)


# ----------------------------------------------------------------------------- cubes

def _cube_bands(check: HeaderCheck | None) -> HeaderCheck:
    """The header checks of a cube's band count (stored wavelengths, stored `bands`), then `check`."""
    def bands_then(h: ArrayHeader) -> None:
        bands, wavelengths, stored = h.shape[0], h.meta.get("wavelengths"), h.meta.get("bands", h.shape[0])
        if wavelengths is not None and len(np.atleast_1d(wavelengths)) != bands:
            raise DataFileError(h.path, f"stored wavelengths have {len(np.atleast_1d(wavelengths))} entries "
                                        f"but the cube has {bands} bands")
        if stored != bands:
            raise DataFileError(h.path, f"metadata says {stored} bands but the cube has {bands}")
        if check is not None:
            check(h)
    return bands_then


def load_cube(path: PathLike, key: str | None = None, layout: str | None = None,
              dtype: torch.dtype = torch.float32, *, max_value: float | None = None,
              clip_negative: bool = False, max_bytes: int | None = MAX_BYTES,
              check: HeaderCheck | None = None) -> Cube:
    """Load a spectral cube from .mat (v5, v7.3), .tif/.tiff (OME), .npy, .npz or .h5/.hdf5 as (C,H,W).

    `key`: variable/dataset name (found automatically when unambiguous);
    `layout`: 'hwc'/'chw' override; `max_value`: divisor (default for integer
    data only); `clip_negative`: clamp negative values to 0 instead of raising.
    Before any data are read, the header must declare a cube that takes at most
    `max_bytes` once loaded (None: no bound) and pass `check(ArrayHeader)` (shape (C,H,W)).
    Cube.meta holds the stored geometry plus `source`, `key`, `layout` (on disk), `bands`.
    """
    with _headed(path, "cube", key, layout, dtype, max_bytes, _cube_bands(check)) as (array, h):
        meta = dict(h.meta)
        wavelengths = meta.pop("wavelengths", None)
        wavelengths = None if wavelengths is None else [float(w) for w in np.atleast_1d(wavelengths)]
        chw = array.transpose(2, 0, 1) if h.layout == "hwc" else array
        data = _to_tensor(chw, meta, max_value, dtype, path, "cube", clip_negative)
    meta.setdefault("bands", data.shape[0])
    meta.update(source=str(path), key=h.name, layout=h.layout)
    return Cube(data, wavelengths, meta)


def save_cube(path: PathLike, cube: Cube | torch.Tensor | np.ndarray, wavelengths: Sequence[float] | None = None,
              meta: dict | None = None, *, layout: str | None = None, key: str = "cube",
              overwrite: bool = False) -> Path:
    """Save a (C,H,W) cube atomically with its wavelengths and metadata; the format follows the extension.

    Defaults: layout 'hwc' (H×W×C) for .mat, 'chw' otherwise; variable/dataset
    `key='cube'`. Explicit `wavelengths`/`meta` override those of a Cube.
    Large (>= 2 GiB) arrays in .mat are written as MATLAB v7.3.
    """
    if isinstance(cube, Cube):
        data, wl, stored = cube.data, cube.wavelengths, dict(cube.meta)
    else:
        data, wl, stored = torch.as_tensor(cube), None, {}
    if data.ndim != 3:
        raise ValueError(f"{path}: save_cube expects a (C,H,W) cube, got shape {tuple(data.shape)}")
    wl = [float(w) for w in (wavelengths if wavelengths is not None else wl or [])] or None
    if wl is not None and len(wl) != data.shape[0]:
        raise ValueError(f"{path}: {len(wl)} wavelengths for {data.shape[0]} bands")
    stored.update(meta or {})
    stored.update(bands=int(data.shape[0]), wavelengths=wl)
    return _save(path, data, key, stored, layout, overwrite)


# ----------------------------------------------------------------------------- masks

def load_mask(path: PathLike, key: str | None = None, layout: str | None = None,
              dtype: torch.dtype = torch.float32, *, max_bytes: int | None = MAX_BYTES,
              check: HeaderCheck | None = None) -> torch.Tensor:
    """Load a coded aperture as (H,W) or (C,H,W); checks finite, non-negative, not all zeros.

    Before any data are read, the header must declare a mask that takes at most `max_bytes` once loaded
    (None: no bound) and pass `check(ArrayHeader)` (shape (H,W) or (C,H,W)), e.g. that it fits the frame.
    """
    with _headed(path, "mask", key, layout, dtype, max_bytes, check) as (array, h):
        if h.layout == "hwc":
            array = array.transpose(2, 0, 1)
        binary = array.dtype.kind in "biu" and array.size and array.max() <= 1
        mask = _to_tensor(array, h.meta, 1 if binary else None, dtype, path, "mask")
    if not mask.any():
        raise DataFileError(path, "mask is all zeros")
    return mask


def save_mask(path: PathLike, mask: torch.Tensor | np.ndarray, meta: dict | None = None, *,
              layout: str | None = None, key: str = "mask", overwrite: bool = False) -> Path:
    """Save a (H,W) or (C,H,W) mask atomically (3-D: layout as in save_cube)."""
    if torch.as_tensor(mask).ndim not in (2, 3):
        raise ValueError(f"{path}: save_mask expects (H,W) or (C,H,W), got shape {tuple(mask.shape)}")
    return _save(path, mask, key, dict(meta or {}), layout, overwrite)


# ----------------------------------------------------------------------------- measurements

def load_measurement(path: PathLike, key: str | None = None, dtype: torch.dtype = torch.float32,
                     *, max_value: float | None = None, clip_negative: bool = False,
                     max_bytes: int | None = MAX_BYTES, check: HeaderCheck | None = None) -> Measurement:
    """Load a snapshot measurement as (1,H,W'); stored geometry (bands, step/offsets, axis) goes to meta.

    `max_value` and `clip_negative` as in load_cube. Before any data are read, the header must declare a
    measurement that takes at most `max_bytes` once loaded (None: no bound) and pass `check(ArrayHeader)`
    (shape (1,H,W')), e.g. ``lambda h: check_mask_fits(mask.shape, h.shape, step, bands=28, path=h.path)``.
    """
    with _headed(path, "measurement", key, None, dtype, max_bytes, check) as (array, h):
        meta = dict(h.meta)
        data = _to_tensor(array, meta, max_value, dtype, path, "measurement", clip_negative)[None]
    meta.update(source=str(path), key=h.name)
    return Measurement(data, meta)


def save_measurement(path: PathLike, measurement: Measurement | torch.Tensor | np.ndarray,
                     meta: dict | None = None, *, key: str = "meas", overwrite: bool = False) -> Path:
    """Save a (1,H,W') (or (H,W'), (1,1,H,W')) measurement atomically as a 2-D (H,W') array with its meta."""
    if isinstance(measurement, Measurement):
        data, stored = measurement.data, dict(measurement.meta)
    else:
        data, stored = torch.as_tensor(measurement), {}
    while data.ndim > 2 and data.shape[0] == 1:
        data = data[0]
    if data.ndim != 2:
        raise ValueError(f"{path}: save_measurement expects (1,H,W'), got shape {tuple(data.shape)}")
    stored.update(meta or {})
    return _save(path, data, key, stored, None, overwrite)


def check_mask_fits(mask_shape: Sequence[int], meas_shape: Sequence[int], dispersion: float | Sequence[float],
                    axis: str = "w", *, bands: int | None = None, path: PathLike | None = None) -> tuple[int, int]:
    """Check that a measurement (…,H,W') fits a mask (…,H,W) dispersed by `dispersion`; return (H, W').

    `dispersion`: a step S > 0 (offsets c·S for c < bands; bands from a (C,H,W) mask or `bands=`) or per-band
    offsets d_c. The measurement must be the operator's: H × (W + Δ) along 'w', (H + Δ) × W along 'h', with
    Δ = ceil(max d − min d) (:class:`cassi.geometry.Geometry`). Raises DataFileError (naming `path`, default
    'measurement') on mismatch, ValueError for a dispersion no operator takes.
    """
    mask_shape, meas_shape = tuple(mask_shape), tuple(meas_shape)
    if isinstance(dispersion, (int, float)):
        bands = bands or (mask_shape[-3] if len(mask_shape) >= 3 else None)
        if bands is None:
            raise ValueError("a dispersion step needs the band count: pass bands= or a (C,H,W) mask shape")
        geometry = Geometry.of(bands, step=dispersion, axis=axis)
    else:
        geometry = Geometry.of(offsets=dispersion, axis=axis)
    if len(mask_shape) >= 3 and mask_shape[-3] != geometry.bands:
        raise DataFileError(path or "mask", f"mask has {mask_shape[-3]} bands but {geometry.bands} offsets are given")
    expected = geometry.measurement_shape(mask_shape)
    if tuple(meas_shape[-2:]) != expected:
        (h, w), delta = mask_shape[-2:], geometry.delta
        raise DataFileError(path or "measurement",
                            f"measurement of size {meas_shape[-2]}×{meas_shape[-1]} does not fit a {h}×{w} mask "
                            f"with {geometry.bands} bands dispersed by {delta} px along {axis!r}: "
                            f"expected {expected[0]}×{expected[1]}{_what_fits((h, w), meas_shape[-2:], geometry)}")
    return expected


def _what_fits(mask_hw: tuple[int, int], meas_hw: Sequence[int], geometry: Geometry) -> str:
    """'; it fits ...' naming the dispersion axis, step (same bands) or band count (same step) that would fit
    a measurement of size `meas_hw`, or '' when none does."""
    (h, w), (mh, mw), offsets = mask_hw, tuple(meas_hw), geometry.offsets
    fits = []
    for ax, same, extra in (("w", mh == h, mw - w), ("h", mw == w, mh - h)):
        if not same or extra < 0:
            continue
        if ax != geometry.axis:
            if extra == geometry.delta:
                fits.append(f"axis='{ax}'")
            continue
        bands = len(offsets)
        step = extra / (bands - 1) if bands > 1 else None
        if step and Geometry.of(bands, step).delta == extra:
            fits.append(f"step={step:.6g} with {bands} bands")
        uniform = [offsets[c] - offsets[c - 1] for c in range(1, bands)]
        if uniform and max(uniform) == min(uniform) and uniform[0] > 0:
            n = extra / uniform[0] + 1
            if n == int(n) and n >= 1 and int(n) != bands:
                fits.append(f"bands={int(n)} with step {uniform[0]:g}")
    return f"; it would fit {' or '.join(fits)}" if fits else ""
