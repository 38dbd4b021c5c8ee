"""The Hydra entry points, run as a user runs them (subprocesses), on tiny problems."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SMALL = ["data.test.n=2", "data.test.height=32", "data.test.width=40", "trainer=cpu"]


def run(script, *overrides, cwd=ROOT, stderr=False):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *overrides], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{script} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout + (r.stderr if stderr else "")


def test_evaluate_writes_a_table_per_scene(tmp_path):
    out = run("evaluate.py", *SMALL, "solver.iters=10", f"paths.output_dir={tmp_path}")
    res = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in res["scenes"]] == ["synthetic_2000000", "synthetic_2000001"]
    for s in res["scenes"]:
        assert {"psnr", "psnr_table", "ssim", "sam", "time", "iterations"} <= set(s) and s["iterations"] == 10
    assert res["mean"]["psnr"] == pytest.approx(sum(s["psnr"] for s in res["scenes"]) / 2)
    assert (tmp_path / "results.csv").read_text().startswith("name,psnr,psnr_table,ssim,sam,time,iterations")
    assert "| mean |" in (tmp_path / "results.md").read_text() and "mean" in out


def test_evaluate_shared_cave_gap_tv_beats_pinv(tmp_path, shared_data):
    """The issue's quality check, shortened: GAP-TV beats the pseudo-inverse on every CAVE crop."""
    psnr = {}
    for solver in ("pinv", "gap_tv"):
        d = tmp_path / solver
        run("evaluate.py", "data=shared_cave", f"solver={solver}", "trainer=cpu", f"paths.shared_data={shared_data}",
            f"paths.output_dir={d}", *(["solver.iters=20"] if solver == "gap_tv" else []))
        psnr[solver] = {s["name"]: s["psnr"] for s in json.loads((d / "results.json").read_text())["scenes"]}
    assert set(psnr["pinv"]) == {"cave_balloons_100", "cave_chart_toy_150", "cave_feathers_150"}
    for name, p in psnr["pinv"].items():
        assert psnr["gap_tv"][name] > p + 5


def test_reconstruct_default_writes_cubes(tmp_path):
    run("reconstruct.py", *SMALL, "solver.iters=5", "wavelengths=tsa", f"paths.output_dir={tmp_path}")
    from cassi.io import TSA_WAVELENGTHS, load_cube

    files = sorted((tmp_path / "reconstructions").glob("*.tif"))
    assert [f.stem for f in files] == ["synthetic_2000000", "synthetic_2000001"]
    cube = load_cube(files[0])
    assert cube.data.shape == (28, 32, 40) and cube.wavelengths == pytest.approx(TSA_WAVELENGTHS)
    assert cube.meta["step"] == 2 and cube.meta["axis"] == "w"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["scenes"]) == 2 and all(s["psnr"] > 10 for s in summary["scenes"])


def test_reconstruct_measurement_files_skips_a_bad_one(tmp_path, shared_data):
    bad = tmp_path / "broken.mat"
    bad.write_bytes(b"not a mat file")
    good = shared_data / "real" / "tsa_real_scene3.mat"
    out = run("reconstruct.py", "data=measurements", f"data.predict.entries=[{good},{bad}]",
              f"data.predict.mask={shared_data}/masks/tsa_real_mask_660.mat", "data.predict.key=meas_real",
              "solver=pinv", "trainer=cpu", "writer.fmt=npy", f"paths.output_dir={tmp_path / 'out'}")
    assert [p.name for p in (tmp_path / "out" / "reconstructions").glob("*.npy")] == ["tsa_real_scene3.npy"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["scenes"]
    assert {s["name"] for s in summary} == {"tsa_real_scene3", "broken"}
    assert "broken.mat" in next(s["error"] for s in summary if s["name"] == "broken")
    assert "1 scene(s) failed" in out


def test_benchmark_script_writes_ratios(tmp_path):
    run("benchmark.py", "cases=[tiny]", "backends=[loop,strided,fold]", "repeats=3", "warmup=1",
        f"output_dir={tmp_path}")
    rows = json.loads((tmp_path / "benchmark.json").read_text())
    assert {(r["backend"], r["map"]) for r in rows} >= {("strided", "A+At"), ("fold", "A"), ("copy floor", "A")}
    # ratios are against one seed-loop time per map: every row implies the same one (no timing assumed)
    for m in ("A", "At", "A+At"):
        seed_ms = {r["x_seed_fresh"] * r["ms_fresh"] for r in rows if r["map"] == m}
        assert max(seed_ms) == pytest.approx(min(seed_ms), rel=1e-9)
        floor = next(r for r in rows if r["backend"] == "copy floor" and r["map"] == m)
        for r in rows:
            if r["map"] == m:
                assert r["x_floor_out"] == pytest.approx(r["ms_out"] / floor["ms_out"], rel=1e-9)
    assert (tmp_path / "benchmark.md").read_text().count("| tiny |") == len(rows)


def test_benchmark_solvers_script(tmp_path):
    run("benchmark_solvers.py", "height=32", "width=32", "bands=8", "repeats=1", "solver.iters=5",
        f"output_dir={tmp_path}")
    r = json.loads((tmp_path / "benchmark_solvers.json").read_text())
    assert abs(r["ours"]["psnr"] - r["textbook"]["psnr"]) < 0.1


@pytest.mark.parametrize("config", ["reconstruct", "evaluate", "benchmark", "benchmark_solvers"])
def test_configs_compose(config):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(config, return_hydra_config=True, overrides=["hydra.runtime.output_dir=/tmp"])
    if "operator" in cfg:
        import torch

        op = instantiate(cfg.operator, mask=torch.ones(8, 8))
        assert op.bands == cfg.bands and op.offsets[1] == 2


@pytest.mark.parametrize("solver", sorted(p.stem for p in (CONF / "solver").glob("*.yaml")))
@pytest.mark.parametrize("operator", sorted(p.stem for p in (CONF / "operator").glob("[!_]*.yaml")))
def test_every_operator_and_solver_config_instantiates(operator, solver):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"operator={operator}", f"solver={solver}"])
    import torch

    op = instantiate(cfg.operator, mask=torch.ones(6, 7))
    assert type(op.backend).__name__.lower().startswith(operator)
    assert callable(instantiate(cfg.solver))


@pytest.mark.slow
def test_evaluate_multirun_sweep(tmp_path):
    run("evaluate.py", "-m", *SMALL, "solver.iters=3", "solver.tv_weight=0.1,0.4", f"hydra.sweep.dir={tmp_path}",
        "paths.output_dir=${hydra:runtime.output_dir}")
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    psnrs = [json.loads(p.read_text())["mean"]["psnr"] for p in results]
    assert psnrs[0] != psnrs[1]


@pytest.mark.slow
def test_evaluate_ddp_two_processes_gathers_every_scene(tmp_path):
    """Multi-device evaluation comes from the Trainer (DDP over 2 CPU processes), not hand-written code."""
    out = run("evaluate.py", "trainer=ddp", "trainer.accelerator=cpu", "data.test.n=4", "data.test.height=24",
              "data.test.width=24", "solver.iters=3", f"paths.output_dir={tmp_path}", stderr=True)
    assert "MEMBER: 2/2" in out  # Lightning started a second rank
    names = [s["name"] for s in json.loads((tmp_path / "results.json").read_text())["scenes"]]
    assert names == [f"synthetic_{2000000 + i}" for i in range(4)]
