"""Sweeps (issue 9): Hydra multirun of train.py / evaluate.py, scripts/collect.py, the Optuna search with sqlite
storage, the joblib and submitit launchers, DDP inside a sweep. Every script runs as a subprocess in pytest's
temporary folder, with its sweep folder (and sqlite storage) there: nothing lands in the repository."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf

from cassi.workflows.sweeps import collect

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SEARCHES = sorted(p.stem for p in (CONF / "hparams_search").glob("*.yaml"))
LAUNCHERS = ["basic", "joblib", "submitit_local", "submitit_slurm",
             *sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml"))]
# a 2-stage 4-wide GAP-Net on 8 synthetic 16² scenes of 6 bands; fast_dev_run: one train/val/test batch
TINY = ["model.stages=2", "model.width=4", "model.depth=2", "bands=6", "wavelengths=null", "data.train.n=8",
        "data.train.height=16", "data.train.width=16", "data.val.n=2", "data.val.height=16", "data.val.width=16",
        "data.test.n=2", "data.test.height=16", "data.test.width=16", "data.batch_size=4", "trainer.accelerator=cpu",
        "callbacks.progress=null", "callbacks.summary=null", "trainer.enable_model_summary=false",
        "trainer.fast_dev_run=1"]


def plugin(name: str):
    """The sweep extra (`pip install -e .[sweep]`, which `make test` installs)."""
    return pytest.importorskip(f"hydra_plugins.{name}", reason="the [sweep] extra is not installed")


def run(script, *args, cwd: Path, ok: bool = True, timeout: int = 600):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("CASSI_JOBS", None)  # a sweep's jobs learn their share from the sweep (not from pytest's workers)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, f"{script} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def sweep(script, sweep_dir: Path, *overrides, ok: bool = True):
    """A multirun with its sweep folder (one sub-folder per job) at ``sweep_dir``."""
    return run(script, "-m", *overrides, f"hydra.sweep.dir={sweep_dir}", cwd=sweep_dir.parent, ok=ok)


def records(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/job.json")}


def collected(sweep_dir: Path, *args) -> dict:
    """Runs scripts/collect.py as a user does and returns the table it wrote (sweep.json)."""
    r = run("collect.py", f"sweep_dir={sweep_dir}", *args, cwd=sweep_dir.parent)
    assert "wrote" in r.stdout
    return json.loads((sweep_dir / "sweep.json").read_text())


# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("name", SEARCHES)
def test_every_hparams_search_config_composes(name):
    plugin("hydra_optuna_sweeper")
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"hparams_search={name}"], return_hydra_config=True)
        flipped = compose("train", overrides=[f"hparams_search={name}", "monitor=val/sam", "monitor_mode=min"],
                          return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert sweeper.direction == "maximize" and flipped.hydra.sweeper.direction == "minimize"
    assert sweeper.storage.startswith("sqlite:///") and sweeper.study_name
    # every searched parameter is a valid sweep of a key that exists in the training config
    for key, space in sweeper.params.items():
        (override,) = OverridesParser.create().parse_overrides([f"{key}={space}"])
        assert override.is_sweep_override(), (key, space)
        assert OmegaConf.select(cfg, key, default="missing") != "missing", f"{name} searches unknown key {key}"


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_the_optuna_space_fits_every_model(model):
    """`hparams_search=optuna experiment=tiny_cpu` stopped at its first trial: the space drew model.stages=7, which
    a Refiner cannot train from scratch (stage K trains on the K-1 of init_weights). The architecture part of the
    space is the model's own (hparams_search/space/<model>.yaml): only what that model trains from scratch."""
    plugin("hydra_optuna_sweeper")
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hparams_search=optuna", f"model={model}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    for key in params:  # every searched key is one of this model's (HDNet has no stages)
        assert OmegaConf.select(cfg, key, default="missing") != "missing", f"{model}: searches unknown key {key}"
    assert {"module.optimizer.lr", "module.loss.ssim", "module.loss.kind"} <= set(params)
    free = model in ("gapnet", "admmnet", "dauhst")  # a stage count that trains from scratch
    assert ("model.stages" in params) is free
    if free:
        (stages,) = OverridesParser.create().parse_overrides([f"model.stages={params['model.stages']}"])
        assert set(stages.sweep_string_iterator()) == {"3", "5", "7", "9"}


