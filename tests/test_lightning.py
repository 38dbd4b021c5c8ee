"""The reconstruction LightningModule, the prediction writer and the results table."""
import json
from pathlib import Path
from functools import partial

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from cassi import CASSI
from cassi.data.synthetic import synthetic_batch
from cassi.lightning.callbacks import CubeWriter
from cassi.lightning.module import ReconstructionModule, summarize, write_table
from cassi.metrics import psnr
from cassi.physics.masks import bernoulli_mask
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
        assert set(metrics) == {"test/psnr", "test/psnr_table", "test/ssim", "test/ssim_table", "test/sam"}
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
    torch.testing.assert_close(out["residual"], direct.history["residual"][-1])  # ‖y − A x‖/‖y‖ per scene
    torch.testing.assert_close(out["metrics"]["psnr"], psnr(direct.x.clamp(0, 1), x))


def test_test_without_ground_truth_is_a_clear_error():
    data = [{k: v for k, v in d.items() if k != "x"} for d in batches()]
    with pytest.raises(ValueError, match="no 'x'"):
        trainer().test(module(PseudoInverse()), DataLoader(data, batch_size=1), verbose=False)


class Undershoot:
    """A reconstructor whose estimate has negative values, as TV estimates do at edges."""

    def __call__(self, op, y, gt=None):
        return op.pinv(y) - 0.5


class Counting:
    """The pseudo-inverse, counting the scenes it reconstructs; raises on the scenes listed in ``fail``."""

    def __init__(self, fail=()):
        self.calls, self.fail = 0, fail

    def __repr__(self):  # like the solvers' reprs: the same for the same settings (the writer compares them)
        return "Counting()"

    def __call__(self, op, y, gt=None):
        self.calls += y.shape[0]
        if self.calls in self.fail:
            raise RuntimeError("out of memory (simulated)")
        return op.pinv(y)


def test_cube_writer_clamps_negative_estimates_so_they_load_back(tmp_path):
    writer = CubeWriter(tmp_path, fmt="mat", preview=False)
    trainer(callbacks=[writer]).predict(module(Undershoot()), DataLoader(batches(), batch_size=B),
                                        return_predictions=False)
    from cassi.io import load_cube

    cubes = [load_cube(p).data for p in writer.written]
    assert len(cubes) == B and min(float(c.min()) for c in cubes) == 0.0


def test_cube_writer_writes_each_scene_and_survives_a_bad_one(tmp_path):
    (tmp_path / "reconstructions" / "s1.tif").mkdir(parents=True)  # s1's cube cannot be written there
    writer = CubeWriter(tmp_path, fmt="tif", wavelengths=list(range(500, 500 + C)), preview=False)
    trainer(callbacks=[writer]).predict(module(PseudoInverse()), DataLoader(batches(), batch_size=B),
                                        return_predictions=False)
    assert sorted(p.name for p in writer.written) == ["s0.tif", "s2.tif"]
    assert [n for n, _ in writer.failed] == ["s1"] and "IsADirectoryError" in writer.failed[0][1]
    from cassi.io import load_cube

    cube = load_cube(tmp_path / "reconstructions" / "s0.tif")
    assert cube.data.shape == (C, H, W) and cube.wavelengths == list(range(500, 500 + C))
    summary = json.loads((tmp_path / "summary.json").read_text())["scenes"]
    assert [(r["name"], r["status"]) for r in summary] == [("s0", "reconstructed"), ("s1", "failed"),
                                                          ("s2", "reconstructed")]
    assert not writer.complete("s1") and writer.complete("s0")


def test_a_reconstruction_that_raises_fails_its_scene_only(tmp_path):
    writer = CubeWriter(tmp_path, fmt="npy", preview=False)
    trainer(callbacks=[writer]).predict(module(Counting(fail=[2])), DataLoader(batches(), batch_size=1),
                                        return_predictions=False)
    assert writer.failed == [("s1", "RuntimeError: out of memory (simulated)")]
    assert sorted(p.name for p in (tmp_path / "reconstructions").iterdir() if p.suffix == ".npy") == ["s0.npy", "s2.npy"]


def test_complete_scenes_are_kept_and_the_rest_redone(tmp_path):
    def run(**kw):
        writer = CubeWriter(tmp_path, fmt="h5", wavelengths=list(range(500, 500 + C)), **kw)
        solver = Counting()
        m = ReconstructionModule(solver, partial(CASSI, bands=C, step=2, backend="strided"), skip=writer.complete)
        trainer(callbacks=[writer]).predict(m, DataLoader(batches(), batch_size=1), return_predictions=False)
        return solver.calls, {r["name"]: r["status"] for r in writer.rows}

    assert run() == (3, dict.fromkeys(["s0", "s1", "s2"], "reconstructed"))
    assert sorted(p.name for p in (tmp_path / "previews").iterdir()) == sorted(
        f"s{i}{k}.png" for i in range(3) for k in ("", "_bands", "_compare", "_spectra"))
    assert run() == (0, dict.fromkeys(["s0", "s1", "s2"], "complete: kept"))
    png = tmp_path / "previews" / "s1_bands.png"
    png.write_bytes(png.read_bytes()[:100])  # a damaged picture: s1 is no longer complete
    assert run() == (1, {"s0": "complete: kept", "s1": "reconstructed", "s2": "complete: kept"})
    (tmp_path / "scenes" / "s2.json").unlink()  # no record (e.g. interrupted before it): redone
    assert run()[0] == 1
    assert run(overwrite=True) == (3, dict.fromkeys(["s0", "s1", "s2"], "reconstructed"))
    assert run(preview=False)[0] == 0  # fewer outputs asked for: still complete
    kept = json.loads((tmp_path / "summary.json").read_text())["scenes"]
    assert all(r["psnr"] > 0 and r["residual"] >= 0 for r in kept)  # rows of kept scenes come from their records


