"""Read and write cubes, masks and measurements (.mat v5/v7.3, OME-TIFF, .npy, .npz, .h5).

In memory: cubes (C,H,W) float32, masks (H,W) or (C,H,W), measurements
(1,H,W'). On disk: H×W×C or C×H×W, detected from metadata or shape, never
guessed when ambiguous. Sizes are checked from each file's header before any data
are read (`max_bytes`, a caller's `check`, `read_header`). Every problem with a file
raises DataFileError naming the file; writes are atomic. Needs only torch, numpy, scipy, h5py and tifffile.
"""
from cassi.io.arrays import (ArrayHeader, Cube, Measurement, check_mask_fits, load_cube, load_mask, load_measurement,
                             read_header, save_cube, save_mask, save_measurement)
from cassi.io.formats import FORMATS, MAX_BYTES, DataFileError, remove_leftovers, write_text_atomic
from cassi.io.spectral import BAND_SETS, CAVE_WAVELENGTHS, TSA_WAVELENGTHS, band_wavelengths, resample_bands

__all__ = [
    "BAND_SETS", "CAVE_WAVELENGTHS", "FORMATS", "MAX_BYTES", "TSA_WAVELENGTHS", "ArrayHeader", "Cube", "DataFileError",
    "Measurement", "band_wavelengths", "check_mask_fits", "load_cube", "load_mask", "load_measurement", "read_header",
    "resample_bands", "remove_leftovers", "save_cube", "save_mask", "save_measurement", "write_text_atomic",
]