def test_the_optuna_space_follows_the_experiments_model():
    plugin("hydra_optuna_sweeper")
    with initialize_config_dir(str(CONF), version_base="1.3"):
        tiny = compose("train", overrides=["hparams_search=optuna", "experiment=tiny_cpu"], return_hydra_config=True)
        other = compose("train", overrides=["hparams_search=optuna", "experiment=tiny_cpu", "model=gapnet"],
                        return_hydra_config=True)
    assert tiny.model._target_.endswith("Refiner") and "model.stages" not in tiny.hydra.sweeper.params
    assert other.model._target_.endswith("GAPNet") and "model.stages" in other.hydra.sweeper.params


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_launcher_config_composes(name):
    if name != "basic":
        plugin("hydra_joblib_launcher" if "joblib" in name else "hydra_submitit_launcher")
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].rsplit(".", 1)[-1] in {"BasicLauncher", "JoblibLauncher", "LocalLauncher",
                                                       "SlurmLauncher"}
    if name != "basic":  # (Hydra builds its basic launcher itself)
        assert type(instantiate(cfg.hydra.launcher)).__name__ == launcher["_target_"].rsplit(".", 1)[-1]
    if name.startswith("slurm_"):  # the documented cluster examples
        assert {"partition", "gpus_per_node", "timeout_min", "array_parallelism"} <= set(launcher)
        assert launcher["gpus_per_node"] >= 1 and launcher["tasks_per_node"] in (1, launcher["gpus_per_node"])


# -------------------------------------------------------------------------------------- multirun + collect


