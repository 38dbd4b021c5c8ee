"""scripts/train.py and the TrainingModule, run as a user runs them (subprocesses) on tiny problems."""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from cassi import CASSI
from cassi.io import save_cube, save_mask
from cassi.models import load_model

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# tiny synthetic problem: 8 training scenes of 16², batch 4 (2 steps per epoch), a 2-stage 4-wide GAP-Net
TINY = ["model.stages=2", "model.width=4", "model.depth=2", "bands=6", "wavelengths=null", "data.train.n=8", "data.train.height=16",
        "data.train.width=16", "data.val.n=2", "data.val.height=16", "data.val.width=16", "data.test.n=2",
        "data.test.height=16", "data.test.width=16", "data.batch_size=4", "trainer.accelerator=cpu",
        "callbacks.progress=null", "callbacks.summary=null", "trainer.log_every_n_steps=1"]


def run(script, *overrides, ok=True, out=None):
    """Run a script; ``out``: its output folder (Hydra's run dir too, so nothing lands in the repo)."""
    extra = [f"paths.output_dir={out}", f"hydra.run.dir={out}"] if out is not None else []
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *overrides, *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    if ok:
        assert r.returncode == 0, f"{script} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """6 steps of training with a checkpoint every 2 steps (random masks: drawn from seed, epoch, step)."""
    out = tmp_path_factory.mktemp("train")
    run("train.py", *TINY, "trainer.max_steps=6", "trainer.max_epochs=-1",
        f"+callbacks.every_2={{_target_:lightning.pytorch.callbacks.ModelCheckpoint,dirpath:{out}/steps,"
        f"every_n_train_steps:2,save_top_k:-1,filename:'s{{step}}',auto_insert_metric_name:false}}", out=out)
    return out


def test_training_writes_checkpoints_config_and_a_test_table(trained):
    ckpts = {p.name for p in (trained / "checkpoints").glob("*.ckpt")}
    assert "last.ckpt" in ckpts and any(c.startswith("best-") for c in ckpts)
    assert (trained / ".hydra" / "config.yaml").is_file()  # the composed config beside the run
    best = torch.load(next((trained / "checkpoints").glob("best-*.ckpt")), weights_only=True)
    assert best["cassi"]["geometry"] == {"offsets": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "axis": "w", "bands": 6}
    assert best["cassi"]["camera"] == {"masks": {"kind": "bernoulli", "p": 0.5}, "noise": None}  # data=synthetic's
    callbacks = {k: v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': 'val/psnr'")}
    assert callbacks, "the best checkpoint is chosen on val/psnr"
    rows = json.loads((trained / "test_results.json").read_text())["scenes"]
    assert [r["name"] for r in rows] == ["synthetic_2000000", "synthetic_2000001"] and all("psnr" in r for r in rows)
    metrics = (trained / "logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert {"train/loss", "val/psnr", "val/ssim", "val/sam", "val/psnr_table", "lr-Adam"} <= set(metrics.split(","))


def test_resume_continues_steps_optimizer_and_schedule(trained, tmp_path):
    """Resuming from the step-4 checkpoint ends where the uninterrupted run ended: same step, same
    weights, the same CPU-minute counter continued: the data, the random masks and the schedule were replayed."""
    run("train.py", *TINY, "trainer.max_steps=6", "trainer.max_epochs=-1",
        f"ckpt_path={trained}/steps/s4.ckpt", out=tmp_path)
    full = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == full["global_step"] == 6
    assert resumed["lr_schedulers"][0]["last_epoch"] == full["lr_schedulers"][0]["last_epoch"] == 6
    for k, v in full["state_dict"].items():
        assert torch.allclose(resumed["state_dict"][k], v, atol=1e-6), k
    steps = [int(line.split(",")[2]) for line in
             (tmp_path / "logs" / "version_0" / "metrics.csv").read_text().splitlines()[1:] if line.split(",")[2]]
    assert min(steps) == 4  # the resumed run logged only the steps after the checkpoint (0-based: 4, 5)
    elapsed = {k: v for k, v in resumed["callbacks"].items() if k.startswith("ElapsedTime")}
    assert elapsed and next(iter(elapsed.values()))["cpu_min"] > 0


def test_training_continues_from_weights_only(trained, tmp_path):
    """export_weights -> init_weights=: a new run starts from those weights (fresh optimizer and schedule);
    a file whose model differs from the configured one is refused before training."""
    from cassi.models import export_weights

    weights = export_weights(trained / "checkpoints" / "last.ckpt", tmp_path / "w.ckpt")
    assert torch.load(weights, weights_only=True)["cassi"]["step"] == 6
    run("train.py", *TINY, "trainer.max_steps=1", "trainer.max_epochs=-1", "test=false", "module.optimizer.lr=0",
        "module.scheduler=null", f"init_weights={weights}", out=tmp_path / "run")
    start, new = load_model(weights), load_model(tmp_path / "run" / "checkpoints" / "last.ckpt")
    for (k, a), b in zip(start.state_dict().items(), new.state_dict().values()):
        assert torch.equal(a, b), k  # lr 0: the weights it started from, unchanged
    r = run("train.py", *TINY, "model.width=5", "trainer.fast_dev_run=1", f"init_weights={weights}",
            out=tmp_path / "bad", ok=False)
    assert r.returncode != 0 and "its model differs from the configured one in width (4 there, 5 here)" in r.stderr


def test_a_checkpoint_s_architecture_trains_from_its_weights_or_from_scratch(trained, tmp_path):
    """model=from_checkpoint: the class and arguments a checkpoint records, fine-tuned from its weights
    (init_weights=, what fit_camera does with a converted published model) or untrained (cassi.models.architecture)."""
    from cassi.models import architecture

    ckpt = trained / "checkpoints" / "last.ckpt"
    data = [o for o in TINY if not o.startswith("model.")]
    # to another camera (Bernoulli masks of fill 0.2, where the checkpoint's were 0.5): trained for it, no warning
    r = run("train.py", "model=from_checkpoint", f"init_weights={ckpt}", *data, "camera.fill=0.2",
            "trainer.max_steps=1", "trainer.max_epochs=-1", "test=false", "module.optimizer.lr=0",
            "module.scheduler=null", out=tmp_path)
    assert "another camera" not in r.stdout + r.stderr
    start, tuned = load_model(ckpt), load_model(tmp_path / "checkpoints" / "last.ckpt")
    assert tuned.config == start.config and tuned.camera["masks"]["p"] == 0.2
    for (k, a), b in zip(start.state_dict().items(), tuned.state_dict().values()):
        assert torch.equal(a, b), k  # lr 0: the checkpoint's weights
    fresh = architecture(ckpt)
    assert fresh.config == start.config and fresh.training
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), start.state_dict().values()))


def test_learning_curves_against_cpu_minutes(trained, tmp_path):
    from cassi.viz import read_curve

    xs, ys = read_curve(trained)
    assert len(xs) == len(ys) >= 3 and xs == sorted(xs) and xs[0] > 0  # one point per validation
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_curves.py"), f"out={tmp_path / 'c.png'}",
                        "GAP-TV=20.5", f"tiny={trained}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG", r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_curves.py"), f"out={tmp_path / 'd.png'}",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no logs/version_*/metrics.csv" in r.stderr and not (tmp_path / "d.png").exists()


def test_checkpoint_loads_from_its_path_alone_and_reconstructs_the_same(trained):
    from cassi.lightning import TrainingModule

    path = trained / "checkpoints" / "last.ckpt"
    model = load_model(path)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[o for o in TINY if o.startswith(("model", "bands"))])
    module = TrainingModule(instantiate(cfg.model), instantiate(cfg.operator))
    module.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    op = CASSI((torch.rand(2, 1, 16, 20) > 0.5).float(), bands=6, step=2)
    y = op(torch.rand(2, 6, 16, 20))
    with torch.no_grad():
        assert torch.equal(model(op, y), module.reconstructor.eval()(op, y))


def test_evaluate_accepts_a_checkpoint(trained, tmp_path):
    ckpt = trained / "checkpoints" / "last.ckpt"
    run("evaluate.py", f"ckpt={ckpt}", "bands=6", "data.test.n=2", "data.test.height=24", "data.test.width=20",
        "trainer.accelerator=cpu", out=tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["scenes"]) == 2 and all(np.isfinite(s["psnr"]) for s in res["scenes"])
    assert str(ckpt) in (tmp_path / "results.md").read_text()


def test_reconstruct_accepts_a_checkpoint_and_checks_it_before_any_work(trained, tmp_path):
    ckpt = trained / "checkpoints" / "last.ckpt"
    common = [f"ckpt={ckpt}", "bands=6", "wavelengths=null", "data.test.n=2", "data.test.height=24",
              "data.test.width=20", "operator.backend=strided"]
    run("reconstruct.py", *common, "solver.iters=5", f"output_dir={tmp_path / 'ok'}")
    written = sorted(p.name for p in (tmp_path / "ok" / "reconstructions").iterdir())
    assert len(written) == 2 and (tmp_path / "ok" / "index.html").is_file()
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert all(np.isfinite(s["psnr"]) for s in summary["scenes"])
    # the configured solver (GAP-TV) ran beside the model: its scores, pictures and a report column
    assert all(np.isfinite(s["baseline_psnr"]) and s["baseline_psnr"] != s["psnr"] for s in summary["scenes"])
    page = (tmp_path / "ok" / "index.html").read_text()
    assert "<th>baseline</th>" in page and "GAPTV(iters=5" in page
    for s in summary["scenes"]:
        for kind in ("baseline", "baseline_compare"):
            assert (tmp_path / "ok" / "previews" / f"{s['name']}_{kind}.png").is_file()
    run("reconstruct.py", *common, "~solver", f"output_dir={tmp_path / 'alone'}")
    alone = json.loads((tmp_path / "alone" / "summary.json").read_text())
    assert not any(k.startswith("baseline") for s in alone["scenes"] for k in s)
    assert "<th>baseline</th>" not in (tmp_path / "alone" / "index.html").read_text()
    r = run("reconstruct.py", *common, "camera.step=1", f"output_dir={tmp_path / 'bad'}", ok=False)
    assert r.returncode != 0 and "was trained for dispersion offsets" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "bad" / "reconstructions").exists()


def test_pnp_with_a_trained_prior(trained, tmp_path):
    run("evaluate.py", "solver=pnp_trained", f"solver.denoiser.path={trained}/checkpoints/last.ckpt", "bands=6",
        "solver.iters=3", "data.test.n=1", "data.test.height=16", "data.test.width=16", "trainer.accelerator=cpu", out=tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["scenes"][0]["iterations"] == 3


@pytest.mark.parametrize("case", ["missing", "junk", "geometry", "bands"])
def test_bad_checkpoints_fail_before_any_work(trained, tmp_path, case):
    junk = tmp_path / "junk.ckpt"
    junk.write_text("not a checkpoint")
    ckpt, extra, message = {
        "missing": (tmp_path / "none.ckpt", [], "none.ckpt does not exist"),
        "junk": (junk, [], "junk.ckpt is not a cassi checkpoint"),
        "geometry": (trained / "checkpoints" / "last.ckpt", ["bands=6", "camera.step=1"],
                     "was trained for dispersion offsets [0, 2, …, 10] (6 bands) along 'w', but the operator has "
                     "offsets [0, 1, …, 5]"),
        "bands": (trained / "checkpoints" / "last.ckpt", [], "reconstructs 6 bands but the operator has 28"),
    }[case]
    r = run("evaluate.py", f"ckpt={ckpt}", *extra, "trainer.accelerator=cpu", out=tmp_path / "out", ok=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()


def test_wavelengths_must_match_the_band_count(tmp_path):
    r = run("train.py", *[o for o in TINY if o != "wavelengths=null"], "trainer.fast_dev_run=1", out=tmp_path, ok=False)
    # refused before any work, by the camera (conf/camera) or the model, whichever is built first
    assert r.returncode != 0 and re.search(r"wavelengths has 28 values but (the model reconstructs|camera.bands says "
                                           r"the camera has) 6 bands", r.stderr)


def test_unknown_model_name_is_a_clear_error(tmp_path):
    r = run("train.py", "model=nonet", out=tmp_path, ok=False)
    assert r.returncode != 0 and "Could not find 'model/nonet'" in r.stderr and "gapnet" in r.stderr


def _cube_tree(root: Path, bands: int = 28, size: int = 40) -> None:
    """The data/cave_kaist layout with tiny random cubes and a mask."""
    g = np.random.default_rng(0)
    for split, n in (("train", 2), ("val", 1), ("test", 1)):
        (root / "cave_kaist" / split).mkdir(parents=True)
        for i in range(n):
            save_cube(root / "cave_kaist" / split / f"{split}{i}.h5", g.random((bands, size, size), np.float32))
    save_mask(root / "cave_kaist" / "mask_256.mat", (g.random((size, size)) > 0.5).astype(np.float32))


# Every experiment, those that train several models once more with their other ones (experiment=toolbox names no
# model: it is chosen on the command line), and every schedule (conf/schedule) with a model it is for. DAUHST's 3- and
# 5-stage runs differ from the 2-stage one only in model.stages, which the run below sets to 2: the same run
# (test_dauhst_stage_variants_differ_only_in_stages checks it; the 9-stage one checkpoints, and runs)
SCHEDULES = {"toolbox_mst": "mst_s", "toolbox_hdnet": "hdnet", "toolbox_gap_net": "toolbox_gap_net", "cassi": "gapnet"}
RUNS = [*([f"experiment={e}"] for e in EXPERIMENTS if e != "toolbox"),
        ["experiment=toolbox", "model=dauhst_2stg"],
        ["experiment=toolbox", "model=dauhst_9stg", "model.checkpointing=true"],
        ["experiment=toolbox", "model=mst_plus_plus"],
        *(["experiment=toolbox", f"model={m}", f"schedule={s}"] for s, m in SCHEDULES.items()),
        ["experiment=toolbox", "model=toolbox_admm_net", "schedule=toolbox_gap_net"],
        ["experiment=toolbox", "model=admmnet", "schedule=cassi"]]
SAME_RUN = {f"dauhst_{n}stg": "dauhst_2stg" for n in (3, 5)}
# the experiments of the MST toolbox's published protocol (conf/experiment/toolbox.yaml)
PROTOCOL = ("toolbox",)
SMALL = {"gapnet": ["model.stages=2", "model.width=4", "model.depth=2"],
         "admmnet": ["model.stages=2", "model.width=4", "model.depth=2"],
         "toolbox_gap_net": ["model.stages=2", "model.width=4"],   # the toolbox's (cassi.models.zoo.gapnet)
         "toolbox_admm_net": ["model.stages=2", "model.width=4"],
         "hdnet": ["model.feats=8", "model.blocks=[1,1]"],
         "mst_plus_plus": ["model.stages=1"],
         "mst": ["model.num_blocks=[1,1,1]"],
         "dauhst": ["model.stages=2", "model.dim=4", "model.window=4"],
         # GAP-TV on two 32² training scenes, windows of 16²
         "synthetic": ["model.width=4", "model.depth=2", "data.train.cubes.n=2", "data.train.patch_size=16",
                       *(f"data.{s}.{k}=32" for s in ("train.cubes", "val", "test") for k in ("height", "width"))],
         "chart": ["model.width=4", "model.depth=2", "data.train.cubes.n=2", "data.train.patch_size=16",  # as synthetic
                   *(f"data.{s}.{k}=32" for s in ("train.cubes", "val", "test") for k in ("height", "width"))],
         "Refiner": ["model.width=4", "model.depth=2", "data.train.cubes.samples_per_epoch=2",
                     "data.train.cubes.patch_size=32", "data.train.patch_size=16", "data.val.crop_to=32"]}
CROPS = ["data.train.patch_size=32", "data.val.crop_to=32"]  # for the families that train on cube files


def _train_script():
    """scripts/train.py as a module: its ``main`` takes a composed config (Hydra's pass-through), so a run needs
    no interpreter and imports of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cassi_train_script", ROOT / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dauhst_stage_variants_differ_only_in_stages():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        base = compose("train", overrides=["experiment=toolbox", f"model={SAME_RUN['dauhst_3stg']}", "model.stages=2"])
        for variant in SAME_RUN:
            cfg = compose("train", overrides=["experiment=toolbox", f"model={variant}", "model.stages=2"])
            assert cfg == base, variant


def test_the_toolbox_protocol_asks_for_a_model_and_its_schedules_are_deltas():
    """experiment=toolbox names no model (model=... on the command line); a schedule (conf/schedule) changes only
    what it sets on top of it: the learning rate's schedule, a loss, precision and clipping; every schedule is run
    above."""
    from hydra.errors import ConfigCompositionException

    assert sorted(SCHEDULES) == sorted(p.stem for p in (CONF / "schedule").glob("*.yaml"))
    with initialize_config_dir(str(CONF), version_base="1.3"):
        with pytest.raises(ConfigCompositionException, match="You must specify 'model'"):
            compose("train", overrides=["experiment=toolbox"])
        base = compose("train", overrides=["experiment=toolbox", "model=mst_s"])
        mst = compose("train", overrides=["experiment=toolbox", "model=mst_s", "schedule=toolbox_mst"])
        hdnet = compose("train", overrides=["experiment=toolbox", "model=mst_s", "schedule=toolbox_hdnet"])
        own = compose("train", overrides=["experiment=toolbox", "model=mst_s", "schedule=cassi"])
    assert mst.model == base.model and mst.data == base.data and mst.trainer == base.trainer
    assert mst.module.scheduler.milestones == [50, 100, 150, 200, 250] and mst.module.loss == base.module.loss
    assert mst.module.optimizer == base.module.optimizer
    assert hdnet.module.scheduler == mst.module.scheduler and hdnet.module.loss._target_.endswith("HDNetLoss")
    assert own.module.scheduler == base.module.scheduler and own.module.optimizer.lr == 1e-3
    assert own.trainer.precision == "bf16-mixed" and base.trainer.precision != "bf16-mixed"
    assert own.data == base.data and own.module.loss == base.module.loss


def test_the_refiners_first_iterate_takes_plain_gap_without_a_plus():
    """model.solver.accelerate=false (plain GAP, for real measurements: fit_camera's recipe in pretrained/tsa_real's
    card) overrides a key the Refiner's solver lists; the default stays the accelerated GAP-TV."""
    from hydra.utils import instantiate

    with initialize_config_dir(str(CONF), version_base="1.3"):
        for given, want in (([], True), (["model.solver.accelerate=false"], False)):
            cfg = compose("train", overrides=["experiment=cave_tsa", "camera=tsa_real", *given])
            assert instantiate(cfg.model).solver.accelerate is want


@pytest.mark.slow
@pytest.mark.parametrize("experiment", RUNS, ids=" ".join)
def test_fast_dev_run_of_every_experiment(experiment, tmp_path, shared_data):
    """Two training and validation steps (and the test when the experiment tests) of every experiment, shrunk,
    through scripts/train.py's main in this process."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=experiment)
        label = " ".join(experiment)
        family = next((k for k in SMALL if k in label or cfg.model._target_.endswith(k)), "gapnet")
        overrides = [*experiment, *SMALL[family], *([] if family in ("synthetic", "chart", "Refiner") else CROPS),
                     "trainer.fast_dev_run=2", "trainer.accelerator=cpu", "trainer.devices=1", "data.batch_size=2",
                     "data.num_workers=0", "data.pin_memory=false", "callbacks.progress=null",
                     f"paths.shared_data={shared_data}", f"paths.data_dir={tmp_path / 'data'}",
                     f"paths.output_dir={tmp_path / 'run'}"]
        if experiment[0].removeprefix("experiment=").startswith(PROTOCOL):  # its data layout, in miniature
            _cube_tree(tmp_path / "data")
            overrides.append("data.test.crop_to=32")
        run_cfg = compose("train", overrides=overrides)
    value = _train_script().main(run_cfg)
    assert np.isfinite(value)  # the validation PSNR of the two validation steps
    assert not (tmp_path / "run" / "checkpoints").exists()  # fast_dev_run: Lightning saves no checkpoint
    assert (tmp_path / "run" / "test_results.json").is_file() is bool(cfg.test)


@pytest.mark.slow
def test_ddp_training_on_two_cpu_processes(tmp_path):
    r = run("train.py", *TINY, "trainer=ddp", "trainer.max_steps=2", "trainer.max_epochs=-1", out=tmp_path)
    assert "MEMBER: 2/2" in r.stdout + r.stderr  # Lightning started a second rank
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and ckpt["cassi"]["geometry"]["bands"] == 6
    assert len(json.loads((tmp_path / "test_results.json").read_text())["scenes"]) == 2
    # the value train.py returns is the best checkpoint's score (ddp_spawn passes back only its path)
    best = torch.load(next((tmp_path / "checkpoints").glob("best-*.ckpt")), weights_only=True)
    score = next(s["best_model_score"] for k, s in best["callbacks"].items() if s.get("monitor") == "val/psnr")
    assert f"best val/psnr: {float(score):.4f}" in r.stdout


@pytest.mark.parametrize("group,option", [(g, p.stem) for g in ("logger", "callbacks", "trainer")
                                          for p in sorted((CONF / g).glob("*.yaml"))])
def test_every_training_config_composes_and_instantiates(group, option, tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"{group}={option}", f"paths.output_dir={tmp_path}"])
    made = instantiate(cfg[group])
    assert made is not None


def test_warmup_cosine_schedule():
    from cassi.lightning import warmup_cosine

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = warmup_cosine(opt, total_steps=12, warmup_steps=2, min_lr=0.1)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))  # then non-increasing ...
    assert lrs[-1] > 0.1 and opt.param_groups[0]["lr"] == pytest.approx(0.1)  # ... to min_lr at total_steps


def test_a_run_bounded_by_time_alone_follows_its_time_budget(tmp_path):
    """fit_camera.py trains with trainer.max_time and no step limit: the cosine follows the time spent (Lightning's
    Timer, which a resume restores) instead of failing on an infinite step estimate."""
    import math
    from functools import partial

    import lightning as L
    from lightning.pytorch.callbacks import Timer

    from cassi.lightning import TrainingModule, warmup_cosine
    from cassi.models import GAPNet

    spent = [0.0]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = warmup_cosine(opt, warmup_steps=0, min_lr=0.0, progress=lambda: spent[0])
    for t, want in ((0.5, 0.5), (1.0, 0.0), (2.0, 0.0)):
        spent[0] = t
        sched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(want, abs=1e-9)
    with pytest.raises(ValueError, match="one of them"):
        warmup_cosine(opt)
    module = TrainingModule(GAPNet(bands=4, stages=1, width=4, depth=2), partial(CASSI, bands=4, step=2),
                            scheduler=partial(warmup_cosine, warmup_steps=0))
    trainer = L.Trainer(max_time={"seconds": 100}, max_steps=-1, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)
    module.trainer = trainer
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    timer._offset = 25.0  # as after a resume from a checkpoint taken at 25 s
    conf = module.configure_optimizers()
    lr0 = conf["optimizer"].param_groups[0]["initial_lr"]
    conf["lr_scheduler"]["scheduler"].step()
    assert conf["optimizer"].param_groups[0]["lr"] == pytest.approx(lr0 * 0.5 * (1 + math.cos(math.pi * 0.25)), rel=1e-3)


def test_a_deadline_resets_the_time_budget_and_the_cosine_follows():
    """fit_camera's last phase ends at the budget's end whatever its pool took: callbacks.deadline sets the Timer's
    budget at the start of training to the time trained before (a resume's) plus what is left until the deadline."""
    import math
    import time
    from functools import partial

    import lightning as L
    from lightning.pytorch.callbacks import Timer

    from cassi.lightning import TrainingModule, warmup_cosine
    from cassi.lightning.callbacks import Deadline
    from cassi.models import GAPNet

    module = TrainingModule(GAPNet(bands=4, stages=1, width=4, depth=2), partial(CASSI, bands=4, step=2),
                            scheduler=partial(warmup_cosine, warmup_steps=0))
    trainer = L.Trainer(max_time={"seconds": 100}, max_steps=-1, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    module.trainer = trainer
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    timer._offset = 25.0  # trained 25 s before a resume
    conf = module.configure_optimizers()
    Deadline(at=None).on_train_start(trainer, module)
    assert timer._duration == 100
    Deadline(at=time.time() + 300).on_train_start(trainer, module)
    assert timer._duration == pytest.approx(325, abs=2)
    lr0 = conf["optimizer"].param_groups[0]["initial_lr"]
    conf["lr_scheduler"]["scheduler"].step()
    assert conf["optimizer"].param_groups[0]["lr"] == pytest.approx(lr0 * 0.5 * (1 + math.cos(math.pi * 25 / 325)),
                                                                    rel=1e-2)
    Deadline(at=time.time() - 600, min_minutes=2).on_train_start(trainer, module)  # past: a minimum still trains
    assert timer._duration == pytest.approx(25 + 120, abs=2)
    with pytest.raises(ValueError, match="trainer.max_time"):
        Deadline(at=time.time()).on_train_start(L.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
                                                          enable_progress_bar=False), module)


@pytest.mark.slow
def test_benchmark_models_script(tmp_path):
    run("benchmark_models.py", "models=[gapnet,dauhst_2stg]", "bands=4", "flops_size=32", "train_size=16",
        "train_batch=2", "steps=1", "repeats=1", "checkpointing=[false,true]", f"output_dir={tmp_path}", f"hydra.run.dir={tmp_path}")
    rows = json.loads((tmp_path / "benchmark_models.json").read_text())
    assert [(r["model"], r["checkpointing"]) for r in rows] == [("gapnet", False), ("gapnet", True),
                                                                ("dauhst_2stg", False), ("dauhst_2stg", True)]
    gap = rows[0]
    # FLOPs of GAP-Net's convolutions at 32²: >= 2·(multiply-adds of its first 3×3 conv over 9 stages)
    assert gap["gflops"] * 1e9 >= 9 * 2 * (4 * 32 * 9) * 32 * 32 and gap["params"] > 1e6
    assert all(r["samples_per_s"] > 0 and r["reconstruct_s"] > 0 and r["gap_tv_s"] > 0 for r in rows)
    assert "| gapnet | 9 |" in (tmp_path / "benchmark_models.md").read_text()


def test_benchmark_models_times_a_shipped_model_as_it_reconstructs(tmp_path):
    """A checkpoint in ``models``: the model it records (its architecture and inference settings) against GAP-TV."""
    run("benchmark_models.py", "models=[pretrained/cave_any]", "bands=28", "flops_size=32", "train_size=16",
        "train_batch=1", "steps=1", "repeats=1", f"output_dir={tmp_path}", f"hydra.run.dir={tmp_path}")
    (row,) = json.loads((tmp_path / "benchmark_models.json").read_text())
    shipped = load_model("pretrained/cave_any")
    assert row["model"] == "pretrained/cave_any" and row["stages"] == shipped.stages
    assert row["params"] == sum(p.numel() for p in shipped.parameters())
    assert row["reconstruct_s"] > 0 and row["gap_tv_s"] > 0 and row["samples_per_s"] > 0
