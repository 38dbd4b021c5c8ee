"""File formats: one reader and one writer per extension, metadata, atomic writes.

A reader opens a file and yields its named arrays (lazy where the format allows:
HDF5 datasets, memory-mapped .npy and .tif) with the metadata stored beside them.
A writer stores one array under a name plus a JSON-able metadata dict. The rest
of `cassi.io` only calls `read_array` and `write_array`, never a format directly.

Metadata travel as a JSON text (`cassi_meta`: a .mat/.npz variable, an HDF5 root
attribute, the OME-TIFF image Description, or the `<file>.json` sidecar of a
.npy) and, for other tools, as plain variables/attributes named in `META_VARS`
(wavelengths also as OME channel names and EmissionWavelength).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import h5py
import numpy as np
import scipy.io
import tifffile

META_KEY = "cassi_meta"
META_VARS = ("wavelengths", "layout", "bands", "step", "offsets", "axis", "bit_depth")
#: Names (case-insensitive; HDF5: the last path component) under which files keep band centres in nm
#: beside the data, as a variable, a dataset or an attribute.
WAVELENGTH_NAMES = ("wavelengths", "wavelength", "wavelengths_nm", "wavelength_nm", "wl", "wls", "wvl", "wave",
                    "waves", "lambda", "lambdas", "lam", "bands_nm", "band_centers", "band_centres", "centers_nm")
MAT_V5_LIMIT = 2**31 - 2**20  # larger arrays are written as MATLAB v7.3 (HDF5)


class DataFileError(ValueError):
    """A data file is missing, unreadable or holds unusable data; str() names the file and the problem."""

    def __init__(self, path: Any, problem: str | None = None):
        self.path, self.problem = str(path), problem
        super().__init__(self.path if problem is None else f"{self.path}: {problem}")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


class _Lazy:
    """Array stand-in with .shape/.dtype; np.asarray() reads the data."""

    def __init__(self, shape, dtype, load: Callable[[], np.ndarray]):
        self.shape, self.dtype, self._load = tuple(shape), np.dtype(dtype), load

    def __array__(self, dtype=None, copy=None):
        a = self._load()
        return a if dtype is None else a.astype(dtype)


# What a reader yields: named arrays (np.ndarray, h5py.Dataset or _Lazy; strings for MATLAB chars),
# file-level attributes, and per-array attributes.
Contents = tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]


# ----------------------------------------------------------------------------- readers

@contextmanager
def _open_mat(path: Path) -> Iterator[Contents]:
    if h5py.is_hdf5(path):  # MATLAB v7.3: HDF5 with column-major (transposed) arrays
        with h5py.File(path, "r") as f:
            arrays: dict[str, Any] = {}

            def visit(name, obj):
                if not isinstance(obj, h5py.Dataset) or name.startswith("#") or "MATLAB_empty" in obj.attrs:
                    return
                cls = obj.attrs.get("MATLAB_class", b"")
                if (cls.decode() if isinstance(cls, bytes) else str(cls)) == "char":
                    arrays[name] = "".join(map(chr, np.asarray(obj).ravel()))
                else:
                    arrays[name] = _Lazy(obj.shape[::-1], obj.dtype, lambda o=obj: np.asarray(o).T)

            f.visititems(visit)
            yield arrays, {}, {}
    else:
        mat = scipy.io.loadmat(path, squeeze_me=False, chars_as_strings=True)
        yield {k: v for k, v in mat.items() if not k.startswith("__")}, {}, {}


@contextmanager
def _open_h5(path: Path) -> Iterator[Contents]:
    with h5py.File(path, "r") as f:
        arrays: dict[str, Any] = {}
        f.visititems(lambda n, o: arrays.update({n: o}) if isinstance(o, h5py.Dataset) else None)
        yield arrays, dict(f.attrs), {n: dict(d.attrs) for n, d in arrays.items()}


@contextmanager
def _open_npz(path: Path) -> Iterator[Contents]:
    with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
        yield {k: z[k] for k in z.files}, {}, {}


@contextmanager
def _open_npy(path: Path) -> Iterator[Contents]:
    sidecar = sidecar_path(path)
    attrs = {META_KEY: sidecar.read_text()} if sidecar.is_file() else {}
    yield {"array": np.load(path, mmap_mode="r", allow_pickle=False)}, attrs, {}


class _LogErrors(logging.Handler):
    """Collects ERROR records: tifffile logs (rather than raises) invalid offsets in truncated files."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def check(self):
        if self.messages:
            raise tifffile.TiffFileError("; ".join(self.messages))


@contextmanager
def _open_tif(path: Path) -> Iterator[Contents]:
    log, errors = logging.getLogger("tifffile"), _LogErrors()
    log.addHandler(errors)
    try:
        with tifffile.TiffFile(path) as tif:
            series = tif.series[0]
            errors.check()
            yield _tif_contents(path, tif, series)
            errors.check()  # the caller has read the data meanwhile
    finally:
        log.removeHandler(errors)