def test_train_multirun_2x2_gives_4_job_folders_and_one_table(tmp_path):
    out = tmp_path / "sweep"
    sweep("train.py", out, *TINY, "model=gapnet,admmnet", "module.optimizer.lr=1e-4,4e-4")
    jobs = sorted(p.name for p in out.iterdir() if (p / ".hydra").is_dir())
    assert jobs == ["0", "1", "2", "3"]
    recs = records(out)
    assert all(r["status"] == "completed" and isinstance(r["value"], float) for r in recs.values())
    assert {(o["model"], float(o["module.optimizer.lr"])) for o in
            (dict(x.split("=", 1) for x in r["overrides"]) for r in recs.values())} == {
        ("gapnet", 1e-4), ("gapnet", 4e-4), ("admmnet", 1e-4), ("admmnet", 4e-4)}

    table = collected(out)
    rows = table["rows"]
    assert len(rows) == 4 and table["sort"] == "val/psnr" and table["mode"] == "max"
    assert {"model", "module.optimizer.lr", "val/psnr", "test/psnr", "time_s"} <= set(table["columns"])
    assert "trainer.fast_dev_run=1" in table["fixed"]  # common overrides are listed once
    values = [r["val/psnr"] for r in rows]
    assert values == sorted(values, reverse=True)  # best first
    assert all(r["val/psnr"] == recs[r["job"]]["value"] and r["time_s"] > 0 for r in rows)
    assert table["best"]["job"] == rows[0]["job"]
    md = (out / "sweep.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 1 + 4  # header + one row per job
    assert len(list(csv.DictReader((out / "sweep.csv").open()))) == 4


def test_a_failed_job_is_a_row_with_its_error(tmp_path):
    """Three runs, the second fails: Hydra still runs the third, the sweep exits non-zero, the table keeps all."""
    out = tmp_path / "sweep"
    r = sweep("train.py", out, *TINY, "module.optimizer.lr=1e-4,-1,4e-4", ok=False)
    assert r.returncode != 0 and "Invalid learning rate" in r.stderr
    assert records(out)["1"]["status"] == "failed" and records(out)["2"]["status"] == "completed"
    rows = collected(out)["rows"]
    assert [r["status"] for r in rows] == ["completed", "completed", "failed"]
    failed = rows[-1]
    assert failed["job"] == "1" and failed["module.optimizer.lr"] == "-1"
    assert failed["error"] == "ValueError: Invalid learning rate: -1" and failed["val/psnr"] is None
    assert "ValueError: Invalid learning rate: -1" in (out / "sweep.md").read_text()
    assert "Traceback" in records(out)["1"]["traceback"]


def test_evaluate_multirun_is_collected_by_mean_psnr(tmp_path):
    out = tmp_path / "sweep"
    sweep("evaluate.py", out, "solver=gap_tv,admm_tv", "operator.backend=strided,loop", "solver.iters=3",
          "data.test.n=1", "data.test.height=16", "data.test.width=16", "bands=6", "trainer.accelerator=cpu",
          "trainer.callbacks=[]")
    table = collected(out)
    assert len(table["rows"]) == 4 and table["sort"] == "psnr"
    assert {(r["solver"], r["operator.backend"]) for r in table["rows"]} == {
        (s, b) for s in ("gap_tv", "admm_tv") for b in ("strided", "loop")}
    psnr = [r["psnr"] for r in table["rows"]]
    assert psnr == sorted(psnr, reverse=True)


def test_collect_keeps_unfinished_jobs_and_refuses_an_empty_folder(tmp_path):
    """A job killed while running (job.json still says running) is a row with its log's last line."""
    for i, (status, value) in enumerate([("completed", 30.0), ("running", None), ("completed", 31.0)]):
        job = tmp_path / "s" / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- module.optimizer.lr={i}\n")
        (job / "job.json").write_text(json.dumps({"status": status, "value": value, "metric": "val/psnr",
                                                  "mode": "max", "overrides": [f"module.optimizer.lr={i}"],
                                                  "time_s": 1.0}))
        (job / "train.log").write_text("started\nepoch 3\n")
    table = collect(tmp_path / "s")
    assert [(r["job"], r["status"]) for r in table["rows"]] == [("2", "completed"), ("0", "completed"),
                                                                ("1", "incomplete")]
    assert "epoch 3" in table["rows"][-1]["error"]
    assert [r["job"] for r in collect(tmp_path / "s", mode="min")["rows"]] == ["0", "2", "1"]
    # sweep_dir=latest: the newest folder with a multirun.yaml under ./multirun
    (tmp_path / "multirun").mkdir()
    (tmp_path / "s").rename(tmp_path / "multirun" / "s")
    (tmp_path / "multirun" / "s" / "multirun.yaml").write_text("{}\n")
    assert "best val/psnr = 31.0000: job 2" in run("collect.py", "sweep_dir=latest", cwd=tmp_path).stdout
    assert (tmp_path / "multirun" / "s" / "sweep.md").is_file()
    (tmp_path / "empty").mkdir()
    r = run("collect.py", f"sweep_dir={tmp_path / 'empty'}", cwd=tmp_path, ok=False)
    assert r.returncode == 2 and "no job folders" in r.stderr


# ------------------------------------------------------------------------------------------------ Optuna


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*SQLAlchemy 2.0")  # optuna 2.x under sqlalchemy<2, as the extra pins it
def test_optuna_search_reports_the_best_and_resumes_from_sqlite(tmp_path):
    plugin("hydra_optuna_sweeper")
    import optuna

    db = tmp_path / "studies" / "search.db"  # its folder does not exist yet: created before the study
    common = ["hparams_search=optuna", *TINY, f"hydra.sweeper.storage=sqlite:///{db}", "hydra.sweeper.study_name=s"]
    first = run("train.py", *common, "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=1",
                f"hydra.sweep.dir={tmp_path / 'a'}", cwd=tmp_path)
    best = OmegaConf.load(tmp_path / "a" / "optimization_results.yaml")
    assert "Best value" in first.stderr + first.stdout
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    assert best.best_value == max(t.value for t in trials)
    # model.stages=2 on the command line fixes it: searched are lr, the SSIM weight and the loss kind
    assert set(best.best_params) == {"module.optimizer.lr", "module.loss.ssim", "module.loss.kind"}
    assert len(list((tmp_path / "a").glob("*/job.json"))) == 3
    assert len(collected(tmp_path / "a")["rows"]) == 3

    run("train.py", *common, "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.seed=2",
        f"hydra.sweep.dir={tmp_path / 'b'}", cwd=tmp_path)
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
    assert len(trials) == 5 and [t.number for t in trials] == list(range(5))  # the study went on
    resumed = OmegaConf.load(tmp_path / "b" / "optimization_results.yaml")
    assert resumed.best_value == max(t.value for t in trials) >= best.best_value


# --------------------------------------------------------------------------------------------- launchers


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_launcher_runs_a_two_job_sweep(tmp_path, launcher):
    plugin("hydra_joblib_launcher" if launcher == "joblib" else "hydra_submitit_launcher")
    out = tmp_path / "sweep"
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=10"]
    sweep("train.py", out, *TINY, "module.optimizer.lr=1e-4,4e-4", f"hydra/launcher={launcher}", *extra)
    recs = records(out)
    assert sorted(recs) == ["0", "1"] and all(r["status"] == "completed" for r in recs.values())
    assert all((out / j / "test_results.json").is_file() for j in recs)
    # the two jobs run at once and share the cores (cassi.workflows.sweeps.ThreadShare): half of them at most each
    assert [r["jobs_sharing_cores"] for r in recs.values()] == ["2", "2"], recs
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert all(1 <= r["threads"] <= share for r in recs.values()), recs
    if launcher == "submitit_local":
        assert (out / ".submitit").is_dir()  # submitit's own logs, per job
    assert len(collected(out)["rows"]) == 2


@pytest.mark.slow
def test_ddp_spawn_inside_a_sweep(tmp_path):
    """The CPU analogue of multi-GPU jobs in a sweep: trainer=ddp (ddp_spawn, 2 processes) in each of 2 jobs.
    Each job keeps its own folder and the sweep is not re-launched (as plain strategy=ddp would)."""
    out = tmp_path / "sweep"
    r = sweep("train.py", out, *TINY, "trainer=ddp", "module.optimizer.lr=1e-4,4e-4")
    assert r.stdout.count("best val/psnr") == 2  # printed once per job, by the main process
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0", "1"]
    for job in ("0", "1"):
        scenes = json.loads((out / job / "test_results.json").read_text())["scenes"]
        assert [s["name"] for s in scenes] == ["synthetic_2000000", "synthetic_2000001"]  # gathered over ranks
    assert [r["status"] for r in collected(out)["rows"]] == ["completed", "completed"]
