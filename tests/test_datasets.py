"""Datasets: synthetic scenes, cube files (crops, augmentation, mosaics, relighting, shading, resampling, memory), real measurements."""
import gc
import math
import re
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import cassi.io as io
from cassi.data import CubeFiles, MeasurementFiles, SyntheticCubes, resolve_paths, synthetic_cube
from cassi.data.datasets import collate, stable_seed
from cassi.io import DataFileError

C, H, W = 4, 16, 16


def write_cubes(folder, n, size=(H, W), ext="npy"):
    """n (C, h, w) cubes with distinct values (file i holds i * 1e4 + 0, 1, 2, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        cube = (i * 10_000 + np.arange(C * size[0] * size[1])).reshape(C, *size).astype(np.float32)
        paths.append(io.save_cube(folder / f"c{i:02d}.{ext}", cube, layout="chw"))
    return paths


def file_cube(path):
    return io.load_cube(path).data


def find_window(cube, patch):
    """(top, left) where patch == cube[:, top:top+h, left:left+w], else None."""
    h, w = patch.shape[-2:]
    for top in range(cube.shape[-2] - h + 1):
        for left in range(cube.shape[-1] - w + 1):
            if torch.equal(cube[:, top:top + h, left:left + w], patch):
                return top, left
    return None


def dihedral(x):
    """The 8 rotations/flips of (C, h, w)."""
    rots = [torch.rot90(x, k, (-2, -1)) for k in range(4)]
    return rots + [r.flip(-1) for r in rots]


# ----------------------------------------------------------------------------- SyntheticCubes

def test_synthetic_cubes_shapes_and_determinism():
    ds = SyntheticCubes(3, height=12, width=20, bands=5, seed=7)
    assert len(ds) == 3 and ds.seeds == range(7, 10)
    s = ds[1]
    assert s["x"].shape == (5, 12, 20) and s["x"].dtype == torch.float32 and s["name"] == "synthetic_8"
    assert torch.equal(s["x"], synthetic_cube(12, 20, 5, seed=8))
    assert torch.equal(SyntheticCubes(3, 12, 20, 5, seed=7)[1]["x"], s["x"])
    assert not torch.equal(ds[0]["x"], s["x"])
    assert SyntheticCubes(1, 8, 8, wavelengths="tsa")[0]["x"].shape == (28, 8, 8)


# ----------------------------------------------------------------------------- paths

def test_resolve_paths_folders_globs_and_errors(tmp_path, monkeypatch):
    paths = write_cubes(tmp_path / "a", 3)
    (tmp_path / "a" / "notes.txt").write_text("not data")
    assert any(p.suffix == ".json" for p in (tmp_path / "a").iterdir())  # .npy sidecars exist ...
    assert resolve_paths(tmp_path / "a") == sorted(p.resolve() for p in paths)  # ... but are skipped
    assert resolve_paths([str(tmp_path / "a" / "c0*"), paths[2], str(tmp_path / "a")]) == sorted(paths)
    monkeypatch.chdir(tmp_path)
    assert resolve_paths("a/c01.npy") == [paths[1].resolve()]  # absolute, so splits compare
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        CubeFiles(str(tmp_path / "nothing_here*.mat"))
    with pytest.raises(FileNotFoundError, match="missing.mat"):
        CubeFiles([paths[0], tmp_path / "missing.mat"])


# ----------------------------------------------------------------------------- CubeFiles

def test_cube_files_whole_cubes_and_center_crop(tmp_path):
    paths = write_cubes(tmp_path, 2)
    ds = CubeFiles(tmp_path)
    assert len(ds) == 2 and [ds[i]["name"] for i in range(2)] == ["c00", "c01"]
    assert torch.equal(ds[1]["x"], file_cube(paths[1]))
    x = CubeFiles(tmp_path, crop_to=(6, 10))[0]["x"]
    assert torch.equal(x, file_cube(paths[0])[:, 5:11, 3:13])


def test_cube_files_random_crops_are_sub_arrays_and_deterministic(tmp_path):
    paths = write_cubes(tmp_path, 3)
    ds = CubeFiles(tmp_path, patch_size=(6, 8), samples_per_epoch=12, seed=3)
    assert len(ds) == 12
    corners = set()
    for i in range(12):
        s = ds[i]
        assert s["x"].shape == (C, 6, 8) and s["name"] == paths[i % 3].stem
        corner = find_window(file_cube(paths[i % 3]), s["x"])
        assert corner is not None
        corners.add(corner)
    assert len(corners) > 3  # crops move around
    again = CubeFiles(tmp_path, patch_size=(6, 8), samples_per_epoch=12, seed=3)
    assert all(torch.equal(ds[i]["x"], again[i]["x"]) for i in range(12))
    other = CubeFiles(tmp_path, patch_size=(6, 8), samples_per_epoch=12, seed=4)
    assert any(not torch.equal(ds[i]["x"], other[i]["x"]) for i in range(12))
    first = [ds[i]["x"] for i in range(12)]
    ds.set_epoch(1)
    assert any(not torch.equal(first[i], ds[i]["x"]) for i in range(12))  # new crops every epoch


def test_cube_files_augmentation_is_a_rotation_or_flip(tmp_path):
    paths = write_cubes(tmp_path, 1)
    cube = file_cube(paths[0])
    ds = CubeFiles(tmp_path, patch_size=W, samples_per_epoch=24, augment=True)
    used = set()
    for i in range(len(ds)):
        x = ds[i]["x"]
        for c in range(C):  # band order untouched, each band's multiset of values preserved
            assert torch.equal(x[c].flatten().sort().values, cube[c].flatten().sort().values)
        matches = [k for k, t in enumerate(dihedral(cube)) if torch.equal(t, x)]
        assert matches
        used.add(matches[0])
    assert len(used) == 8
    rect = CubeFiles(tmp_path, patch_size=(8, 16), samples_per_epoch=8, augment=True)
    assert all(rect[i]["x"].shape == (C, 8, 16) for i in range(8))  # only 180° turns off-square


@pytest.mark.parametrize("size", [8, 9])
def test_cube_files_mosaic_quadrants_come_from_the_named_files(tmp_path, size):
    paths = {p.stem: p for p in write_cubes(tmp_path, 4)}
    ds = CubeFiles(tmp_path, patch_size=size, samples_per_epoch=6, mosaic=True)
    for i in range(len(ds)):
        s = ds[i]
        stems = s["name"].split("+")
        assert s["x"].shape == (C, size, size) and len(stems) == 4
        a, b = size // 2, size - size // 2
        quads = [s["x"][:, :a, :a], s["x"][:, :a, a:], s["x"][:, a:, :a], s["x"][:, a:, a:]]
        assert [tuple(q.shape[-2:]) for q in quads] == [(a, a), (a, b), (b, a), (b, b)]
        for stem, q in zip(stems, quads):
            assert find_window(file_cube(paths[stem]), q) is not None
    with pytest.raises(ValueError, match="patch_size"):
        CubeFiles(tmp_path, mosaic=True)


def test_cube_files_relight_scales_each_band_by_a_smooth_gain(tmp_path):
    write_cubes(tmp_path, 2, size=(12, 12))
    plain = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=16, augment=True)
    lit = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=16, augment=True, relight=1.0)
    t = torch.linspace(-1, 1, C, dtype=torch.float64)
    basis = torch.stack([torch.ones_like(t), t, t ** 2 - 1 / 3], 1)  # log-gain = log a + b·t + c·(t² − 1/3)
    gains = []
    for i in range(len(lit)):
        x, x_lit = plain[i]["x"].double(), lit[i]["x"].double()  # same crop and symmetry, then the light
        g = x_lit.sum(dim=(1, 2)) / x.sum(dim=(1, 2))
        assert torch.allclose(x_lit, x * g[:, None, None], rtol=1e-5)  # one gain per band
        coef = torch.linalg.lstsq(basis, g.log()[:, None]).solution[:, 0]
        assert torch.allclose(basis @ coef, g.log(), atol=1e-5)  # smooth: exactly that family
        assert math.log(0.6) - 1e-6 <= coef[0] <= math.log(1.6) + 1e-6 and coef[1:].abs().max() <= 0.5 + 1e-6
        gains.append(g)
    assert torch.stack(gains).std(0).min() > 0.05  # the light differs from sample to sample
    assert torch.equal(lit[3]["x"], lit[3]["x"])  # seeded per (seed, epoch, index)
    half = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=64, relight=0.5)
    ref = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=64)
    changed = sum(not torch.equal(half[i]["x"], ref[i]["x"]) for i in range(64))
    assert 16 <= changed <= 48
    with pytest.raises(ValueError, match="relight"):
        CubeFiles(tmp_path, relight=1.5)


def test_cube_files_shade_multiplies_by_light_changing_smoothly_across_the_crop(tmp_path):
    write_cubes(tmp_path, 2, size=(12, 12))
    plain = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=16, augment=True)
    shaded = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=16, augment=True, shade=1.0)
    t, u = torch.linspace(-1, 1, C, dtype=torch.float64), torch.linspace(-1, 1, 8, dtype=torch.float64)
    # linear across the crop in every band: a plane d_c·u + e_c·v through the crop's centre
    basis = torch.stack([u[:, None].expand(8, 8), u[None, :].expand(8, 8)], -1).reshape(64, 2)
    fields = []
    for i in range(len(shaded)):
        x, x_s = plain[i]["x"].double(), shaded[i]["x"].double()  # same crop and symmetry, then the light
        g = (x_s / x).log()  # (C, h, w): (d·u + e·v)·(1 + f·t)
        coef = torch.linalg.lstsq(basis, g.reshape(C, 64).T).solution  # (2, C)
        assert torch.allclose((basis @ coef).T.reshape(C, 8, 8), g, atol=1e-4)
        # the plane of band c is the plane of the middle band times 1 + f·t_c (colour changes with the light)
        mid = 0.5 * (coef[:, C // 2 - 1] + coef[:, C // 2])  # t = 0 lies between the two middle bands
        scale = coef.T @ mid / (mid @ mid)  # (C,) = 1 + f·t
        f = torch.linalg.lstsq(t[:, None], scale[:, None] - 1).solution[0, 0]
        assert torch.allclose(scale, 1 + f * t, atol=1e-4) and abs(f) <= 0.5 + 1e-4
        assert mid.abs().max() <= 0.5 + 1e-4
        fields.append(mid)
    assert torch.stack(fields).std(0).min() > 0.05  # the light differs from sample to sample
    half = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=64, shade=0.5)
    ref = CubeFiles(tmp_path, patch_size=8, samples_per_epoch=64)
    changed = sum(not torch.equal(half[i]["x"], ref[i]["x"]) for i in range(64))
    assert 16 <= changed <= 48
    with pytest.raises(ValueError, match="shade"):
        CubeFiles(tmp_path, shade=-0.1)


def test_cube_smaller_than_patch_names_the_file(tmp_path):
    write_cubes(tmp_path, 1)
    small = io.save_cube(tmp_path / "tiny.npy", np.ones((C, 6, 6), np.float32), layout="chw")
    ds = CubeFiles(tmp_path, patch_size=8)
    ds[0]
    with pytest.raises(DataFileError, match="tiny.npy.*6×6.*8×8"):
        ds[1]
    with pytest.raises(DataFileError, match="tiny.npy.*crop_to"):
        CubeFiles(small, crop_to=7)[0]


@pytest.mark.parametrize("cache", [False, 3])
def test_cube_files_hold_at_most_cache_cubes(tmp_path, monkeypatch, cache):
    write_cubes(tmp_path, 30)
    live, loads = weakref.WeakSet(), []
    real_load = io.load_cube

    def tracked(*args, **kwargs):
        cube = real_load(*args, **kwargs)
        live.add(cube.data)
        loads.append(args[0])
        return cube

    monkeypatch.setattr(io, "load_cube", tracked)
    ds = CubeFiles(str(tmp_path / "*.npy"), patch_size=8, samples_per_epoch=60, cache=cache)
    kept, peak = [], 0
    gc.collect()
    for sample in ds:  # the samples (and batches) stay alive, the file cubes must not (freed by refcount)
        kept.append(sample)
        peak = max(peak, len(live))
    for batch in DataLoader(ds, batch_size=4):
        kept.append(batch)
        peak = max(peak, len(live))
    assert len(kept) == 75 and len(loads) >= 60
    assert peak <= (cache or 0)
    assert len(ds._cache) <= (cache or 0)


def test_cube_files_resample_shared_cave_31_to_tsa_28(shared_data):
    ds = CubeFiles(shared_data / "cave" / "*.mat", key="Omsi", layout="hwc",
                   source_wavelengths="cave", wavelengths="tsa")
    assert [ds[i]["name"] for i in range(3)] == ["cave_balloons_100", "cave_chart_toy_150", "cave_feathers_150"]
    raw = io.load_cube(shared_data / "cave" / "cave_balloons_100.mat", key="Omsi", layout="hwc").data
    x = ds[0]["x"]
    assert raw.shape == (31, 100, 100) and x.shape == (28, 100, 100)
    # 453.3 nm lies 0.33 of the way from 450 nm (band 5) to 460 nm (band 6); 648.1 nm from 640 (24) to 650 (25)
    assert torch.allclose(x[0], 0.67 * raw[5] + 0.33 * raw[6], atol=1e-6)
    assert torch.allclose(x[27], 0.19 * raw[24] + 0.81 * raw[25], atol=1e-6)
    assert ds[2]["x"].shape == (28, 150, 150)
    with pytest.raises(DataFileError, match="cave_balloons_100.mat.*source_wavelengths"):
        CubeFiles(shared_data / "cave", key="Omsi", layout="hwc", wavelengths="tsa")[0]


# ----------------------------------------------------------------------------- MeasurementFiles

def test_measurement_files_read_the_real_shared_data(shared_data):
    ds = MeasurementFiles(str(shared_data / "real" / "tsa_real_scene*.mat"),
                          mask=shared_data / "masks" / "tsa_real_mask_660.mat", bands=28, step=2)
    assert len(ds) == 5
    mask = io.load_mask(shared_data / "masks" / "tsa_real_mask_660.mat")
    for i in range(5):
        s = ds[i]
        assert s["name"] == f"tsa_real_scene{i + 1}" and "x" not in s
        assert s["y"].shape == (1, 660, 714) and s["mask"].shape == (1, 660, 660)
    assert torch.equal(s["mask"][0], mask)
    wrong = MeasurementFiles(shared_data / "real", mask=shared_data / "masks" / "tsa_simu_mask_256.mat", bands=28)
    with pytest.raises(DataFileError, match="tsa_real_scene1.mat.*256"):
        wrong[0]
    with pytest.raises(DataFileError, match="tsa_real_scene2.mat"):
        MeasurementFiles(shared_data / "real", mask=mask, bands=28, step=1)[1]


def test_measurement_files_entries_masks_and_ground_truth(tmp_path):
    mask = torch.rand(8, 8) + 0.1
    for name in ("a", "b"):
        io.save_measurement(tmp_path / "meas" / f"{name}.npy", torch.rand(1, 8, 8 + 6))
        io.save_cube(tmp_path / "gt" / f"{name}.npy", torch.rand(4, 8, 8), layout="chw")
    ds = MeasurementFiles(tmp_path / "meas", mask=mask, gt=tmp_path / "gt", bands=4, step=2)
    s = ds[1]
    assert s["name"] == "b" and s["x"].shape == (4, 8, 8) and torch.equal(s["mask"][0], mask)
    assert torch.equal(s["x"], io.load_cube(tmp_path / "gt" / "b.npy").data)
    io.save_mask(tmp_path / "m3.npy", torch.rand(4, 8, 8) + 0.1)
    one = MeasurementFiles([{"y": tmp_path / "meas" / "a.npy", "mask": tmp_path / "m3.npy", "name": "A"}], step=2)
    assert one[0]["mask"].shape == (4, 8, 8) and one[0]["name"] == "A"
    io.save_measurement(tmp_path / "meas" / "c.npy", torch.rand(1, 8, 14))
    with pytest.raises(DataFileError, match="c.npy.*ground-truth"):
        MeasurementFiles(tmp_path / "meas", mask=mask, gt=tmp_path / "gt", bands=4)
    with pytest.raises(ValueError, match="mask"):
        MeasurementFiles(tmp_path / "meas", bands=4)


def test_cube_files_spectral_shift_moves_every_band_centre_by_one_clipped_offset(tmp_path):
    # x[c, h, w] = 1000·(12h + w) + 2·λ_c: linear in λ, so resampling at λ + δ gives the window + 2(λ + δ)
    a = 1000.0 * np.arange(144, dtype=np.float64).reshape(12, 12)
    cave = np.asarray(io.CAVE_WAVELENGTHS, dtype=np.float64)
    io.save_cube(tmp_path / "lin.npy", (a[None] + 2 * cave[:, None, None]).astype(np.float32), layout="chw")

    def shifts(ds):
        out = []
        for i in range(len(ds)):
            v = ds[i]["x"].double() - 2 * torch.tensor(ds.wavelengths, dtype=torch.float64)[:, None, None]
            assert torch.allclose(v, v[:1].expand_as(v), atol=0.05)  # one offset for every band
            d = float(v[0, 0, 0]) - 1000 * round(float(v[0, 0, 0]) / 1000)
            assert find_window(torch.from_numpy(a)[None].round(), (v[:1] - d).round()) is not None  # a window
            out.append(d / 2)
        return torch.tensor(out)

    kw = dict(source_wavelengths="cave", patch_size=8, samples_per_epoch=48)
    d = shifts(CubeFiles(tmp_path, wavelengths=[450, 500, 550, 600], spectral_shift=30, **kw))
    assert d.abs().max() <= 30 + 0.05 and d.std() > 8  # U(−30, 30), drawn per sample
    assert shifts(CubeFiles(tmp_path, wavelengths=[450, 500, 550, 600], **kw)).abs().max() < 0.05  # default: none
    # the source's range clips the offset: 400 − 420 = −20 … 700 − 690 = +10
    d = shifts(CubeFiles(tmp_path, wavelengths=[420, 500, 600, 690], spectral_shift=50, **kw))
    assert d.min() > -20 - 0.05 and d.max() < 10 + 0.05
    assert (d - -20).abs().min() < 0.05 and (d - 10).abs().min() < 0.05
    ds = CubeFiles(tmp_path, wavelengths=[450, 500, 550, 600], spectral_shift=30, **kw)
    assert torch.equal(ds[5]["x"], ds[5]["x"])  # seeded per (seed, epoch, index)
    mosaic = CubeFiles(tmp_path, wavelengths=[450, 500, 550, 600], spectral_shift=30, mosaic=1.0, **kw)
    for i in range(8):  # the four quarters of a mosaic share the sample's offset
        v = mosaic[i]["x"].double() - 2 * torch.tensor(mosaic.wavelengths, dtype=torch.float64)[:, None, None]
        d = float(v[0, 0, 0]) - 1000 * round(float(v[0, 0, 0]) / 1000)
        assert torch.allclose((v - d) / 1000, ((v - d) / 1000).round(), atol=1e-4)
    unshifted = torch.from_numpy(a)[None] + 2 * torch.tensor([450., 500, 550, 600])[:, None, None]
    assert torch.allclose(ds.cube(0).double(), unshifted)  # cube(): the file at the wavelengths themselves
    with pytest.raises(ValueError, match="spectral_shift and spectral_stretch need wavelengths"):
        CubeFiles(tmp_path, spectral_shift=10)
    with pytest.raises(ValueError, match="spectral_shift"):
        CubeFiles(tmp_path, wavelengths="tsa", source_wavelengths="cave", spectral_shift=-1)
    with pytest.raises(DataFileError, match="lin.npy"):  # a target outside the file's range: named at load
        CubeFiles(tmp_path, wavelengths=[380, 500], spectral_shift=10, **kw)[0]


def test_cube_files_spectral_stretch_spreads_the_band_centres_about_their_middle(tmp_path):
    # x[c, h, w] = 1000·(12h + w) + 2·λ_c: resampled at λ'_c, x − 2λ_c = window + 2(λ'_c − λ_c)
    a = 1000.0 * np.arange(144, dtype=np.float64).reshape(12, 12)
    cave = np.asarray(io.CAVE_WAVELENGTHS, dtype=np.float64)
    io.save_cube(tmp_path / "lin.npy", (a[None] + 2 * cave[:, None, None]).astype(np.float32), layout="chw")
    kw = dict(source_wavelengths="cave", patch_size=8, samples_per_epoch=48)

    def moved(ds):
        """Per sample, λ' − λ of every band (the window's part removed)."""
        out = []
        for i in range(len(ds)):
            v = ds[i]["x"].double() - 2 * torch.tensor(ds.wavelengths, dtype=torch.float64)[:, None, None]
            d = v[:, 0, 0] - 1000 * torch.round(v[0, 0, 0] / 1000)
            assert torch.allclose(v - v[:, :1, :1], (v - v[:, :1, :1])[:1].expand_as(v), atol=0.05)  # per band
            out.append(d / 2)
        return torch.stack(out)

    wl = torch.tensor([450.0, 500, 550, 600])
    m = moved(CubeFiles(tmp_path, wavelengths=wl.tolist(), spectral_stretch=0.3, **kw))
    sigma = m[:, -1] / (wl[-1] - 525)  # λ' = 525 + (λ − 525)(1 + σ): the middle stays, the ends move most
    assert torch.allclose(m, sigma[:, None] * (wl - 525), atol=0.05)
    assert sigma.abs().max() <= 0.3 + 1e-3 and sigma.abs().max() > 0.25 and sigma.std() > 0.08  # U(−0.3, 0.3)
    mosaic = CubeFiles(tmp_path, wavelengths=wl.tolist(), spectral_stretch=0.3, mosaic=1.0, **kw)
    for i in range(8):  # the four quarters of a mosaic share the sample's stretch: 2(λ'_c − λ'_0) at a pixel of each
        x = mosaic[i]["x"].double()[:, ::4, ::4]
        rel = x - x[:1]
        assert torch.allclose(rel, rel[:, :1, :1].expand_as(rel), atol=0.05)

    def corner(ds, i):
        """(top, left) of sample i's window: x − 2λ at its first pixel is 1000·(12·top + left) + 2(λ' − λ)."""
        v = float(ds[i]["x"].double()[0, 0, 0]) - 2 * ds.wavelengths[0]
        return divmod(round(v / 1000), 12)

    def drawn(ds, i, uniforms):
        """The window that sample i's generator gives after ``uniforms`` draws (shift, then stretch)."""
        g = torch.Generator().manual_seed(stable_seed(ds.seed, ds.epoch, i))
        for _ in range(uniforms):
            torch.rand((), generator=g)
        return tuple(int(torch.randint(12 - 8 + 1, (), generator=g)) for _ in range(2))

    # one draw per option that is on, none for one that is off: pools made before the stretch stay reproducible
    for opts, uniforms in (({}, 0), ({"spectral_shift": 30}, 1), ({"spectral_stretch": 0.3}, 1),
                           ({"spectral_shift": 30, "spectral_stretch": 0.3}, 2)):
        ds = CubeFiles(tmp_path, wavelengths=wl.tolist(), **opts, **kw)
        assert [corner(ds, i) for i in range(len(ds))] == [drawn(ds, i, uniforms) for i in range(len(ds))]
    m = moved(ds)  # both on: δ is the first draw, σ the second
    for i in range(len(ds)):
        g = torch.Generator().manual_seed(stable_seed(ds.seed, ds.epoch, i))
        u_shift, u_stretch = (float(torch.rand((), generator=g)) for _ in range(2))
        assert abs((m[i, -1] - m[i, 0]) / (wl[-1] - wl[0]) - 0.3 * (2 * u_stretch - 1)) < 1e-3
        assert abs(m[i, 1] - 0.3 * (2 * u_stretch - 1) * (wl[1] - 525) - 30 * (2 * u_shift - 1)) < 0.05
    assert moved(CubeFiles(tmp_path, wavelengths=wl.tolist(), **kw)).abs().max() < 0.05  # default: none
    # 410 … 690 spread by up to 1.5 must stay in the file's 400 … 700: at most 300/280, then moved inside
    m = moved(CubeFiles(tmp_path, wavelengths=[410, 550, 690], spectral_stretch=0.5, spectral_shift=30, **kw))
    target = torch.tensor([410.0, 550, 690]) + m
    assert (target[:, -1] - target[:, 0]).max() > 300 - 0.1  # the widest spread fills the range, no more
    with pytest.raises(ValueError, match="spectral_stretch"):
        CubeFiles(tmp_path, wavelengths="tsa", source_wavelengths="cave", spectral_stretch=1.0)
    with pytest.raises(ValueError, match="need wavelengths"):
        CubeFiles(tmp_path, spectral_stretch=0.2)


