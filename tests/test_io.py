"""cassi.io: round trips through every format, the real shared data, MATLAB v7.3,
error messages naming file and problem, atomic writes, scaling, band resampling."""
import dataclasses
import io
import json
import pickle
import re
import struct
import zipfile

import h5py
import numpy as np
import pytest
import scipy.io
import tifffile
import torch

import cassi.io.formats as formats
from cassi.io import (CAVE_WAVELENGTHS, FORMATS, TSA_WAVELENGTHS, Cube, DataFileError, Measurement,
                      check_mask_fits, load_cube, load_mask, load_measurement, read_header, resample_bands,
                      save_cube, save_mask, save_measurement)

EXTS = [".mat", ".h5", ".hdf5", ".npy", ".npz", ".tif", ".tiff"]
GEOMETRIES = [{"step": 2, "axis": "w"}, {"offsets": [0.0, 1.5, 3.25, 5.0], "axis": "h"}]


def err(path, problem):
    """Regex: the message names `path`, then the problem."""
    return re.escape(str(path)) + ".*" + problem


def cube4(seed=0, shape=(4, 12, 20)):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("ext,layout", [(e, lay) for e in EXTS for lay in ("hwc", "chw")
                                         if lay == "chw" or not e.startswith(".tif")])  # OME-TIFF: chw only
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_cube_round_trip(tmp_path, ext, layout, geometry):
    data, wl = cube4(), [450.5, 500.0, 550.25, 600.0]
    path = tmp_path / f"cube{ext}"
    save_cube(path, Cube(data, wl, {**geometry, "source": "ignored", "scene": "x"}), layout=layout)
    cube = load_cube(path)
    assert cube.data.dtype == torch.float32 and torch.equal(cube.data, data)
    assert cube.wavelengths == wl
    assert {k: cube.meta[k] for k in geometry} == geometry
    assert cube.meta["scene"] == "x" and cube.meta["bands"] == 4
    assert cube.meta["layout"] == layout and cube.meta["key"] == "cube" and cube.meta["source"] == str(path)
    # the layout on disk is really the one asked for (files readable by other tools)
    raw = {".npy": lambda: np.load(path), ".npz": lambda: np.load(path)["cube"],
           ".mat": lambda: scipy.io.loadmat(path)["cube"], ".tif": lambda: tifffile.imread(path),
           ".tiff": lambda: tifffile.imread(path)}.get(ext, lambda: h5py.File(path)["cube"][()])()
    assert raw.shape == ((12, 20, 4) if layout == "hwc" else (4, 12, 20))


@pytest.mark.parametrize("ext", EXTS)
def test_tensor_defaults_and_explicit_key(tmp_path, ext):
    """A bare tensor with wavelengths= and a custom key; default layout: hwc for .mat, chw elsewhere."""
    data = cube4(1, (3, 10, 7))
    path = tmp_path / f"x{ext}"
    save_cube(path, data, wavelengths=[500, 510, 520], key="scene")
    cube = load_cube(path, key="scene" if ext in (".mat", ".h5", ".npz") else None)
    assert torch.equal(cube.data, data) and cube.wavelengths == [500.0, 510.0, 520.0]
    assert cube.meta["layout"] == ("hwc" if ext == ".mat" else "chw") and cube.meta["key"] == "scene"


@pytest.mark.parametrize("ext", EXTS)
def test_measurement_and_mask_round_trip(tmp_path, ext):
    meas = torch.rand(1, 16, 22)
    path = tmp_path / f"meas{ext}"
    save_measurement(path, Measurement(meas, {"bands": 4, "step": 2, "axis": "w"}))
    got = load_measurement(path)
    assert got.data.shape == (1, 16, 22) and torch.equal(got.data, meas)
    assert {k: got.meta[k] for k in ("bands", "step", "axis")} == {"bands": 4, "step": 2, "axis": "w"}
    check_mask_fits((16, 16), got.data.shape, got.meta["step"], got.meta["axis"], bands=got.meta["bands"])
    for mask in (torch.rand(16, 16) + 0.1, torch.rand(4, 16, 16) + 0.1):
        save_mask(tmp_path / f"m{mask.ndim}{ext}", mask)
        assert torch.equal(load_mask(tmp_path / f"m{mask.ndim}{ext}"), mask)


def test_stored_key_decides_and_plain_metadata(tmp_path):
    """A file extended by another tool: the stored metadata still name the cube;
    MATLAB/HDF5 users see wavelengths and layout as plain variables/attributes."""
    data = cube4(3)
    save_cube(path := tmp_path / "x.h5", data, [1, 2, 3, 4], key="scene")
    with h5py.File(path, "a") as f:
        f["other"] = np.ones((12, 20, 4))
        assert list(f["scene"].attrs["wavelengths"]) == [1, 2, 3, 4] and f["scene"].attrs["layout"] == "chw"
    assert torch.equal(load_cube(path).data, data) and load_cube(path, key="other").meta["key"] == "other"
    assert load_cube(path, key="other").wavelengths is None  # the stored metadata belong to 'scene'
    save_cube(path := tmp_path / "x.mat", data, [1, 2, 3, 4], {"step": 2})
    mat = scipy.io.loadmat(path)
    assert mat["wavelengths"].tolist() == [[1, 2, 3, 4]] and mat["layout"][0] == "hwc" and mat["step"][0, 0] == 2