def _tif_contents(path: Path, tif: tifffile.TiffFile, series) -> Contents:
    attrs: dict[str, Any] = {}
    if tif.is_ome:
        image = tifffile.xml2dict(tif.ome_metadata)["OME"]["Image"]
        image = image[0] if isinstance(image, list) else image
        try:
            desc = json.loads(image.get("Description", ""))
            if isinstance(desc, dict) and desc.get("format") == "cassi":
                attrs[META_KEY] = image["Description"]
        except (TypeError, ValueError):
            pass
        channels = image.get("Pixels", {}).get("Channel", [])
        channels = channels if isinstance(channels, list) else [channels]
        wl = [c.get("EmissionWavelength") for c in channels]
        if wl and all(isinstance(w, (int, float)) for w in wl):
            attrs["wavelengths"] = [float(w) for w in wl]
        elif wl:  # channel names like '453.3 nm'
            names = [re.fullmatch(r"\s*([\d.]+)\s*nm\s*", str(c.get("Name", ""))) for c in channels]
            if all(names):
                attrs["wavelengths"] = [float(m.group(1)) for m in names]
    axes = series.axes
    layout = {"YXS": "hwc"}.get(axes[-3:]) or ("chw" if len(axes) == 3 and axes.endswith("YX") else None)

    def load():
        try:  # memory-mapped when the image data are contiguous and uncompressed
            return tifffile.memmap(path, mode="r")
        except ValueError:
            return series.asarray()

    return {"image": _Lazy(series.shape, series.dtype, load)}, attrs, {"image": {"layout": layout} if layout else {}}


# ----------------------------------------------------------------------------- writers

def _plain_vars(meta: dict) -> dict:
    """The META_VARS entries of `meta` simple enough to be plain variables/attributes."""
    def simple(v):
        number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
        return isinstance(v, str) or number(v) or (isinstance(v, list) and v and all(map(number, v)))
    return {k: meta[k] for k in META_VARS if k in meta and simple(meta[k])}


def _write_mat(path: Path, array: np.ndarray, key: str, meta: dict) -> None:
    variables = {key: array, **_plain_vars(meta), META_KEY: json.dumps(meta)}
    if array.nbytes < MAT_V5_LIMIT:
        scipy.io.savemat(path, variables, oned_as="row")
        return
    _write_mat73(path, variables)


def _write_mat73(path: Path, variables: dict) -> None:
    """Write MATLAB v7.3: HDF5 after a 512-byte MATLAB header, arrays transposed, MATLAB_class attributes."""
    classes = {"float64": "double", "float32": "single", "bool": "logical"}
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, value in variables.items():
            if isinstance(value, str):
                ds = f.create_dataset(name, data=np.array([ord(c) for c in value], np.uint16)[:, None])
                ds.attrs["MATLAB_int_decode"] = np.int32(2)
                cls = "char"
            else:
                a = np.atleast_2d(np.asarray(value))
                cls = classes.get(a.dtype.name, a.dtype.name)  # int8 ... uint64 keep their names
                ds = f.create_dataset(name, data=(a.astype(np.uint8) if cls == "logical" else a).T)
            ds.attrs["MATLAB_class"] = np.bytes_(cls)
    header = (f"MATLAB 7.3 MAT-file, Platform: {sys.platform}, Created on: {time.ctime()} "
              "HDF5 schema 1.00 .").encode().ljust(116) + b"\0" * 8 + b"\x00\x02IM"
    with open(path, "r+b") as fh:
        fh.write(header.ljust(512, b"\0"))


def _write_h5(path: Path, array: np.ndarray, key: str, meta: dict) -> None:
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(key, data=array)
        ds.attrs.update(_plain_vars(meta))
        f.attrs[META_KEY] = json.dumps(meta)


def _write_npz(path: Path, array: np.ndarray, key: str, meta: dict) -> None:
    extra = {k: np.asarray(v) for k, v in _plain_vars(meta).items()}
    with open(path, "wb") as fh:
        np.savez(fh, **{**extra, key: array, META_KEY: np.asarray(json.dumps(meta))})


def _write_npy(path: Path, array: np.ndarray, key: str, meta: dict) -> None:
    with open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)