def test_cube_files_zoom_reads_windows_of_random_scale_resized_to_the_patch(tmp_path):
    # x[c, h, w] = w: a crop read over a window s times the patch and resized has slope s along w, none along h
    ramp = np.broadcast_to(np.arange(64, dtype=np.float32), (2, 64, 64)).copy()
    io.save_cube(tmp_path / "ramp.npy", ramp, layout="chw")
    kw = dict(patch_size=16, samples_per_epoch=64)

    def slopes(ds):
        out = []
        for i in range(len(ds)):
            x = ds[i]["x"].double()
            assert x.shape == (2, 16, 16) and torch.equal(x[0], x[1])
            assert torch.allclose(x, x[:, :1].expand_as(x), atol=1e-5)  # nothing along h
            assert x.min() >= 0 and x.max() <= 63  # inside the file
            d = x[0, 0, 1:] - x[0, 0, :-1]
            assert (d[4:-4] > 0).all()  # rising; inside (the filter clamps at the edges) the window's scale on average
            out.append(float(d[4:-4].mean()))
        return torch.tensor(out)

    s = slopes(CubeFiles(tmp_path, zoom=1, **kw))
    assert s.min() >= 0.5 - 0.04 and s.max() <= 2 + 0.04  # 2^U(−1, 1), on a whole number of pixels
    assert s.min() < 0.7 and s.max() > 1.6 and ((s - 1).abs() > 0.1).float().mean() > 0.5
    assert torch.equal(slopes(CubeFiles(tmp_path, **kw)), torch.ones(64, dtype=torch.float64))  # default: none
    assert slopes(CubeFiles(tmp_path, zoom=3, **kw)).max() <= 4 + 0.04  # at most the whole file (64 = 4 × 16)
    wide = CubeFiles(tmp_path, zoom=3, patch_size=(16, 8), samples_per_epoch=32)
    for i in range(len(wide)):  # scaled alike along both axes: at most 64/16 = 4 along h, so ≤ 32 wide along w
        d = wide[i]["x"][0, 0, 1:] - wide[i]["x"][0, 0, :-1]
        assert float(d[2:-2].mean()) <= 4 + 0.04
    with pytest.raises(ValueError, match="zoom"):
        CubeFiles(tmp_path, zoom=-1, **kw)
    with pytest.raises(ValueError, match="zoom needs patch_size"):
        CubeFiles(tmp_path, zoom=1, crop_to=16)