def test_tiff_metadata_for_other_tools(tmp_path):
    """OME channels carry '453.3 nm' names and EmissionWavelength; axes CYX."""
    path = tmp_path / "c.ome.tif"
    save_cube(path, torch.rand(28, 6, 5), TSA_WAVELENGTHS)
    with tifffile.TiffFile(path) as tif:
        assert tif.is_ome and tif.series[0].axes == "CYX"
        channels = tifffile.xml2dict(tif.ome_metadata)["OME"]["Image"]["Pixels"]["Channel"]
    assert [c["Name"] for c in channels][:2] == ["453.3 nm", "457.6 nm"]
    assert [c["EmissionWavelength"] for c in channels] == list(TSA_WAVELENGTHS)
    # a foreign OME-TIFF (no cassi description): wavelengths from the channel names
    foreign = tmp_path / "foreign.ome.tif"
    tifffile.imwrite(foreign, np.ones((2, 4, 6), np.float32), ome=True,
                     metadata={"axes": "CYX", "Channel": {"Name": ["420 nm", "430.5 nm"]}})
    cube = load_cube(foreign)
    assert cube.wavelengths == [420.0, 430.5] and cube.data.shape == (2, 4, 6)


def test_tiff_refuses_hwc(tmp_path):
    with pytest.raises(ValueError, match="chw"):
        save_cube(tmp_path / "c.tif", cube4(), layout="hwc")
    assert list(tmp_path.iterdir()) == []


def test_plain_tiff_axes_give_layout(tmp_path):
    """A plain TIFF: samples (YXS) -> hwc, pages (QYX) -> chw, even for shapes the heuristic finds ambiguous."""
    x = np.random.default_rng(0).random((9, 9, 9), dtype=np.float32)
    tifffile.imwrite(tmp_path / "yxs.tif", x, photometric="minisblack", planarconfig="contig")
    tifffile.imwrite(tmp_path / "pages.tif", x, photometric="minisblack")
    assert torch.equal(load_cube(tmp_path / "pages.tif").data, torch.from_numpy(x))
    with tifffile.TiffFile(tmp_path / "yxs.tif") as tif:
        if tif.series[0].axes != "YXS":
            pytest.skip(f"tifffile wrote axes {tif.series[0].axes}")
    assert torch.equal(load_cube(tmp_path / "yxs.tif").data, torch.from_numpy(x).permute(2, 0, 1))


# ----------------------------------------------------------------------------- MATLAB v7.3

