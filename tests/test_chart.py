"""The spectral test chart (cassi.data.chart): measured reflectances × illuminant in every patch, random charts for
training, the patch-spectra picture, the demo's configs; a tiny run of the chart reconstruct."""
import json
import os
import subprocess
import sys
from pathlib import Path

import colour
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image

from cassi import viz
from cassi.data.chart import (PATCH_NAMES, ColorChart, RandomCharts, checker_reflectances, color_chart,
                              illuminant_spectrum, random_chart)
from cassi.io import TSA_WAVELENGTHS
from cassi.lightning.callbacks import CubeWriter

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GRID = [450.0, 500.0, 550.0, 600.0, 650.0]  # on the 5 nm grid of the tabulated data: no interpolation


def test_chart_shape_range_and_regions():
    chart = color_chart()
    x, regions = chart["x"], chart["regions"]
    assert x.shape == (28, 256, 256) and x.dtype == torch.float32
    assert 0 <= float(x.min()) and float(x.max()) <= 1 and 0.8 < float(x.max())
    assert regions.shape == (256, 256) and sorted(regions.unique().tolist()) == list(range(25))
    assert all(int((regions == k).sum()) == 32 * 32 for k in range(1, 25))  # the 4 × 6 patches, 32 px squares
    assert torch.equal(color_chart()["x"], x)  # deterministic
    small = color_chart(64, 96)
    assert small["x"].shape == (28, 64, 96) and sorted(small["regions"].unique().tolist()) == list(range(25))


def test_every_patch_carries_its_measured_reflectance_times_d65():
    """At wavelengths on the data's 5 nm grid, each patch pixel is colour-science's tabulated reflectance (Ohta) × its
    tabulated D65, times one scalar per pixel (shading and texture, about 1 on average)."""
    chart = color_chart(128, 128, wavelengths=GRID)
    x, regions = chart["x"].double(), chart["regions"]
    sds = colour.SDS_COLOURCHECKERS["ColorChecker N Ohta"]
    d65 = np.array([colour.SDS_ILLUMINANTS["D65"][w] for w in GRID])
    for k, name in enumerate(PATCH_NAMES, start=1):
        truth = torch.tensor([sds[name][w] for w in GRID] * d65, dtype=torch.float64)
        pixels = x[:, regions == k]  # (C, n)
        scale = pixels / truth[:, None]  # the same scalar for every band of a pixel
        assert torch.allclose(scale, scale[:1].expand_as(scale), rtol=1e-5), name
        known = chart["spectra"][k - 1] / truth  # the stated spectrum: the same up to the chart's gain
        assert torch.allclose(known, known[:1].expand_as(known), rtol=1e-9)
        assert 0.75 < float(scale.mean() / known[0]) < 1.05  # shading and texture ≈ 1 over the patch
    white = chart["spectra"][PATCH_NAMES.index("white 9.5 (.05 D)")]
    assert float(white.max()) == pytest.approx(0.9)


def test_reflectances_and_illuminants():
    r = checker_reflectances("tsa")
    assert r.shape == (24, 28) and 0 < float(r.min()) and float(r.max()) < 1
    for light in ("D65", 5000, ("D", 6500)):
        e = illuminant_spectrum(light, TSA_WAVELENGTHS)
        assert e.shape == (28,) and float(e.max()) == pytest.approx(1.0) and float(e.min()) > 0.3
    assert torch.allclose(illuminant_spectrum(("D", 6504), GRID), illuminant_spectrum("D65", GRID), rtol=0.01)
    with pytest.raises(ValueError, match="unknown illuminant"):
        illuminant_spectrum("nope")


def test_random_charts_are_varied_deterministic_and_never_the_test_chart():
    a, b = random_chart(64, 80, seed=3), random_chart(64, 80, seed=3)
    assert torch.equal(a["x"], b["x"]) and a["x"].shape == (28, 64, 80)
    assert 0 <= float(a["x"].min()) and 0.6 <= float(a["x"].max()) <= 1.0
    assert (a["x"] - random_chart(64, 80, seed=4)["x"]).abs().mean() > 0.01
    test = color_chart(64, 80)["x"]
    assert all((random_chart(64, 80, seed=s)["x"] - test).abs().mean() > 0.01 for s in range(5))
    ds = RandomCharts(2, 32, 32, seed=1000000)
    item = ds[1]
    assert len(ds) == 2 and item["name"] == "chart_1000001" and item["x"].shape == (28, 32, 32)
    assert item["regions"].shape == (32, 32)


