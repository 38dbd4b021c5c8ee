"""The Hydra entry points, run as a user runs them (subprocesses), on tiny problems."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from cassi.physics.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SMALL = ["data.test.n=2", "data.test.height=32", "data.test.width=40", "trainer.accelerator=cpu"]


def run(script, *overrides, tmp, stderr=False, columns=None):
    """Run a script in the folder ``tmp`` (Hydra's run folder too), so that nothing lands in the repository;
    ``columns``: the terminal's width (COLUMNS)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **({"COLUMNS": str(columns)} if columns else {}))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *overrides, f"hydra.run.dir={tmp}/hydra"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{script} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout + (r.stderr if stderr else "")


def test_evaluate_writes_a_table_per_scene(tmp_path):
    out = run("evaluate.py", *SMALL, "solver.iters=10", f"paths.output_dir={tmp_path}", tmp=tmp_path, columns=80)
    # in an 80-column terminal it printed every column cut to `na… ps… ...`: now name, PSNR, SSIM, SAM, time
    assert max(len(ln) for ln in out.splitlines() if not ln.startswith("[20")) <= 80 and "…" not in out
    assert next(ln for ln in out.splitlines() if ln.startswith("scene")).split() == [
        "scene", "PSNR", "SSIM", "SAM", "time", "(s)"]
    res = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in res["scenes"]] == ["synthetic_2000000", "synthetic_2000001"]
    for s in res["scenes"]:
        assert {"psnr", "psnr_table", "ssim", "sam", "time", "iterations"} <= set(s) and s["iterations"] == 10
    assert res["mean"]["psnr"] == pytest.approx(sum(s["psnr"] for s in res["scenes"]) / 2)
    assert (tmp_path / "results.csv").read_text().startswith("name,psnr,psnr_table,ssim,ssim_table,sam,time,iterations")
    assert "| mean |" in (tmp_path / "results.md").read_text() and "mean" in out


def test_evaluate_shared_cave_gap_tv_beats_pinv(tmp_path, shared_data):
    """The issue's quality check, shortened: GAP-TV beats the pseudo-inverse on every CAVE crop (the evaluate
    workflow in this process, on the config evaluate.py composes)."""
    from cassi.workflows.evaluate import evaluate

    psnr = {}
    for solver in ("pinv", "gap_tv"):
        d = tmp_path / solver
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = compose("evaluate", overrides=[
                "data=shared_cave", f"solver={solver}", "trainer.accelerator=cpu", f"paths.shared_data={shared_data}",
                f"paths.output_dir={d}", "data_name=shared_cave", *(["solver.iters=20"] if solver == "gap_tv" else [])])
        evaluate(cfg)
        psnr[solver] = {s["name"]: s["psnr"] for s in json.loads((d / "results.json").read_text())["scenes"]}
    assert set(psnr["pinv"]) == {"cave_balloons_100", "cave_chart_toy_150", "cave_feathers_150"}
    for name, p in psnr["pinv"].items():
        assert psnr["gap_tv"][name] > p + 5


@pytest.mark.slow
def test_benchmark_script_writes_ratios(tmp_path):
    run("benchmark.py", "cases=[tiny]", "backends=[loop,strided,fold]", "repeats=3", "warmup=1",
        "retries=0", f"output_dir={tmp_path}", tmp=tmp_path)
    rows = json.loads((tmp_path / "benchmark.json").read_text())
    assert {(r["backend"], r["map"]) for r in rows} >= {("strided", "A+At"), ("fold", "A"), ("floor", "A")}
    # ratios are against one seed-loop time per map: every row implies the same one (no timing assumed)
    for m in ("A", "At", "A+At"):
        seed_ms = {r["x_seed_fresh"] * r["ms_fresh"] for r in rows if r["map"] == m}
        assert max(seed_ms) == pytest.approx(min(seed_ms), rel=1e-9)
        for r in rows:  # each row against its own floor time (timed in turn with it; the floor row: itself)
            if r["map"] == m:
                assert r["x_floor_out"] == pytest.approx(r["ms_out"] / r["floor_ms"], rel=1e-9)
                assert r["x_floor_fresh"] == pytest.approx(r["ms_fresh"] / r["floor_ms"], rel=1e-9)
    assert (tmp_path / "benchmark.md").read_text().count("| tiny |") == len(rows)


def test_benchmark_solvers_script(tmp_path):
    run("benchmark_solvers.py", "height=32", "width=32", "bands=8", "repeats=1", "solver.iters=5",
        f"output_dir={tmp_path}", tmp=tmp_path)
    r = json.loads((tmp_path / "benchmark_solvers.json").read_text())
    assert abs(r["ours"]["psnr"] - r["textbook"]["psnr"]) < 0.1


@pytest.mark.parametrize("config", ["reconstruct", "evaluate", "benchmark", "benchmark_solvers"])
def test_configs_compose(config):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(config, return_hydra_config=True, overrides=["hydra.runtime.output_dir=/tmp"])
    if "operator" in cfg:
        import torch

        op = instantiate(cfg.operator)(mask=torch.ones(8, 8))
        assert op.bands == cfg.bands and op.offsets[1] == 2


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_by_name_in_the_operator_config(backend):
    import torch

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"operator.backend={backend}"])
    op = instantiate(cfg.operator)(mask=torch.ones(6, 7))
    assert type(op.backend) is BACKENDS[backend] and op.offsets[1] == 2


@pytest.mark.parametrize("solver", sorted(p.stem for p in (CONF / "solver").glob("*.yaml")))
def test_every_solver_config_instantiates(solver):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"solver={solver}"])
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    missing = OmegaConf.missing_keys(cfg.solver)  # e.g. pnp_trained's checkpoint path: the user must give it
    if missing:
        with pytest.raises(MissingMandatoryValue, match=sorted(missing)[0].replace(".", r"\.")):
            instantiate(cfg.solver)
    else:
        assert callable(instantiate(cfg.solver))


@pytest.mark.slow
def test_evaluate_multirun_sweep(tmp_path):
    run("evaluate.py", "-m", *SMALL, "solver.iters=3", "solver.tv_weight=0.1,0.4", f"hydra.sweep.dir={tmp_path}",
        "paths.output_dir=${hydra:runtime.output_dir}", tmp=tmp_path)
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    psnrs = [json.loads(p.read_text())["mean"]["psnr"] for p in results]
    assert psnrs[0] != psnrs[1]


@pytest.mark.slow
def test_evaluate_ddp_two_processes_gathers_every_scene(tmp_path):
    """Multi-device evaluation comes from the Trainer (DDP over 2 CPU processes), not hand-written code."""
    out = run("evaluate.py", "trainer=ddp", "trainer.accelerator=cpu", "data.test.n=4", "data.test.height=24",
              "data.test.width=24", "solver.iters=3", f"paths.output_dir={tmp_path}", stderr=True, tmp=tmp_path)
    assert "MEMBER: 2/2" in out  # Lightning started a second rank
    names = [s["name"] for s in json.loads((tmp_path / "results.json").read_text())["scenes"]]
    assert names == [f"synthetic_{2000000 + i}" for i in range(4)]