def write_matlab_v73(path, variables):
    """Write a .mat v7.3 the way MATLAB does: 512-byte header, HDF5, arrays in column-major
    order (the HDF5 dataset holds the transpose), MATLAB_class attributes, chars as uint16."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, value in variables.items():
            if isinstance(value, str):
                ds = f.create_dataset(name, data=np.array([[ord(c) for c in value]], np.uint16).T)
                ds.attrs["MATLAB_class"], ds.attrs["MATLAB_int_decode"] = np.bytes_(b"char"), np.int32(2)
            else:
                ds = f.create_dataset(name, data=np.atleast_2d(value).T)
                ds.attrs["MATLAB_class"] = np.bytes_({"f8": "double", "f4": "single"}[value.dtype.str[1:]])
        f.create_group("#refs#")
    with open(path, "r+b") as fh:
        fh.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 "
                 b"HDF5 schema 1.00 .".ljust(116) + b"\0" * 8 + b"\x00\x02IM")


def test_mat_v73_from_matlab(tmp_path):
    rng = np.random.default_rng(0)
    img = rng.random((12, 20, 5))  # MATLAB H×W×C, H != W so a transposition error shows
    path = tmp_path / "v73.mat"
    write_matlab_v73(path, {"img": img, "wavelengths": np.linspace(450, 650, 5), "layout": "hwc"})
    with pytest.raises(NotImplementedError):  # it really is v7.3, scipy cannot read it
        scipy.io.loadmat(path)
    cube = load_cube(path)
    assert cube.data.shape == (5, 12, 20) and cube.meta["key"] == "img" and cube.meta["layout"] == "hwc"
    assert torch.equal(cube.data, torch.from_numpy(img.transpose(2, 0, 1)).float())
    assert cube.wavelengths == pytest.approx(np.linspace(450, 650, 5).tolist())
    write_matlab_v73(tmp_path / "meas.mat", {"meas_real": rng.random((12, 26)).astype(np.float32)})
    assert load_measurement(tmp_path / "meas.mat").data.shape == (1, 12, 26)


def test_mat_v73_writer_for_large_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAT_V5_LIMIT", 0)  # pretend the cube is >= 2 GiB
    data, path = cube4(2), tmp_path / "big.mat"
    save_cube(path, data, TSA_WAVELENGTHS[:4], {"step": 2, "axis": "w"})
    assert path.read_bytes()[:10] == b"MATLAB 7.3" and h5py.is_hdf5(path)
    assert h5py.File(path)["cube"].shape == (4, 20, 12)  # MATLAB H×W×C stored transposed
    cube = load_cube(path)
    assert torch.equal(cube.data, data) and cube.wavelengths == list(TSA_WAVELENGTHS[:4])
    assert cube.meta["step"] == 2 and cube.meta["layout"] == "hwc"
    mask = torch.rand(12, 20) > 0.5  # bool -> MATLAB logical
    save_mask(tmp_path / "mask.mat", mask)
    assert torch.equal(load_mask(tmp_path / "mask.mat"), mask.float())
    save_measurement(tmp_path / "meas.mat", data[:1, :, :], {"step": 2})
    meas = load_measurement(tmp_path / "meas.mat")
    assert torch.equal(meas.data, data[:1]) and meas.meta["step"] == 2


# ----------------------------------------------------------------------------- shared real data

def test_shared_masks(shared_data):
    for name, size in [("tsa_simu_mask_256.mat", 256), ("tsa_real_mask_660.mat", 660)]:
        mask = load_mask(shared_data / "masks" / name)
        assert mask.shape == (size, size) and mask.dtype == torch.float32
        assert 0 < mask.min() and mask.max() == 1


def test_shared_real_measurements(shared_data):
    mask = load_mask(shared_data / "masks" / "tsa_real_mask_660.mat")
    for i in range(1, 6):
        path = shared_data / "real" / f"tsa_real_scene{i}.mat"
        meas = load_measurement(path)
        assert meas.data.shape == (1, 660, 714) and meas.meta["key"] == "meas_real"
        assert 0 <= meas.data.min() and meas.data.max() <= 1 and meas.data.std() > 0
        assert check_mask_fits(mask.shape, meas.data.shape, 2, "w", bands=28, path=path) == (660, 714)
        with pytest.raises(DataFileError, match=err(path, "expected 660×716")):
            check_mask_fits(mask.shape, meas.data.shape, 2, "w", bands=29, path=path)


@pytest.mark.parametrize("name,size", [("cave_feathers_150.mat", 150), ("cave_chart_toy_150.mat", 150),
                                       ("cave_balloons_100.mat", 100)])
def test_shared_cave(shared_data, name, size):
    path = shared_data / "cave" / name
    cube = load_cube(path)
    assert cube.data.shape == (31, size, size) and cube.data.dtype == torch.float32
    assert cube.meta["key"] == "Omsi" and cube.meta["layout"] == "hwc" and cube.meta["bands"] == 31
    assert cube.wavelengths is None
    raw = scipy.io.loadmat(path)["Omsi"]
    assert torch.equal(cube.data[7], torch.from_numpy(raw[:, :, 7]).float())  # band axis really moved
    assert 0 <= cube.data.min() and 0.3 < cube.data.max() <= 1
    tsa = resample_bands(cube, CAVE_WAVELENGTHS, TSA_WAVELENGTHS)
    assert tsa.data.shape == (28, size, size) and tsa.wavelengths == list(TSA_WAVELENGTHS)


# ----------------------------------------------------------------------------- errors

def test_missing_and_unknown(tmp_path, monkeypatch):
    with pytest.raises(DataFileError, match=err(tmp_path / "nope.mat", "file not found")):
        load_cube(tmp_path / "nope.mat")
    monkeypatch.chdir(tmp_path)  # a relative path names the directory it was looked for in
    with pytest.raises(DataFileError, match=err("nope.mat", f"file not found \\(a relative path: read from the working "
                                                            f"directory {re.escape(str(tmp_path))}\\)")):
        load_cube("nope.mat")
    (tmp_path / "cube.xyz").write_bytes(b"0")
    with pytest.raises(DataFileError, match=err(tmp_path / "cube.xyz", "unknown file extension '.xyz'")):
        load_cube(tmp_path / "cube.xyz")
    with pytest.raises(DataFileError, match=err(tmp_path / "out.png", "unknown file extension")):
        save_cube(tmp_path / "out.png", cube4())


@pytest.mark.parametrize("ext", EXTS)
def test_truncated_and_corrupt(tmp_path, ext):
    good = tmp_path / f"good{ext}"
    save_cube(good, torch.rand(4, 64, 64))
    blob = good.read_bytes()
    for name, content in [("truncated", blob[: len(blob) // 2]), ("garbage", b"not a data file " * 64),
                          ("empty", b"")]:
        path = tmp_path / f"{name}{ext}"
        path.write_bytes(content)
        with pytest.raises(DataFileError, match=err(path, "truncated or corrupt")):
            load_cube(path)


def test_key_selection_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    img, mask = rng.random((32, 32, 8)), (rng.random((32, 32)) > 0.5).astype(np.float32)
    both = tmp_path / "both.mat"
    scipy.io.savemat(both, {"img": img, "mask": mask, "note": "text", "scale": 3.0})
    assert load_cube(both).meta["key"] == "img"  # known names decide
    assert load_mask(both).shape == (32, 32)
    two = tmp_path / "two.npz"
    np.savez(two, a=img, b=img)
    with pytest.raises(DataFileError, match=err(two, r"several candidate arrays \(a \(32, 32, 8\), b \(32, 32, 8\)\).*key=")):
        load_cube(two)
    assert torch.equal(load_cube(two, key="b").data, torch.from_numpy(img).permute(2, 0, 1).float())
    with pytest.raises(DataFileError, match=err(two, "no variable 'c' \\(variables: a, b\\)")):
        load_cube(two, key="c")
    none = tmp_path / "none.mat"
    scipy.io.savemat(none, {"v": np.arange(5.0), "s": "x"})
    with pytest.raises(DataFileError, match=err(none, "no cube found")):
        load_cube(none)
    with pytest.raises(DataFileError, match=err(both, "'note' is not a real numeric array")):
        load_cube(both, key="note")


def test_wrong_ndim(tmp_path):
    path = tmp_path / "flat.npy"
    np.save(path, np.ones((30, 40), np.float32))
    with pytest.raises(DataFileError, match=err(path, r"expected a 3-D cube.*2-D array.*\(30, 40\)")):
        load_cube(path)
    np.save(path := tmp_path / "deep.npy", np.ones((2, 3, 30, 40), np.float32))
    with pytest.raises(DataFileError, match=err(path, r"expected a 2-D measurement.*4-D")):
        load_measurement(path)
    with pytest.raises(DataFileError, match=err(path, r"expected a 3-D cube.*4-D array.*\(2, 3, 30, 40\)")):
        load_cube(path)
    np.save(path := tmp_path / "batch1.npy", np.ones((1, 3, 30, 40), np.float32))
    assert load_cube(path).data.shape == (3, 30, 40)  # a leading batch of one is dropped


@pytest.mark.parametrize("bad,problem", [(np.nan, "1 NaN/Inf values"), (np.inf, "1 NaN/Inf values"),
                                         (-0.5, r"negative values \(min -0.5\)")])
def test_bad_values(tmp_path, bad, problem):
    x = np.full((4, 32, 32), 0.5, np.float32)
    x[1, 2, 3] = bad
    for ext in (".npy", ".h5"):
        path = tmp_path / f"bad{ext}"
        save_cube(path, x, overwrite=True)
        with pytest.raises(DataFileError, match=err(path, "cube contains " + problem)):
            load_cube(path)
        with pytest.raises(DataFileError, match=err(path, "mask contains " + problem)):
            load_mask(path)
    save_measurement(path := tmp_path / "meas.mat", x[1])
    with pytest.raises(DataFileError, match=err(path, "measurement contains " + problem)):
        load_measurement(path)
    if bad < 0:  # opt-in clamp (e.g. calibrated data with tiny negatives)
        assert load_cube(tmp_path / "bad.h5", clip_negative=True).data[1, 2, 3] == 0
        assert load_measurement(path, clip_negative=True).data.min() == 0


def test_mask_all_zeros(tmp_path):
    scipy.io.savemat(path := tmp_path / "zero.mat", {"mask": np.zeros((16, 16))})
    with pytest.raises(DataFileError, match=err(path, "mask is all zeros")):
        load_mask(path)


def test_ambiguous_layout(tmp_path):
    x = np.random.default_rng(0).random((20, 20, 20)).astype(np.float32)
    np.save(path := tmp_path / "cubic.npy", x)  # no sidecar: no metadata
    with pytest.raises(DataFileError, match=err(path, r"cannot tell the band axis.*\(20, 20, 20\).*layout=")):
        load_cube(path)
    np.save(path := tmp_path / "close.npy", x[:, :, :12])  # 12 vs 20: not clearly smaller
    with pytest.raises(DataFileError, match=err(path, "layout=")):
        load_cube(path)
    assert torch.equal(load_cube(tmp_path / "cubic.npy", layout="hwc").data, torch.from_numpy(x).permute(2, 0, 1))
    assert torch.equal(load_cube(tmp_path / "cubic.npy", layout="chw").data, torch.from_numpy(x))
    np.save(tmp_path / "hwc.npy", np.zeros((64, 60, 28), np.float32))  # band axis <= half of H and W
    np.save(tmp_path / "chw.npy", np.zeros((31, 64, 70), np.float32))
    assert load_cube(tmp_path / "hwc.npy").data.shape == (28, 64, 60)
    assert load_cube(tmp_path / "chw.npy").data.shape == (31, 64, 70)


def test_wavelength_mismatch_in_file(tmp_path):
    scipy.io.savemat(path := tmp_path / "wl.mat", {"img": np.ones((32, 32, 4)), "wavelengths": [1.0, 2.0, 3.0]})
    with pytest.raises(DataFileError, match=err(path, "3 entries but the cube has 4 bands")):
        load_cube(path)


def test_error_type():
    e = DataFileError("/x/y.mat", "broken")
    assert isinstance(e, ValueError) and str(e) == "/x/y.mat: broken"
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.path == "/x/y.mat"
    assert str(DataFileError("a whole message")) == "a whole message"  # one-argument form (DataLoader re-raise)


# ----------------------------------------------------------------------------- atomic writes

@pytest.mark.parametrize("ext", EXTS)
def test_failed_write_leaves_nothing(tmp_path, monkeypatch, ext):
    def failing(path, array, key, meta):
        path.write_bytes(b"half a file")
        raise OSError("disk full")
    monkeypatch.setitem(FORMATS, ext, dataclasses.replace(FORMATS[ext], write=failing))
    with pytest.raises(OSError, match="disk full"):
        save_cube(tmp_path / f"out{ext}", cube4())
    assert list(tmp_path.iterdir()) == []


def test_no_silent_overwrite(tmp_path, monkeypatch):
    path = tmp_path / "c.npy"
    save_cube(path, cube4(0))
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match=re.escape(str(path))):
        save_cube(path, cube4(1))
    assert path.read_bytes() == before
    # a failing overwrite keeps the old file intact, and leaves no temporary
    monkeypatch.setitem(FORMATS, ".npy", dataclasses.replace(FORMATS[".npy"], write=lambda *a: 1 / 0))
    with pytest.raises(ZeroDivisionError):
        save_cube(path, cube4(1), overwrite=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy", "c.npy.json"]
    monkeypatch.undo()
    save_cube(path, cube4(1), overwrite=True)
    assert torch.equal(load_cube(path).data, cube4(1))
    assert json.loads((tmp_path / "c.npy.json").read_text())["layout"] == "chw"


# ----------------------------------------------------------------------------- scaling

def test_integer_scaling(tmp_path):
    x = np.array([0, 1, 4095, 32768, 65535], np.uint16).repeat(256).reshape(5, 16, 16)
    np.save(path := tmp_path / "u16.npy", x)
    cube = load_cube(path)
    assert cube.data.dtype == torch.float32 and cube.data.max() == 1.0 and cube.data.min() == 0
    assert torch.equal(cube.data, torch.from_numpy(x.astype(np.float32) / np.float32(65535)))
    assert load_cube(path, max_value=4095).data[2].eq(1).all()
    with h5py.File(path := tmp_path / "u12.h5", "w") as f:  # 12-bit data in uint16, declared by bit_depth
        f.create_dataset("cube", data=np.minimum(x, 4095)).attrs["bit_depth"] = 12
    assert load_cube(path).data[2].eq(1).all()
    np.save(path := tmp_path / "u8.npy", np.full((3, 8, 8), 51, np.uint8))
    assert torch.allclose(load_cube(path).data, torch.tensor(0.2))
    assert load_cube(tmp_path / "u16.npy", dtype=torch.float64).data.dtype == torch.float64


def test_binary_integer_mask_kept(tmp_path):
    mask = np.random.default_rng(0).random((16, 16)) > 0.5
    scipy.io.savemat(path := tmp_path / "logical.mat", {"mask": mask})  # MATLAB logical -> uint8 0/1
    assert torch.equal(load_mask(path), torch.from_numpy(mask).float())


# ----------------------------------------------------------------------------- resampling

def test_resample_linear_spectrum_cave_to_tsa():
    lam = torch.tensor(CAVE_WAVELENGTHS, dtype=torch.float64)
    a, b = torch.rand(1, 5, 6, dtype=torch.float64), torch.rand(1, 5, 6, dtype=torch.float64) / 300
    x = (a + b * lam[:, None, None]).float()  # each pixel's spectrum is linear in wavelength
    y = resample_bands(x, CAVE_WAVELENGTHS, TSA_WAVELENGTHS)
    expected = (a + b * torch.tensor(TSA_WAVELENGTHS, dtype=torch.float64)[:, None, None]).float()
    assert y.shape == (28, 5, 6) and torch.allclose(y, expected, rtol=0, atol=1e-6)
    batch = resample_bands(torch.stack([x, 2 * x]), CAVE_WAVELENGTHS, TSA_WAVELENGTHS)
    assert batch.shape == (2, 28, 5, 6) and torch.allclose(batch[1], 2 * y)


def test_resample_shared_wavelengths_exact_and_cube():
    x = torch.rand(31, 4, 4)
    dst = [400.0, 455.0, 500.0, 700.0]
    y = resample_bands(x, CAVE_WAVELENGTHS, dst)
    assert torch.equal(y[0], x[0]) and torch.equal(y[2], x[10]) and torch.equal(y[3], x[30])
    assert torch.allclose(y[1], (x[5] + x[6]) / 2)
    assert torch.equal(resample_bands(x, CAVE_WAVELENGTHS, CAVE_WAVELENGTHS), x)
    cube = resample_bands(Cube(x, list(CAVE_WAVELENGTHS), {"bands": 31, "offsets": list(range(31))}), None, dst)
    assert isinstance(cube, Cube) and cube.wavelengths == dst and cube.meta == {"bands": 4}
    assert torch.equal(cube.data, y)


def test_resample_refuses_extrapolation():
    with pytest.raises(ValueError, match=r"\[710.0\] nm fall outside the source range \[400, 700\]"):
        resample_bands(torch.rand(31, 2, 2), CAVE_WAVELENGTHS, [450.0, 710.0])
    with pytest.raises(ValueError, match="C=28"):
        resample_bands(torch.rand(31, 2, 2), TSA_WAVELENGTHS, [500.0])


# ----------------------------------------------------------------------------- geometry

def test_check_mask_fits():
    assert check_mask_fits((256, 256), (1, 256, 310), 2, "w", bands=28) == (256, 310)
    assert check_mask_fits((28, 256, 256), (4, 1, 256, 310), 2) == (256, 310)
    assert check_mask_fits((256, 256), (310, 256), 2, "h", bands=28) == (310, 256)
    assert check_mask_fits((4, 10, 10), (10, 15), [0.0, 1.5, 3.2, 4.6]) == (10, 15)  # ceil of fractional Δ
    with pytest.raises(DataFileError, match=err("meas.mat", r"256×300 does not fit a 256×256 mask.*expected 256×310")):
        check_mask_fits((256, 256), (256, 300), 2, bands=28, path="meas.mat")
    with pytest.raises(DataFileError, match="mask has 28 bands but 3 offsets"):
        check_mask_fits((28, 8, 8), (8, 10), [0, 1, 2])
    with pytest.raises(ValueError, match="bands="):
        check_mask_fits((256, 256), (256, 310), 2)


def test_write_text_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    from cassi.io import write_text_atomic

    target = tmp_path / "table.md"
    write_text_atomic(target, "old")
    assert target.read_text() == "old"

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("cassi.io.formats.os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]


def test_remove_leftovers_removes_what_a_killed_write_of_that_file_left_and_nothing_else(tmp_path, monkeypatch):
    from cassi.io import remove_leftovers, write_text_atomic

    target = tmp_path / "pool.pt"

    def killed(src, dst):  # the process dies between the write and the rename: its temporary stays
        raise KeyboardInterrupt

    monkeypatch.setattr("cassi.io.formats.os.replace", killed)
    monkeypatch.setattr(type(target), "unlink", lambda self, missing_ok=False: None)  # no cleanup runs after a kill
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, b"half")
    monkeypatch.undo()
    others = [".other.pt.1234abcd.tmp", ".pool.pt.bak.1234abcd.tmp", "pool.pt.parts"]  # another file's, a prefix's
    (tmp_path / others[0]).write_text("another file's")
    (tmp_path / others[1]).write_text("pool.pt.bak's")
    (tmp_path / others[2]).mkdir()
    assert len(list(tmp_path.iterdir())) == 4  # the killed write's temporary, and the others
    remove_leftovers(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == others
    remove_leftovers(tmp_path / "gone" / "x.pt")  # no folder: nothing to do


# ----------------------------------------------------------------------------- files as people have them

def test_the_one_cube_beside_other_arrays_loads_without_key(tmp_path):
    rng = np.random.default_rng(1)
    cube = rng.random((24, 20, 8)).astype(np.float32)  # H×W×C
    wl = np.linspace(450, 660, 8)
    others = {"labels": rng.integers(0, 5, (24, 20)).astype(np.uint8), "M": (rng.random((24, 20)) > .5) * 1.0,
              "endmembers": rng.random((8, 3))}  # a label image, a mask, a spectra table: none can be a cube
    scipy.io.savemat(path := tmp_path / "scene.mat", {"radiance": cube, "wl": wl, **others})
    got = load_cube(path)
    assert got.meta["key"] == "radiance" and torch.equal(got.data, torch.from_numpy(cube).permute(2, 0, 1))
    assert got.wavelengths == pytest.approx(wl)
    with h5py.File(path := tmp_path / "scene.h5", "w") as f:  # wavelengths as a dataset attribute, C×H×W
        f.create_dataset("data/reflectance", data=cube.transpose(2, 0, 1)).attrs["Wavelength"] = wl
        f.create_dataset("data/gt_labels", data=others["labels"])
    got = load_cube(path)
    assert got.data.shape == (8, 24, 20) and got.wavelengths == pytest.approx(wl)
    np.savez(path := tmp_path / "scene.npz", x=cube, LAMBDA=wl, spectra=others["endmembers"])
    assert load_cube(path).wavelengths == pytest.approx(wl)


def test_two_possible_cubes_are_named_not_guessed(tmp_path):
    rng = np.random.default_rng(2)
    np.savez(path := tmp_path / "two.npz", before=rng.random((16, 16, 4)), after=rng.random((16, 16, 4)),
             labels=np.ones((16, 16)))
    with pytest.raises(DataFileError, match=err(path, r"\(before \(16, 16, 4\), after \(16, 16, 4\)\); "
                                                      "pass key= to choose the cube")):
        load_cube(path)
    assert load_cube(path, key="after").meta["key"] == "after"


def test_stored_wavelengths_decide_the_band_axis(tmp_path):
    """A small crop of an airborne image: more bands than pixels per side."""
    rng = np.random.default_rng(3)
    hwc = rng.random((12, 10, 50)).astype(np.float32)
    wl = np.linspace(400, 2500, 50)
    np.save(path := tmp_path / "bare.npy", hwc)
    with pytest.raises(DataFileError, match=err(path, r"cannot tell the band axis.*\(12, 10, 50\).*layout='hwc'")):
        load_cube(path)
    scipy.io.savemat(path := tmp_path / "crop.mat", {"cube": hwc, "bands_nm": wl})
    got = load_cube(path)
    assert got.meta["layout"] == "hwc" and got.data.shape == (50, 12, 10) and got.wavelengths == pytest.approx(wl)
    np.savez(path := tmp_path / "crop_chw.npz", cube=hwc.transpose(2, 0, 1), wavelength=wl)
    got = load_cube(path)
    assert got.meta["layout"] == "chw" and torch.equal(got.data, torch.from_numpy(hwc).permute(2, 0, 1))


def test_wavelengths_that_fit_two_axes_still_ask_for_layout(tmp_path):
    x = np.random.default_rng(4).random((20, 30, 20)).astype(np.float32)
    np.savez(path := tmp_path / "both.npz", cube=x, wl=np.arange(20) * 10.0 + 450)
    with pytest.raises(DataFileError, match=err(path, r"\(20, 30, 20\) \(its 20 wavelengths fit both the first "
                                                      r"and the last axis\): pass layout='hwc' \(H,W,C\) or "
                                                      r"layout='chw' \(C,H,W\)")):
        load_cube(path)
    assert load_cube(path, layout="hwc").data.shape == (20, 20, 30)
    np.savez(path := tmp_path / "two_wl.npz", cube=x[:, :, :8], wl=np.arange(8.0), wavelengths_nm=np.arange(8.0) + 1)
    with pytest.raises(DataFileError, match=err(path, "different wavelength vectors")):
        load_cube(path)


def test_signed_and_wide_integers(tmp_path):
    raw = np.array([0, 100, 32767], np.int16).repeat(64).reshape(3, 8, 8)
    np.save(path := tmp_path / "int16.npy", raw)  # int16 radiance: divided by the int16 maximum, 32767
    assert torch.equal(load_cube(path).data, torch.from_numpy(raw.astype(np.float32) / np.float32(32767)))
    raw[0, 0, 0] = -12  # below the dark level
    np.save(path, raw)
    with pytest.raises(DataFileError, match=err(path, r"negative values.*raw int16 minimum -12.*clip_negative=True")):
        load_cube(path)
    assert load_cube(path, clip_negative=True).data[0, 0, 0] == 0
    np.save(path := tmp_path / "int32.npy", raw.astype(np.int32))
    with pytest.raises(DataFileError, match=err(path, "int32 data, which has no implied full scale: pass max_value=")):
        load_cube(path, clip_negative=True)
    assert load_cube(path, max_value=100, clip_negative=True).data[0, 1, 0] == 0  # row 1 of band 0 is 0
    assert torch.allclose(load_cube(path, max_value=100, clip_negative=True).data[1], torch.tensor(1.0))
    with h5py.File(path := tmp_path / "u32.h5", "w") as f:  # a stored bit depth sets the scale
        f.create_dataset("cube", data=np.full((3, 8, 8), 4095, np.uint32)).attrs["bit_depth"] = 12
    assert load_cube(path).data.eq(1).all()


def test_a_measurement_that_does_not_fit_says_what_would(tmp_path):
    fit = r"it would fit "
    with pytest.raises(DataFileError, match=fit + r"step=1 with 28 bands$"):  # 256 + 27·1
        check_mask_fits((256, 256), (256, 283), 2, bands=28)
    with pytest.raises(DataFileError, match=fit + r"step=2.22222 with 28 bands or bands=31 with step 2$"):
        check_mask_fits((64, 64), (64, 124), 2, bands=28)
    with pytest.raises(DataFileError, match=fit + r"axis='h'$"):
        check_mask_fits((64, 64), (118, 64), 2, bands=28)
    with pytest.raises(DataFileError, match=r"expected 64×118$"):  # narrower than the mask: nothing fits
        check_mask_fits((64, 64), (64, 60), 2, bands=28)


# ----------------------------------------------------------------------------- hostile files: refused from the header

HUGE = (200_000, 200_000)  # float32: 149 GiB once read


def hostile_h5(path, shape=HUGE, name="x", userblock=0):
    """A ~1.4 KB HDF5 file declaring a huge gzip-compressed, chunked float32 dataset that holds only its fill value."""
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset(name, shape=shape, dtype="f4", compression="gzip", chunks=(1,) * (len(shape) - 2) + (500, 500))
        if userblock:
            f[name].attrs["MATLAB_class"] = np.bytes_("single")
    if userblock:  # a MATLAB v7.3 header, as formats._write_mat73 and MATLAB write it
        with open(path, "r+b") as fh:
            header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64 HDF5 schema 1.00 ."
            fh.write(header.ljust(116) + b"\0" * 8 + b"\x00\x02IM")
    return path


def lying_mat_v5(path, shape=(100_000, 100_000)):
    """A tiny .mat v5 whose 4×6 double array's header claims `shape` (74.5 GiB) instead."""
    scipy.io.savemat(path, {"meas": np.ones((4, 6))})
    blob = bytearray(path.read_bytes())
    dims = blob.find(struct.pack("<4i", 5, 8, 4, 6))  # the dimensions sub-element: miINT32, 8 bytes, 4, 6
    assert dims > 0
    blob[dims + 8:dims + 16] = struct.pack("<2i", *shape)
    path.write_bytes(bytes(blob))
    return path


