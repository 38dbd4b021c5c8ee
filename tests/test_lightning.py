"""The reconstruction LightningModule, the prediction writer and the results table."""
import json
from functools import partial

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from cassi import CASSI
from cassi.data.masks import bernoulli_mask
from cassi.data.synthetic import synthetic_batch
from cassi.lightning.callbacks import CubeWriter
from cassi.lightning.module import ReconstructionModule, summarize, write_table
from cassi.metrics import psnr
from cassi.solvers import GAPTV, PseudoInverse

B, C, H, W = 3, 8, 24, 24


def batches():
    x = synthetic_batch(B, H, W, bands=C, seed=3)
    mask = bernoulli_mask(H, W, seed=1, batch=B)  # (B, 1, H, W): one mask per scene
    y = CASSI(mask, bands=C, step=2, backend="loop")(x)
    return [{"x": x[i], "y": y[i], "mask": mask[i], "name": f"s{i}"} for i in range(B)]


def trainer(**kw):
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kw)


def module(solver):
    return ReconstructionModule(solver, partial(CASSI, bands=C, step=2, backend="strided"))


def test_test_step_scores_every_scene_and_gap_beats_pinv():
    loader = DataLoader(batches(), batch_size=2)
    rows = {}
    for name, solver in (("pinv", PseudoInverse()), ("gap", GAPTV(iters=30))):
        m = module(solver)
        metrics = trainer().test(m, loader, verbose=False)[0]
        assert [r["name"] for r in m.rows] == ["s0", "s1", "s2"]
        assert set(metrics) == {"test/psnr", "test/psnr_table", "test/ssim", "test/sam"}
        assert metrics["test/psnr"] == pytest.approx(summarize(m.rows)["psnr"], abs=1e-4)
        rows[name] = m.rows
    for p, g in zip(rows["pinv"], rows["gap"]):
        assert g["psnr"] > p["psnr"] + 3 and g["ssim"] > p["ssim"] and g["sam"] < p["sam"]
        assert g["iterations"] == 30 and p["iterations"] == 0 and g["time"] > 0


def test_predict_matches_direct_solver_call():
    data = batches()
    out = trainer().predict(module(GAPTV(iters=5)), DataLoader(data, batch_size=B))[0]
    x = torch.stack([d["x"] for d in data])
    op = CASSI(torch.stack([d["mask"] for d in data]), bands=C, step=2, backend="strided")
    direct = GAPTV(iters=5)(op, torch.stack([d["y"] for d in data]))
    torch.testing.assert_close(out["x"], direct.x)
    torch.testing.assert_close(out["metrics"]["psnr"], psnr(direct.x.clamp(0, 1), x))


def test_test_without_ground_truth_is_a_clear_error():
    data = [{k: v for k, v in d.items() if k != "x"} for d in batches()]
    with pytest.raises(ValueError, match="no 'x'"):
        trainer().test(module(PseudoInverse()), DataLoader(data, batch_size=1), verbose=False)


class Undershoot:
    """A reconstructor whose estimate has negative values, as TV estimates do at edges."""

    def __call__(self, op, y, gt=None):
        return op.pinv(y) - 0.5


def test_cube_writer_clamps_negative_estimates_so_they_load_back(tmp_path):
    writer = CubeWriter(tmp_path, fmt="mat")
    trainer(callbacks=[writer]).predict(module(Undershoot()), DataLoader(batches(), batch_size=B),
                                        return_predictions=False)
    from cassi.io import load_cube

    cubes = [load_cube(p).data for p in writer.written]
    assert len(cubes) == B and min(float(c.min()) for c in cubes) == 0.0


def test_cube_writer_writes_each_scene_and_survives_a_bad_one(tmp_path):
    data = batches()
    (tmp_path / "s1.tif").write_text("already here")  # s1 cannot be written (no overwrite)
    writer = CubeWriter(tmp_path, fmt="tif", wavelengths=list(range(500, 500 + C)))
    trainer(callbacks=[writer]).predict(module(PseudoInverse()), DataLoader(data, batch_size=B), return_predictions=False)
    assert sorted(p.name for p in writer.written) == ["s0.tif", "s2.tif"]
    assert [n for n, _ in writer.failed] == ["s1"]
    from cassi.io import load_cube

    cube = load_cube(tmp_path / "s0.tif")
    assert cube.data.shape == (C, H, W) and cube.wavelengths == list(range(500, 500 + C))
    assert (tmp_path / "s1.tif").read_text() == "already here"


def test_write_table(tmp_path):
    rows = [{"name": "a", "psnr": 30.0, "time": 1.0, "iterations": 10},
            {"name": "b", "psnr": 20.0, "time": 3.0, "iterations": 20}]
    md, csv, js = write_table(rows, tmp_path / "results", "GAP-TV")
    assert "| mean | 25.0000 | 2.0000 | 15.0000 |" in md.read_text()
    assert csv.read_text().splitlines()[0] == "name,psnr,time,iterations"
    assert json.loads(js.read_text())["mean"]["psnr"] == 25.0
    assert not list(tmp_path.glob(".*tmp*"))