def test_file_progress_counts_files_not_batches():
    from cassi.lightning.callbacks import FileProgress

    progress = FileProgress()
    trainer(callbacks=[progress]).predict(module(PseudoInverse()), DataLoader(batches(), batch_size=2),
                                          return_predictions=False)
    task = progress.progress.tasks[0]
    assert (task.total, task.completed) == (B, B)


def test_inputs_that_failed_to_load_are_reported_and_the_others_written(tmp_path):
    """Samples that failed to load ({"name", "error"}: MeasurementFiles(skip_invalid=True)) are collated into
    batch["failed"]: the writer fails those inputs only (a batch of failures alone included), the others of
    their batches are reconstructed and written, and the progress bar counts every input."""
    from cassi.data.datasets import collate
    from cassi.lightning.callbacks import FileProgress

    s0, s1, s2 = batches()
    bad = [{"name": f"bad{i}", "error": f"/in/bad{i}.mat: measurement contains {i} NaN/Inf values"} for i in (1, 2, 3)]
    writer, progress = CubeWriter(tmp_path, fmt="npy", preview=False), FileProgress()
    trainer(callbacks=[writer, progress]).predict(  # batches: [s0, bad1], [bad2, bad3], [s1, s2]
        module(PseudoInverse()), DataLoader([s0, *bad, s1, s2], batch_size=2, collate_fn=collate),
        return_predictions=False)
    assert writer.failed == [(b["name"], b["error"]) for b in bad]
    assert sorted(p.name for p in writer.written) == ["s0.npy", "s1.npy", "s2.npy"]
    statuses = {r["name"]: r["status"] for r in json.loads((tmp_path / "summary.json").read_text())["scenes"]}
    assert statuses == {"bad1": "failed", "bad2": "failed", "bad3": "failed", "s0": "reconstructed",
                        "s1": "reconstructed", "s2": "reconstructed"}
    assert (progress.progress.tasks[0].total, progress.progress.tasks[0].completed) == (6, 6)


def test_write_table(tmp_path):
    rows = [{"name": "a", "psnr": 30.0, "time": 1.0, "iterations": 10},
            {"name": "b", "psnr": 20.0, "time": 3.0, "iterations": 20}]
    md, csv, js = write_table(rows, tmp_path / "results", "GAP-TV")
    assert "| mean | 25.0000 | 2.0000 | 15.0000 |" in md.read_text()
    assert csv.read_text().splitlines()[0] == "name,psnr,time,iterations"
    assert json.loads(js.read_text())["mean"]["psnr"] == 25.0
    assert not list(tmp_path.glob(".*tmp*"))


def test_a_failing_baseline_keeps_the_methods_result_and_a_rerun_redoes_only_its_baseline(tmp_path):
    def run(baseline):
        writer = CubeWriter(tmp_path, fmt="npy", preview=False)
        m = ReconstructionModule(PseudoInverse(), partial(CASSI, bands=C, step=2, backend="strided"),
                                 skip=writer.complete, baseline=baseline)
        trainer(callbacks=[writer]).predict(m, DataLoader(batches(), batch_size=1), return_predictions=False)
        return writer, {r["name"]: r for r in writer.rows}

    writer, rows = run(Counting(fail=[2]))  # the baseline raises on the second scene
    assert writer.failed == [("s1", "baseline: RuntimeError: out of memory (simulated)")]
    assert sorted(p.name for p in (tmp_path / "reconstructions").glob("*.npy")) == ["s0.npy", "s1.npy", "s2.npy"]
    assert rows["s1"]["status"] == "reconstructed" and "baseline_psnr" not in rows["s1"]
    assert rows["s1"]["baseline_error"] == "RuntimeError: out of memory (simulated)"
    assert all("baseline_psnr" in rows[n] and "baseline_error" not in rows[n] for n in ("s0", "s2"))
    baseline = Counting()
    writer, rows = run(baseline)  # same baseline (same repr): only the scene whose baseline failed is redone
    assert baseline.calls == 1 and writer.failed == []
    assert {n: r["status"] for n, r in rows.items()} == {"s0": "complete: kept", "s1": "reconstructed",
                                                         "s2": "complete: kept"}
    writer, rows = run(None)  # without a baseline, scenes written beside one are redone
    assert {r["status"] for r in rows.values()} == {"reconstructed"}