def lying_npy(path, shape=HUGE):
    """A .npy whose header declares `shape` in front of 24 floats."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
        fh.write(np.ones(24, np.float32).tobytes())
    return path


def lying_npz(path, shape=HUGE):
    """A .npz (zip) beside a small metadata member, whose 'meas' member's .npy header declares `shape`."""
    member = lying_npy(path.with_suffix(".member.npy"), shape).read_bytes()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("meas.npy", member)
        buf = io.BytesIO()
        np.save(buf, np.arange(3.0))
        z.writestr("wavelengths.npy", buf.getvalue())
    return path


def lying_tif(path, height=50_000, width=60_000):
    """A plain TIFF of 4×6 floats whose tags claim height × width (11.2 GiB) in one strip."""
    tifffile.imwrite(path, np.ones((4, 6), np.float32), metadata=None)
    with tifffile.TiffFile(path) as tif:
        tags = {t.name: (t.valueoffset, {3: "<H", 4: "<I"}[int(t.dtype)]) for t in tif.pages[0].tags
                if t.name in ("ImageWidth", "ImageLength", "RowsPerStrip")}
    blob = bytearray(path.read_bytes())
    for name, value in (("ImageWidth", width), ("ImageLength", height), ("RowsPerStrip", height)):
        offset, fmt = tags[name]
        blob[offset:offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
    path.write_bytes(bytes(blob))
    return path


HOSTILE = {  # name: (writer, declared shape as the message names it, its dtype, GiB once read)
    "gzip.h5": (hostile_h5, HUGE, "float32", "149 GiB"),
    "v73.mat": (lambda p: hostile_h5(p, HUGE[::-1], "meas", userblock=512), HUGE, "float32", "149 GiB"),
    "v5.mat": (lying_mat_v5, (100_000, 100_000), "float64", "74.5 GiB"),
    "lying.npy": (lying_npy, HUGE, "float32", "149 GiB"),
    "lying.npz": (lying_npz, HUGE, "float32", "149 GiB"),
    "lying.tif": (lying_tif, (50_000, 60_000), "float32", "11.2 GiB"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_files_are_refused_from_the_header(tmp_path, small_memory, name):
    """Small files declaring huge arrays: every loader refuses them from the header (naming the file, the
    declared shape and why), at once, without allocating (a wrong reader hits the address-space limit)."""
    write, shape, dtype, size = HOSTILE[name]
    path = write(tmp_path / name)
    assert path.stat().st_size < 20_000
    declared = re.escape(f"declares shape {shape} {dtype} ({size} once read)")
    bound = r": more than max_bytes=4294967296 \(4 GiB\); pass max_bytes="
    fits = lambda h: check_mask_fits((660, 660), h.shape, 2, bands=28, path=h.path)  # noqa: E731
    with small_memory() as used:
        with pytest.raises(DataFileError, match=err(path, f"measurement '[a-z]+' {declared}{bound}")):
            load_measurement(path)
        with pytest.raises(DataFileError, match=err(path, f"mask '[a-z]+' {declared}{bound}")):
            load_mask(path)
        with pytest.raises(DataFileError, match=err(path, re.escape(f"measurement of size {shape[0]}×{shape[1]} "
                                                                     "does not fit a 660×660 mask"))):
            load_measurement(path, check=fits)  # the caller's check of the header, before the size bound
        with pytest.raises(DataFileError, match=err(path, "got a 2-D array .*" + re.escape(str(shape)))):
            load_cube(path)
    assert used["seconds"] < 1 and used["peak"] < 16 * 2**20, used


def test_a_huge_cube_is_refused_and_the_bound_can_be_raised(tmp_path, small_memory):
    """A 3-D hostile file as a cube: refused by max_bytes; raised (None: no bound), reading it runs out of memory,
    which is the file's DataFileError too (never a bare MemoryError); a real cube within a lowered bound loads."""
    path = hostile_h5(tmp_path / "cube.h5", (28, *HUGE))
    with small_memory() as used:
        with pytest.raises(DataFileError, match=err(path, re.escape("cube 'x' declares shape (28, 200000, 200000) "
                                                                     "float32 (4.07 TiB once read): more than"))):
            load_cube(path)
        with pytest.raises(DataFileError, match=err(path, r"more than max_bytes=2\b")):
            load_cube(path, max_bytes=2)
    assert used["seconds"] < 1 and used["peak"] < 16 * 2**20, used
    with small_memory() as limit:  # (numpy traces the failed allocation: no peak to check here)
        if limit["limited"]:  # else reading would really try to allocate 4 TiB
            with pytest.raises(DataFileError, match=err(path, re.escape(
                    "not enough memory to read the cube 'x' of declared shape (28, 200000, 200000) float32"))):
                load_cube(path, max_bytes=None)
    save_cube(good := tmp_path / "good.npy", cube4())
    assert load_cube(good, max_bytes=4 * 12 * 20 * 4).data.shape == (4, 12, 20)  # exactly its float32 size
    with pytest.raises(DataFileError, match=err(good, re.escape("cube 'cube' declares shape (4, 12, 20) float32 "
                                                                 "(3.75 KiB once read): more than max_bytes=3839"))):
        load_cube(good, max_bytes=4 * 12 * 20 * 4 - 1)


def test_a_lying_mat_v5_header_with_no_bound_is_corrupt_not_a_crash(tmp_path, small_memory):
    """With the bound lifted, the v5 file whose header lies is read and found corrupt (its data do not fill the
    declared shape), without allocating the declared 74.5 GiB; read_header sees the header alone."""
    path = lying_mat_v5(tmp_path / "lie.mat")
    with small_memory() as used:
        header = read_header(path, "measurement", max_bytes=None)
        with pytest.raises(DataFileError, match=err(path, "truncated or corrupt")):
            load_measurement(path, max_bytes=None)
    assert header.shape == (1, 100_000, 100_000) and header.stored_shape == (100_000, 100_000)
    assert header.dtype == np.float64 and header.nbytes == 8 * 10**10 and header.name == "meas"
    assert used["seconds"] < 1 and used["peak"] < 16 * 2**20, used


def test_huge_metadata_beside_a_good_array_is_not_read(tmp_path, small_memory):
    """A 'wavelengths' dataset or a cassi_meta attribute declaring gigabytes is left unread; the cube loads."""
    path = tmp_path / "cube.h5"
    save_cube(path, cube4())
    with h5py.File(path, "a") as f:
        f.create_dataset("wavelengths", shape=(4 * 10**9,), dtype="f8", compression="gzip", chunks=(10**6,))
    with small_memory() as used:
        cube = load_cube(path, key="cube")
    assert torch.equal(cube.data, cube4()) and cube.wavelengths is None
    assert used["peak"] < 16 * 2**20, used
