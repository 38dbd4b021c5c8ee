"""File formats: one reader and one writer per extension, metadata, atomic writes.

A reader opens a file and yields its named arrays with the metadata stored beside them.
Arrays are lazy in every format: their shape and dtype come from the file's header
(HDF5 and MATLAB v7.3 dataspaces, `scipy.io.whosmat` for MATLAB v5, the .npy header
of a .npy or of each .npz member, the TIFF series), and `read_array` lets its caller
refuse a file from them before a byte of its data is read (a hostile or corrupt
file declaring a 160 GB array costs nothing). Only small variables and attributes
(at most `META_MAX_BYTES` declared) are read when the file is opened, for metadata.
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
import math
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
#: Variables and attributes declaring at most this many bytes are read with the file's metadata; larger ones are
#: read only when chosen as the array (and never as metadata).
META_MAX_BYTES = 2**20
#: The default bound on the memory an array takes once read (`cassi.io` loaders' `max_bytes`): 4 GiB.
MAX_BYTES = 4 * 2**30


class DataFileError(ValueError):
    """A data file is missing, unreadable or holds unusable data; str() names the file and the problem."""

    def __init__(self, path: Any, problem: str | None = None):
        self.path, self.problem = str(path), problem
        super().__init__(self.path if problem is None else f"{self.path}: {problem}")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


class _Lazy:
    """Array stand-in with .shape/.dtype (as the file's header declares them); np.asarray() reads the data."""

    def __init__(self, shape, dtype, load: Callable[[], np.ndarray]):
        self.shape, self.dtype, self._load = tuple(int(n) for n in shape), np.dtype(dtype), load

    def __array__(self, dtype=None, copy=None):
        a = self._load()
        return a if dtype is None else a.astype(dtype)


# What a reader yields: named arrays (np.ndarray, h5py.Dataset or _Lazy; strings for MATLAB chars),
# file-level attributes, and per-array attributes.
Contents = tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]


# ----------------------------------------------------------------------------- readers

def declared_nbytes(shape: tuple, dtype: Any) -> int:
    """Bytes of an array of `shape` and `dtype` (Python ints: no overflow for hostile shapes)."""
    return math.prod(int(n) for n in shape) * np.dtype(dtype).itemsize


def _small(value: Any) -> bool:
    """Whether a stored value declares at most META_MAX_BYTES (values already in memory always are)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(value, np.ndarray) or shape is None or dtype is None:
        return True
    return declared_nbytes(shape, dtype) <= META_MAX_BYTES


def _h5_attrs(obj) -> dict[str, Any]:
    """The HDF5 attributes of `obj`, except those declaring more than META_MAX_BYTES (left unread)."""
    out = {}
    for name in obj.attrs:
        aid = obj.attrs.get_id(name)
        if aid.shape is None or declared_nbytes(aid.shape, aid.dtype) <= META_MAX_BYTES:
            out[name] = obj.attrs[name]
    return out


#: MATLAB classes (scipy.io.whosmat) -> the dtype they declare; others (cell, struct, sparse, ...) are not arrays.
_MAT_CLASSES = {"double": "f8", "single": "f4", "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2",
                "int32": "i4", "uint32": "u4", "int64": "i8", "uint64": "u8", "logical": "u1", "char": "U1"}


def _loadmat(path: Path, names: list[str]) -> dict[str, Any]:
    mat = scipy.io.loadmat(path, variable_names=names, squeeze_me=False, chars_as_strings=True)
    missing = [n for n in names if n not in mat]
    if missing:
        raise ValueError(f"variables {missing} listed in the file's headers cannot be read")
    return mat


@contextmanager
def _open_mat(path: Path) -> Iterator[Contents]:
    if h5py.is_hdf5(path):  # MATLAB v7.3: HDF5 with column-major (transposed) arrays
        with h5py.File(path, "r") as f:
            arrays: dict[str, Any] = {}

            def visit(name, obj):
                if (not isinstance(obj, h5py.Dataset) or name.startswith("#") or obj.shape is None
                        or "MATLAB_empty" in obj.attrs):
                    return
                cls = obj.attrs.get("MATLAB_class", b"")
                if (cls.decode() if isinstance(cls, bytes) else str(cls)) == "char":
                    text = lambda o=obj: np.array("".join(map(chr, np.asarray(o).ravel())))
                    arrays[name] = str(text()) if _small(obj) else _Lazy(obj.shape[::-1], "U1", text)
                else:
                    arrays[name] = _Lazy(obj.shape[::-1], obj.dtype, lambda o=obj: np.asarray(o).T)

            f.visititems(visit)
            yield arrays, {}, {}
    else:  # v5: the variables' headers (name, shape, class) first; only small variables are read now
        arrays = {name: _Lazy(shape, _MAT_CLASSES.get(cls, "O"), lambda n=name: _loadmat(path, [n])[n])
                  for name, shape, cls in scipy.io.whosmat(path) if not name.startswith("__")}
        small = [n for n, a in arrays.items() if a.dtype.kind != "O" and _small(a)]
        if small:
            arrays.update((n, v) for n, v in _loadmat(path, small).items() if n in arrays)
        yield arrays, {}, {}


@contextmanager
def _open_h5(path: Path) -> Iterator[Contents]:
    with h5py.File(path, "r") as f:
        arrays: dict[str, Any] = {}
        f.visititems(lambda n, o: arrays.update({n: o}) if isinstance(o, h5py.Dataset) and o.shape is not None
                     else None)
        yield arrays, _h5_attrs(f), {n: _h5_attrs(d) for n, d in arrays.items()}


def _npy_header(fh) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from the header of the .npy stream `fh`, which is left at the start of the data."""
    version = np.lib.format.read_magic(fh)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(fh)
    return tuple(shape), dtype