def test_a_failed_baseline_leaves_no_baseline_pictures(tmp_path):
    """The record (hence the report) lists only pictures that exist: a baseline that failed this time has none,
    and those of an earlier run beside a working baseline are removed (also when no baseline runs now)."""
    def run(baseline, **kw):
        writer = CubeWriter(tmp_path, fmt="npy", **kw)
        m = ReconstructionModule(PseudoInverse(), partial(CASSI, bands=C, step=2, backend="strided"),
                                 skip=writer.complete, baseline=baseline)
        trainer(callbacks=[writer]).predict(m, DataLoader(batches(), batch_size=1), return_predictions=False)
        return writer

    run(Counting())
    assert (tmp_path / "previews" / "s1_baseline.png").is_file()
    run(Counting(fail=[2]), overwrite=True)  # the baseline fails on s1 this time
    record = json.loads((tmp_path / "scenes" / "s1.json").read_text())
    assert not {"baseline", "baseline_compare"} & set(record["files"]) and record["baseline"] is None
    assert not list((tmp_path / "previews").glob("s1_baseline*"))
    assert all((tmp_path / rel).is_file() for rel in record["files"].values())
    assert (tmp_path / "previews" / "s0_baseline_compare.png").is_file()
    run(None)  # without a baseline the scenes are redone, and no baseline picture is left beside them
    assert not list((tmp_path / "previews").glob("*_baseline*"))


class _RecordsProcessGroup(ReconstructionModule):
    """Writes, per rank, whether torch.distributed is still initialised once the module's teardown has run."""

    def __init__(self, folder):
        super().__init__(PseudoInverse(), partial(CASSI, bands=C, step=2, backend="strided"))
        self.folder = str(folder)

    def teardown(self, stage):
        super().teardown(stage)
        (Path(self.folder) / f"rank{self.global_rank}").write_text(str(torch.distributed.is_initialized()))


def test_spawned_ranks_release_the_process_group_before_they_exit(tmp_path):
    """ddp_spawn: each rank destroys its (gloo) process group in teardown, while the other rank is alive,
    instead of leaving it to interpreter exit (which raced the peer's exit and aborted a rank)."""
    m = _RecordsProcessGroup(tmp_path)
    L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False, enable_progress_bar=False,
              enable_model_summary=False).test(m, DataLoader(batches(), batch_size=1), verbose=False)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"rank0": "False", "rank1": "False"}


def test_the_printed_summary_fits_80_columns_and_cuts_no_cell(tmp_path):
    """What reconstruct.py prints: the columns a person reads, wrapped to the console, never cut to '…' (an
    80-column terminal showed `na… ps… ps… ss…`); the files keep every column."""
    from rich.console import Console

    writer = CubeWriter(tmp_path, fmt="npy", preview=False)
    scenes = batches()
    names = ["cave_superballs_y256x256", "a_very_long_measurement_file_name_from_camera_number_0017", "s2"]
    for scene, name in zip(scenes, names):
        scene["name"] = name
    m = ReconstructionModule(PseudoInverse(), partial(CASSI, bands=C, step=2, backend="strided"),
                             skip=writer.complete, baseline=Counting(fail=[3]))  # the last scene's baseline fails
    trainer(callbacks=[writer]).predict(m, DataLoader(scenes, batch_size=1), return_predictions=False)
    console = Console(width=80, record=True)
    console.print(writer.terminal_table())
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    head, body = text.split("─" * 10, 1)
    assert head.split()[-7:] == ["scene", "method", "PSNR", "SSIM", "time", "(s)", "status"]
    assert "residual" not in head and "SAM" not in head  # the few columns, not all fifteen
    rows = {r["name"]: r for r in writer.rows}
    line = next(ln for ln in body.splitlines() if ln.startswith("cave_superballs_y256x256"))  # a usual name fits
    row = rows["cave_superballs_y256x256"]
    assert line.split()[1:] == ["PseudoInverse", f"{row['psnr']:.2f}", f"{row['ssim']:.3f}", f"{row['time']:.3g}",
                                "reconstructed"]
    below = body.splitlines()[body.splitlines().index(line) + 1].split()  # the baseline beside it, on the next line
    assert below == ["Counting", f"{row['baseline_psnr']:.2f}", f"{row['baseline_ssim']:.3f}",
                     f"{row['baseline_time']:.3g}"]
    assert "failed" in body.split("s2", 1)[1].split("mean")[0]  # s2's baseline failed
    assert body.count("mean") == 1 and "Counting()" in body  # the means; the baseline in full below
    folded = "".join(line.split(" ")[0] for line in text.splitlines())  # the scene column, its lines joined
    assert names[1] in folded  # a name longer than its column is folded onto the next lines, not cut
    csv = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"psnr_table", "sam", "residual", "iterations", "baseline_psnr", "baseline_residual", "baseline_time",
            "baseline_error"} <= set(csv)  # the files have every column