def _write_tif(path: Path, array: np.ndarray, key: str, meta: dict) -> None:
    if array.ndim == 3 and meta.get("layout", "chw") != "chw":
        raise ValueError(f"{path}: OME-TIFF stores cubes as (C,H,W); use layout='chw'")
    md: dict[str, Any] = {"axes": "CYX"[-array.ndim:], "Name": key, "Description": json.dumps(meta)}
    wl = meta.get("wavelengths")
    if array.ndim == 3 and wl:  # per-channel lists, read by Fiji (Bio-Formats), napari, tifffile
        md["Channel"] = {"Name": [f"{w:g} nm" for w in wl], "EmissionWavelength": [float(w) for w in wl],
                         "EmissionWavelengthUnit": ["nm"] * len(wl)}
    tifffile.imwrite(path, array, ome=True, photometric="minisblack", metadata=md)


@dataclass(frozen=True)
class Format:
    """A file format: its reader (a context manager yielding Contents) and writer."""
    name: str
    open: Callable[[Path], ContextManager[Contents]]
    write: Callable[[Path, np.ndarray, str, dict], None]
    single: bool = False   # holds one unnamed array: `key` is ignored
    sidecar: bool = False  # metadata go to `<file>.json`


_MAT = Format("MATLAB", _open_mat, _write_mat)
_H5 = Format("HDF5", _open_h5, _write_h5)
_TIF = Format("TIFF", _open_tif, _write_tif, single=True)
FORMATS: dict[str, Format] = {
    ".mat": _MAT, ".h5": _H5, ".hdf5": _H5, ".tif": _TIF, ".tiff": _TIF,
    ".npy": Format("NumPy .npy", _open_npy, _write_npy, single=True, sidecar=True),
    ".npz": Format("NumPy .npz", _open_npz, _write_npz),
}