def test_cube_files_crop_grid_gives_fixed_windows_from_edge_to_edge(tmp_path, monkeypatch):
    paths = write_cubes(tmp_path, 2, size=(12, 14))
    for n, tops, lefts in ((2, [0, 4], [0, 6]), (3, [0, 2, 4], [0, 3, 6])):
        ds = CubeFiles(tmp_path, crop_to=8, crop_grid=n)
        assert len(ds) == 2 * n * n
        for i in range(len(ds)):
            f, k = divmod(i, n * n)
            top, left = tops[k // n], lefts[k % n]
            cube = file_cube(paths[f])
            assert torch.equal(ds[i]["x"], cube[:, top:top + 8, left:left + 8])
            assert ds[i]["name"] == f"c{f:02d}_y{top}x{left}"
    assert len({s["name"] for s in CubeFiles(tmp_path, crop_to=8, crop_grid=2)}) == 8  # distinct names
    loads, load = [], io.load_cube
    monkeypatch.setattr(io, "load_cube", lambda *a, **k: loads.append(a) or load(*a, **k))
    assert len([s for s in CubeFiles(tmp_path, crop_to=8, crop_grid=3)]) == 18 and len(loads) == 2  # a read per file
    monkeypatch.undo()
    one = CubeFiles(tmp_path, crop_to=8)  # the default: each file's centre
    assert len(one) == 2 and torch.equal(one[1]["x"], file_cube(paths[1])[:, 2:10, 3:11])
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="crop_grid must be an integer"):
            CubeFiles(tmp_path, crop_to=8, crop_grid=bad)
    with pytest.raises(ValueError, match="crop_grid needs crop_to"):
        CubeFiles(tmp_path, crop_grid=2)
    with pytest.raises(ValueError, match="crop_grid needs crop_to"):
        CubeFiles(tmp_path, crop_to=8, crop_grid=2, samples_per_epoch=4)
    with pytest.raises(ValueError, match="fixed evaluation windows"):
        CubeFiles(tmp_path, crop_to=8, crop_grid=2, augment=True)
    with pytest.raises(DataFileError, match="c00.npy.*too small for crop_grid=2"):  # windows would repeat
        CubeFiles(tmp_path, crop_to=12, crop_grid=2)[0]