@contextmanager
def _open_npz(path: Path) -> Iterator[Contents]:
    with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
        arrays: dict[str, Any] = {}
        members = set(z.zip.namelist())
        for k in z.files:
            if k + ".npy" in members:
                with z.zip.open(k + ".npy") as member:
                    shape, dtype = _npy_header(member)
            else:  # not a .npy member: bytes, never an array
                shape, dtype = (), np.dtype("O")
            arrays[k] = _Lazy(shape, dtype, lambda k=k: z[k])
            if dtype.kind != "O" and _small(arrays[k]):
                arrays[k] = z[k]
        yield arrays, {}, {}


@contextmanager
def _open_npy(path: Path) -> Iterator[Contents]:
    sidecar = sidecar_path(path)
    attrs = {META_KEY: sidecar.read_text()} if sidecar.is_file() else {}
    with open(path, "rb") as fh:
        shape, dtype = _npy_header(fh)
    yield {"array": _Lazy(shape, dtype, lambda: np.load(path, mmap_mode="r", allow_pickle=False))}, attrs, {}


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
            if sum(n > 1 for n in getattr(v, "shape", np.shape(v))) > 1 or not _small(v):
                continue  # not a vector (and not read)
            a = np.asarray(v)
            if _is_real(a):
                found.setdefault(str(k), np.atleast_1d(a.astype(np.float64).squeeze()).tolist())
    values = list(found.values())
    if any(v != values[0] for v in values[1:]):
        raise DataFileError(path, f"holds different wavelength vectors ({', '.join(found)}); "
                                  f"store one or pass the cube's wavelengths yourself")
    return values[0] if values else None


def size_text(nbytes: int) -> str:
    """A byte count for people: '149 GiB', '3.5 MiB', '512 B'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def read_array(path: str | os.PathLike, key: str | None = None, names: tuple[str, ...] = (),
               what: str = "array", ndims: tuple[int, ...] | None = None,
               check: Callable[[tuple[int, ...], np.dtype, str, dict], None] | None = None,
               read: bool = True) -> tuple[np.ndarray | None, str, dict]:
    """Read one array (file orientation) and its metadata from `path`.

    The array is `key` when given, else the file's only candidate (numeric, >= 2
    non-singleton dims), else the one named in the file's metadata, else the only
    candidate that can be the `what` (`ndims`: its number of dims once leading and
    trailing singletons are dropped, e.g. (3,) for a cube beside 2-D label images,
    masks or spectra tables), else the one such candidate whose name is in `names`
    (case-insensitive). A band-centre vector stored under one of WAVELENGTH_NAMES
    becomes meta["wavelengths"].

    Before a byte of the array's data is read, `check(shape, dtype, name, meta)` (when
    given) sees what the file's header declares (shape and dtype as stored) and refuses
    the file by raising DataFileError. With `read=False` the data are never read and the
    array returned is None (header-only inspection). Returns (array, name, meta); any
    failure, a MemoryError included, raises DataFileError naming the file.
    """
    path = Path(path)
    fmt = format_of(path)
    if not path.is_file():
        where = "" if path.is_absolute() else f" (a relative path: read from the working directory {Path.cwd()})"
        raise DataFileError(path, ("file not found" if not path.exists() else "not a regular file") + where)
    declared = ""
    try:
        with fmt.open(path) as (arrays, attrs, array_attrs):
            stored = {**{k: v for k, v in arrays.items() if k in META_VARS + (META_KEY,) and _small(v)}, **attrs}
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
            source = arrays[name]
            if fmt.single or saved.get("key") in (None, name):
                meta.update(saved)
                name = saved.get("key", name) if fmt.single else name
            meta.pop("format", None)
            meta.pop("key", None)
            shape, dtype = tuple(int(n) for n in source.shape), np.dtype(source.dtype)
            nbytes = size_text(declared_nbytes(shape, dtype))
            declared = f" {what} {name!r} of declared shape {shape} {dtype} ({nbytes})"
            if check is not None:
                check(shape, dtype, name, meta)
            if not read:
                return None, name, meta
            array = np.asarray(source)
            if not _is_real(array):
                raise DataFileError(path, f"variable {name!r} is not a real numeric array (it holds {array.dtype})")
    except DataFileError:
        raise
    except MemoryError:
        raise DataFileError(path, f"not enough memory to read the{declared or ' file'}") from None
    except Exception as e:
        raise DataFileError(path, f"cannot read {fmt.name} file, truncated or corrupt? "
                                  f"({type(e).__name__}: {e})") from e
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


def _temporary(path: Path) -> Path:
    """A fresh name for the temporary file beside ``path`` that :func:`write_text_atomic` writes."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def write_text_atomic(path: str | os.PathLike, text: str | bytes | Callable[[Path], object]) -> Path:
    """Write ``text`` (or bytes, e.g. a PNG; or call ``text(tmp)``, a function writing the file it is given,
    e.g. ``lambda tmp: torch.save(obj, tmp)``) to ``path`` via a temporary file beside it and ``os.replace``:
    readers see the old file or the whole new one; a failure leaves no temporary file, a kill may leave one
    (:func:`remove_leftovers`)."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        if callable(text):
            text(tmp)
        else:
            tmp.write_bytes(text) if isinstance(text, bytes) else tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def remove_leftovers(path: str | os.PathLike) -> None:
    """Remove the temporary files that writes of ``path`` by :func:`write_text_atomic` left when killed."""
    path = Path(path)
    mine = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp")  # _temporary's names, no other file's
    for tmp in path.parent.iterdir() if path.parent.is_dir() else ():
        if mine.fullmatch(tmp.name):
            tmp.unlink(missing_ok=True)