def format_of(path: Path) -> Format:
    """The Format for `path`'s extension; DataFileError for an unknown one."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise DataFileError(path, f"unknown file extension {Path(path).suffix!r} "
                                  f"(supported: {', '.join(sorted(FORMATS))})")
    return fmt


def sidecar_path(path: Path) -> Path:
    """`data.npy` -> `data.npy.json`."""
    return Path(path).with_name(Path(path).name + ".json")


# ----------------------------------------------------------------------------- read / write one array

def _plain(value: Any) -> Any:
    """A stored value as a Python str, number or list."""
    a = np.asarray(value)
    if a.dtype.kind in "US":
        return "".join(a.ravel().astype(str))
    a = a.squeeze()
    return a.item() if a.ndim == 0 else a.tolist()


def _is_real(a: Any) -> bool:
    """An array of booleans, integers or floats (not strings, objects, complex)."""
    return getattr(getattr(a, "dtype", None), "kind", "?") in tuple("biuf")


def _is_candidate(a: Any) -> bool:
    """A real numeric array with at least two non-singleton dimensions."""
    return _is_real(a) and sum(s > 1 for s in a.shape) >= 2


def squeezed_shape(shape: tuple, ndims: tuple[int, ...]) -> tuple:
    """`shape` without leading (then trailing) singleton dims while it has more than max(ndims) dims."""
    shape = tuple(shape)
    while len(shape) > max(ndims) and shape[0] == 1:
        shape = shape[1:]
    while len(shape) > max(ndims) and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def _stored_wavelengths(path: Path, sources: list[dict]) -> list[float] | None:
    """The vector stored under one of WAVELENGTH_NAMES in `sources` (attributes, variables), if any;
    DataFileError when two such vectors differ."""
    found: dict[str, list[float]] = {}
    for src in sources:
        for k, v in src.items():
            if str(k).rsplit("/", 1)[-1].lower() not in WAVELENGTH_NAMES:
                continue
            if sum(n > 1 for n in getattr(v, "shape", np.shape(v))) > 1:
                continue  # not a vector (and not read)
            a = np.asarray(v)
            if _is_real(a):
                found.setdefault(str(k), np.atleast_1d(a.astype(np.float64).squeeze()).tolist())
    values = list(found.values())
    if any(v != values[0] for v in values[1:]):
        raise DataFileError(path, f"holds different wavelength vectors ({', '.join(found)}); "
                                  f"store one or pass the cube's wavelengths yourself")
    return values[0] if values else None


def read_array(path: str | os.PathLike, key: str | None = None, names: tuple[str, ...] = (),
               what: str = "array", ndims: tuple[int, ...] | None = None) -> tuple[np.ndarray, str, dict]:
    """Read one array (file orientation) and its metadata from `path`.

    The array is `key` when given, else the file's only candidate (numeric, >= 2
    non-singleton dims), else the one named in the file's metadata, else the only
    candidate that can be the `what` (`ndims`: its number of dims once leading and
    trailing singletons are dropped, e.g. (3,) for a cube beside 2-D label images,
    masks or spectra tables), else the one such candidate whose name is in `names`
    (case-insensitive). A band-centre vector stored under one of WAVELENGTH_NAMES
    becomes meta["wavelengths"]. Returns (array, name, meta); any failure raises
    DataFileError naming the file.
    """
    path = Path(path)
    fmt = format_of(path)
    if not path.is_file():
        raise DataFileError(path, "file not found" if not path.exists() else "not a regular file")
    try:
        with fmt.open(path) as (arrays, attrs, array_attrs):
            stored = {**{k: v for k, v in arrays.items() if k in META_VARS + (META_KEY,)}, **attrs}
            meta = {k: _plain(stored[k]) for k in META_VARS if k in stored}
            saved = json.loads(_plain(stored[META_KEY])) if META_KEY in stored else {}
            candidates = [n for n, a in arrays.items() if _is_candidate(a)]
            if fmt.single:
                key = None
            if key is not None:
                if key not in arrays:
                    raise DataFileError(path, f"no variable {key!r} (variables: {', '.join(sorted(arrays)) or 'none'})")
                if not _is_real(arrays[key]):
                    raise DataFileError(path, f"variable {key!r} is not a real numeric array")
                name = key
            elif len(candidates) == 1:
                name = candidates[0]
            elif saved.get("key") in candidates:
                name = saved["key"]
            else:
                fits = [n for n in candidates if ndims is None or len(squeezed_shape(arrays[n].shape, ndims)) in ndims]
                known = [n for n in fits if n.lower() in {k.lower() for k in names}]
                if len(fits) != 1 and len(known) != 1:
                    if not candidates:
                        raise DataFileError(path, f"no {what} found: no numeric array with at least 2 dimensions")
                    listed = ", ".join(f"{n} {tuple(arrays[n].shape)}" for n in (fits or candidates))
                    raise DataFileError(path, f"several candidate arrays ({listed}); pass key= to choose the {what}")
                name = fits[0] if len(fits) == 1 else known[0]
            meta.update({k: _plain(v) for k, v in array_attrs.get(name, {}).items() if k in META_VARS})
            if "wavelengths" not in meta:
                wavelengths = _stored_wavelengths(path, [array_attrs.get(name, {}), attrs, arrays])
                if wavelengths is not None:
                    meta["wavelengths"] = wavelengths
            array = np.asarray(arrays[name])
            if fmt.single or saved.get("key") in (None, name):
                meta.update(saved)
                name = saved.get("key", name) if fmt.single else name
    except (DataFileError, MemoryError):
        raise
    except Exception as e:
        raise DataFileError(path, f"cannot read {fmt.name} file, truncated or corrupt? "
                                  f"({type(e).__name__}: {e})") from e
    meta.pop("format", None)
    meta.pop("key", None)
    return array, name, meta


def write_array(path: str | os.PathLike, array: np.ndarray, key: str, meta: dict,
                overwrite: bool = False) -> Path:
    """Write `array` under `key` with JSON-able `meta` to `path`, atomically.

    Each file is written to a temporary name in the target directory, then
    renamed over the target (os.replace): a failure leaves neither a partial
    file nor a temporary one. An existing `path` raises FileExistsError unless
    `overwrite=True`.
    """
    path = Path(path)
    fmt = format_of(path)
    if not key.isidentifier() or key in META_VARS + (META_KEY,):
        raise ValueError(f"{path}: invalid variable name {key!r}")
    def to_json(o):
        if hasattr(o, "tolist"):  # numpy/torch scalars and arrays
            return o.tolist()
        if isinstance(o, os.PathLike):
            return os.fspath(o)
        raise TypeError(f"{type(o).__name__} is not JSON-serialisable")
    try:
        meta = json.loads(json.dumps({"format": "cassi", **meta, "key": key}, default=to_json))
    except (TypeError, ValueError) as e:
        raise DataFileError(path, f"metadata cannot be stored as JSON ({e})") from e
    if path.exists() and not overwrite:
        raise FileExistsError(errno.EEXIST, "file exists; pass overwrite=True to replace it", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = [(path, lambda tmp: fmt.write(tmp, array, key, meta))]
    if fmt.sidecar:  # the sidecar goes first: the data file appearing marks a complete write
        jobs.insert(0, (sidecar_path(path), lambda tmp: tmp.write_text(json.dumps(meta, indent=1))))
    temps: list[Path] = []
    try:
        for final, write in jobs:
            temps.append(final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp{final.suffix}"))
            write(temps[-1])
        for (final, _), tmp in zip(jobs, temps):
            os.replace(tmp, final)
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str | bytes | Callable[[Path], object]) -> Path:
    """Write ``text`` (or bytes, e.g. a PNG; or call ``text(tmp)``, a function writing the file it is given,
    e.g. ``lambda tmp: torch.save(obj, tmp)``) to ``path`` via a temporary file beside it and ``os.replace``:
    readers see the old file or the whole new one; a failure leaves no temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        if callable(text):
            text(tmp)
        else:
            tmp.write_bytes(text) if isinstance(text, bytes) else tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