def hostile_h5(path, shape=(200_000, 200_000)):
    """A ~1.4 KB HDF5 file declaring a huge gzip-compressed float32 dataset (149 GiB for 200000², fill value only)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=shape, dtype="f4", compression="gzip", chunks=(1,) * (len(shape) - 2) + (500, 500))
    return path


def test_measurement_files_check_headers_first_and_fail_per_file(tmp_path, monkeypatch):
    """skip_invalid: building the dataset reads headers only: files refused from them (a compressed HDF5
    declaring 149 GiB, a measurement of the wrong size) are listed in ``skipped`` with the declared shape.
    A file whose data fail later (NaN values; a MemoryError while reading) is that sample's failure,
    {"name", "error"}, which ``collate`` puts in batch["failed"] beside the good samples."""
    mask = torch.rand(8, 8) + 0.1  # 4 bands, step 2: y is 8×14
    for name in ("a", "b", "mem"):
        io.save_measurement(tmp_path / f"{name}.npy", torch.rand(1, 8, 14))
    io.save_measurement(tmp_path / "nan.npy", torch.full((1, 8, 14), float("nan")))
    io.save_measurement(tmp_path / "wide.npy", torch.rand(1, 8, 15))
    hostile_h5(tmp_path / "huge.h5")
    real = io.arrays._to_tensor
    reads = []

    def to_tensor(array, meta, max_value, dtype, path, what, clip_negative=False):  # the data reads
        reads.append(Path(path).stem)
        if Path(path).stem == "mem":
            raise MemoryError
        return real(array, meta, max_value, dtype, path, what, clip_negative)

    monkeypatch.setattr(io.arrays, "_to_tensor", to_tensor)
    ds = MeasurementFiles(tmp_path, mask=mask, bands=4, step=2, skip_invalid=True)
    assert reads == []  # headers only
    assert [Path(path).name for path, _ in ds.skipped] == ["huge.h5", "wide.npy"]
    huge, wide = (reason for _, reason in ds.skipped)
    assert huge == (f"{tmp_path / 'huge.h5'}: measurement of size 200000×200000 does not fit a 8×8 mask with "
                    "4 bands dispersed by 6 px along 'w': expected 8×14")
    assert wide.startswith(f"{tmp_path / 'wide.npy'}: measurement of size 8×15 does not fit")
    samples = [ds[i] for i in range(len(ds))]
    assert [s["name"] for s in samples] == ["a", "b", "mem", "nan"] and reads == ["a", "b", "mem", "nan"]
    assert samples[2] == {"name": "mem", "error": f"{tmp_path / 'mem.npy'}: not enough memory to load the "
                                                  "measurement 'meas' of declared shape (8, 14) float32 (448 B)"}
    assert samples[3] == {"name": "nan", "error": f"{tmp_path / 'nan.npy'}: measurement contains 112 NaN/Inf values"}
    batch = collate(samples)
    assert batch["name"] == ["a", "b"] and batch["y"].shape == (2, 1, 8, 14) and batch["mask"].shape == (2, 1, 8, 8)
    assert batch["failed"] == [("mem", samples[2]["error"]), ("nan", samples[3]["error"])]
    assert collate(samples[2:]) == {"name": [], "failed": batch["failed"]}
    assert "failed" not in collate(samples[:2])
    plain = MeasurementFiles(tmp_path / "mem.npy", mask=mask, bands=4)  # without skip_invalid: the error is raised
    with pytest.raises(DataFileError, match="mem.npy: not enough memory"):
        plain[0]


def test_masks_and_cubes_are_checked_against_the_frame_from_their_headers(tmp_path, small_memory):
    """A mask file of an entry's own, the ground truth and CubeFiles' cubes are refused from their headers:
    the mask against the measurement's frame, the cube against the mask's frame, patch_size and max_bytes."""
    io.save_measurement(y := tmp_path / "a.npy", torch.rand(1, 8, 14))
    huge_mask, huge_cube = hostile_h5(tmp_path / "mask.h5"), hostile_h5(tmp_path / "cube.h5", (4, 200_000, 200_000))
    entries = [{"y": y, "mask": huge_mask, "name": "own_mask"}, {"y": y, "gt": huge_cube, "name": "gt"}]
    with small_memory() as used:  # (a wrong reader fails at once with MemoryError)
        ds = MeasurementFiles(entries, mask=torch.rand(8, 8) + 0.1, bands=4, skip_invalid=True)
        with pytest.raises(DataFileError, match=re.escape(f"{huge_cube}: cube 'x' declares shape (4, 200000, 200000) "
                                                          "float32 (596 GiB once read): more than max_bytes")):
            CubeFiles(huge_cube)[0]
        with pytest.raises(DataFileError, match="cube.h5: cube of size 200000×200000 is smaller than the patch_size"):
            CubeFiles(huge_cube, patch_size=(8, 300_000))[0]
    assert used["peak"] < 16 * 2**20 and used["seconds"] < 1, used
    assert ds.entries == [] and [reason for _, reason in ds.skipped] == [
        f"{y}: measurement of size 8×14 does not fit a 200000×200000 mask with 4 bands dispersed by 6 px along 'w': "
        "expected 200000×200006",
        f"{huge_cube}: cube of size 200000×200000 does not match the 8×8 mask"]