def test_color_chart_dataset():
    ds = ColorChart(32, 48)
    item = ds[0]
    assert len(ds) == 1 and item["name"] == "colorchecker_d65" and item["x"].shape == (28, 32, 48)
    assert item["regions"].max() == 24 and ds.region_names[0] == "dark skin" and len(ds.wavelengths) == 28
    assert ds.spectra.shape == (24, 28)


def test_patch_spectra_picture(tmp_path):
    chart = color_chart(64, 64)
    gt = chart["x"]
    path = viz.save_patch_spectra(tmp_path / "p.png", gt, chart["regions"], {"learned": gt * 0.98, "GAP-TV": gt * 0.9},
                                  list(TSA_WAVELENGTHS), PATCH_NAMES)
    assert Image.open(path).size[0] == 900  # 6 plots across
    with pytest.raises(ValueError, match="no region"):
        viz.save_patch_spectra(tmp_path / "q.png", gt, torch.zeros(64, 64, dtype=torch.long), {}, None)


def test_cube_writer_writes_patch_spectra_when_the_scene_has_regions(tmp_path):
    chart = color_chart(32, 48)
    gt = chart["x"]
    writer = CubeWriter(tmp_path, fmt="npy", wavelengths="tsa", meta={"bands": 28})
    plain = writer._write_scene("plain", gt, gt, {"name": "plain"})
    assert "patch_spectra" not in plain
    files = writer._write_scene("chart", gt * 0.9, gt, {"name": "chart"}, regions=chart["regions"])
    Image.open(tmp_path / files["patch_spectra"]).load()
    assert files["patch_spectra"] == "previews/chart_patch_spectra.png"
    page = viz.report_html([{"name": "chart", "psnr": 30.0, "files": files}], "t")
    assert 'src="previews/chart_patch_spectra.png"' in page
    writer._records.clear()
    assert writer.complete("chart")
    (tmp_path / files["patch_spectra"]).unlink()  # a picture only this scene has: not complete without it
    writer._records.clear()
    assert not writer.complete("chart")


def test_the_demo_configs_compose_and_keep_the_test_chart_out_of_training(tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        demo = compose("reconstruct", overrides=["data=chart", "ckpt=pretrained/chart_demo"])
        train = compose("train", overrides=["experiment=chart_demo", f"paths.output_dir={tmp_path}"])
        card = compose("model_card", overrides=["ckpt=x", "name=chart_demo", "data@validation=chart_val",
                                                "data@test=chart"])
    assert demo.data.predict._target_ == "cassi.data.chart.ColorChart" and demo.data.predict.illuminant == "D65"
    assert train.model._target_ == "cassi.models.Refiner" and train.data.train.cubes._target_.endswith("RandomCharts")
    assert card.validation.test.seed == train.data.val.seed and card.test.test._target_.endswith("ColorChart")
    dm = instantiate(train.data)  # the splits are checked to be disjoint here
    assert isinstance(dm.datasets["test"], ColorChart)
    assert set(dm.datasets["train"].seeds).isdisjoint(dm.datasets["val"].seeds)
    # the chart is measured through the camera: Bernoulli(0.5) by default, or what camera.* says
    with initialize_config_dir(str(CONF), version_base="1.3"):
        blocks = compose("reconstruct", overrides=["data=chart", "camera.masks=blocks", "camera.fill=0.3"])
    assert type(instantiate(demo.data).simulator.masks).__name__ == "BernoulliMasks"
    masks = instantiate(blocks.data).simulator.masks
    assert type(masks).__name__ == "BlockMasks" and masks.p == 0.3


def test_a_tiny_chart_reconstruct_writes_the_patch_spectra(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "reconstruct.py"), f"output_dir={out}", "data=chart",
                        "ckpt=pretrained/chart_demo", "data.test.height=32", "data.test.width=48", "trainer.accelerator=cpu",
                        "operator.backend=strided", "solver.iters=5"], cwd=tmp_path,
                       env=dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    Image.open(out / "previews" / "colorchecker_d65_patch_spectra.png").load()
    row = json.loads((out / "scenes" / "colorchecker_d65.json").read_text())
    assert row["files"]["patch_spectra"] == "previews/colorchecker_d65_patch_spectra.png"
    assert "baseline_psnr" in row["row"] and "colorchecker_d65_patch_spectra.png" in (out / "index.html").read_text()
