"""scripts/fit_camera.py: one command fits a model to a camera; killed, it continues where it stopped."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scipy.io
import torch
from omegaconf import OmegaConf

from cassi.workflows.fit import CARD, TRAIN, Machine, fit_camera, native_bf16, plan, scene_side
from cassi.models import Refiner, load_model
from cassi.physics.camera import Camera

ROOT = Path(__file__).resolve().parents[1]
CPU = Machine(**OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "machine" / "cpu.yaml")))  # machine=cpu
# a tiny fit: 3 pool scenes, 8 windows of 32² per epoch (2 steps), 6 steps, a width-4 U-Net, 64² validation/test crops,
# the card's GAP-TV at 5 iterations
TINY = ('recipe=["data.train.cubes.samples_per_epoch=3","data.train.cubes.patch_size=64","data.train.patch_size=32",'
        '"data.train.samples_per_epoch=8","data.batch_size=4","data.val.crop_to=64","model.solver.iters=5",'
        '"model.width=4","model.depth=2","trainer.max_steps=6","trainer.log_every_n_steps=1",'
        '"validation.test.crop_to=64","test.test.crop_to=64","baselines.gap_tv.iters=5","masks_baseline.iters=5",'
        '"half=false"]')


def camera(*overrides) -> dict:
    """The resolved camera of conf/fit_camera.yaml with these overrides, as scripts/fit_camera.py gives it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("fit_camera", overrides=[*overrides, "output_dir=x"]).camera,
                                      resolve=True)


SIM = camera("camera=tsa_simulation")


def fit(out, *extra, wait=True, init="null"):
    cmd = [sys.executable, str(ROOT / "scripts" / "fit_camera.py"), "camera.noise.photons=3000", "budget_hours=1",
           f"init={init}", f"output_dir={out}", TINY, *extra]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_plan_follows_the_budget():
    pool, phases = plan(0.5, noiseless=True, machine=CPU)
    assert [p.name for p in phases] == ["stage1"] and 16 <= pool <= 768 and phases[0].minutes < 30
    assert "model.project=true" in phases[0].overrides
    pool, phases = plan(1, noiseless=True, machine=CPU)  # the tiny fit below: two stages
    assert [p.name for p in phases] == ["stage1", "stage2"] and sum(p.minutes for p in phases) < 60
    pool, phases = plan(3, noiseless=False, machine=CPU)
    assert [p.name for p in phases] == ["stage1", "stage2"] and "model.project=false" in phases[1].overrides
    # all but 5 minutes (the card's reserve) planned: the pool's time, then training
    assert sum(p.minutes for p in phases) + pool * CPU.scene_s / 60 == pytest.approx(180 - 5)
    # from an init with two U-Nets (cave_any): the pair from the start, at 3 h then a third U-Net grown on it
    pool2, (pair, triple) = plan(3, noiseless=False, machine=CPU, init_stages=2)
    assert pool2 == pool and pair.name == "stage2" and {"model.stages=2", "model.project=false"} <= set(pair.overrides)
    assert triple.name == "stage3" and {"model.stages=3", "data.train.stages=1"} <= set(triple.overrides)
    assert pair.minutes + triple.minutes + pool * CPU.scene_s / 60 == pytest.approx(180 - 5)
    assert triple.minutes > pair.minutes
    (pair,) = plan(1, True, CPU, init_stages=2)[1]  # under three_stages_min (twice two_stages_min): the pair alone
    assert CPU.three_stages_min == 2 * CPU.two_stages_min
    assert pair.name == "stage2" and pair.minutes < CPU.three_stages_min
    assert [p.name for p in plan(0.5, True, CPU, init_stages=2)[1]] == ["stage2"]  # at any budget
    assert [p.name for p in plan(0.5, True, CPU)[1]] == ["stage1"]  # a U-Net grown: not under 40 minutes
    # from an init with three: all three from the start from three_stages_min (on 64² windows, then the last third
    # on windows of half the scene's side), below it its first two
    triple, large = plan(3, False, CPU, init_stages=3)[1]
    assert triple.name == "stage3" and {"model.stages=3", "data.train.stages=1"} <= set(triple.overrides)
    assert large.name == "stage3_large" and {"model.stages=3", "data.train.patch_size=128"} <= set(large.overrides)
    assert triple.minutes == pytest.approx(2 * large.minutes)
    assert triple.minutes + large.minutes + pool * CPU.scene_s / 60 == pytest.approx(180 - 5)
    (triple,) = plan(3, False, CPU, init_stages=3, scene=128)[1]  # a mask of 128 px: 64² windows throughout
    assert triple.name == "stage3" and triple.minutes + pool * CPU.scene_s / 60 == pytest.approx(180 - 5)
    assert "data.train.patch_size=80" in plan(3, False, CPU, init_stages=3, scene=160)[1][1].overrides
    (pair,) = plan(1, True, CPU, init_stages=3)[1]
    assert pair.name == "stage2" and "model.stages=2" in pair.overrides
    with pytest.raises(ValueError, match="budget_hours must be > 0"):
        plan(0, True, CPU)


def test_plan_prices_the_machine():
    gpu = Machine(scene_s=0.18, two_stages_min=2, train=["trainer.accelerator=gpu"])
    pool, phases = plan(0.13, noiseless=True, machine=gpu)  # 7.8 minutes: a pool of 520 scenes, two stages
    assert pool == 520 and [p.name for p in phases] == ["stage1", "stage2"]
    assert sum(p.minutes for p in phases) == pytest.approx(7.8 - 520 * 0.18 / 60 - 0.78)
    pool, phases = plan(0.13, noiseless=True, machine=CPU)  # the same budget on the CPU: a smaller pool, one stage
    assert pool == 62 and [p.name for p in phases] == ["stage1"]


def fake_runs(monkeypatch, stage1_minutes=30):
    """The phases' runs replaced by a fake on a fake clock: stage 1 (pool included) takes ``stage1_minutes``, every
    other run 30; the first run of stage 2 is stopped (Ctrl-C) after 10. Returns the runs' list (module, overrides)."""
    import cassi.workflows.fit as fit_module

    now, runs = [0.0], []
    monkeypatch.setattr(fit_module.time, "monotonic", lambda: now[0])

    def fake(script, overrides, log, tick=None):
        get = dict(o.split("=", 1) for o in overrides if "=" in o)
        runs.append((script, get))
        if script == TRAIN:  # what a run writes: the pool's count, then a validation per epoch
            run = Path(get["hydra.run.dir"])
            (run / "logs" / "version_0").mkdir(parents=True, exist_ok=True)
            log.write_text("[…][cassi.data.first_iterates][INFO] - first iterates: 76/768 scenes, 3.4 min\n")
        first = len(runs) == 1
        for k, minutes in enumerate((10, 10, stage1_minutes - 20 if first else 10)):  # booked at each step
            now[0] += 60 * minutes
            if script == TRAIN and k:
                with open(run / "logs" / "version_0" / "metrics.csv", "a") as f:
                    f.write("epoch,step,time/wall_min,val/psnr\n" if k == 1 else "")
                    f.write(f"{k - 1},{1024 * k - 1},{10.0 * k},{30 + k}\n")
            tick()
            if script == TRAIN and "stage2" in get["hydra.run.dir"] and len(runs) == 2:
                raise KeyboardInterrupt  # stopped 10 minutes into stage 2
        if script == TRAIN:
            (Path(get["hydra.run.dir"]) / "checkpoints").mkdir(parents=True, exist_ok=True)
            (Path(get["hydra.run.dir"]) / "checkpoints" / "best-epoch000.ckpt").write_bytes(b"")
        else:
            (Path(get["out_dir"]) / "model.md").write_text("card")
            (Path(get["out_dir"]) / "model.ckpt").write_bytes(b"")

    monkeypatch.setattr(fit_module, "_run", fake)
    return runs


def test_time_is_booked_as_it_goes_and_the_last_phase_gets_what_is_left(tmp_path, monkeypatch):
    """Stage 1 (pool included) overruns its plan; stage 2 is stopped half-way and continued with the time it was
    given."""
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    out = tmp_path / "fit"
    _, (stage1, _) = plan(1, noiseless=True, machine=CPU)
    said = []
    with pytest.raises(KeyboardInterrupt):
        fit_module.fit_camera(out, SIM, budget_hours=1, machine=CPU, echo=said.append)
    # progress: the pool's count, then each validation, once each
    assert said[2:5] == ["  stage1: GAP-TV pool 76/768 scenes, 3.4 min",
                         "  stage1: step 1023, 10.0 min: validation 31.00 dB (best 31.00)",
                         "  stage1: step 2047, 20.0 min: validation 32.00 dB (best 32.00)"], said
    state = json.loads((out / "plan.json").read_text())["progress"]
    assert state["spent_min"] == pytest.approx(40)  # stage 1's 30 and stage 2's first 10, kept across the stop
    assert runs[0][1]["trainer.max_time"] == f"00:00:{int(stage1.minutes):02d}:{round(stage1.minutes % 1 * 60):02d}"
    assert state["minutes"]["stage2"] == pytest.approx(60 - 5 - 30)  # what the budget had left, less the card's 5
    assert runs[1][1]["trainer.max_time"] == "00:00:25:00"
    # the last phase ends with the budget less the card's reserve, whatever its pool takes; the first has its plan
    assert "callbacks.deadline.at" not in runs[0][1]
    assert float(runs[1][1]["callbacks.deadline.at"]) == pytest.approx(time.time() + 25 * 60, abs=30)
    assert json.loads((out / "stage1" / "done.json").read_text())["best"] == "stage1/checkpoints/best-epoch000.ckpt"
    moved = tmp_path / "moved"  # a fit's folder continues where it was moved to (e.g. from a GPU machine)
    out.rename(moved)
    # continued on a machine whose plan would have one stage: the plan of the first run stands
    fit_module.fit_camera(moved, SIM, budget_hours=1, echo=lambda *a: None,
                          machine=Machine(scene_s=0.1, two_stages_min=1000,
                                          train=["trainer.accelerator=gpu", "data.batch_size=32"]),
                          recipe=["data.batch_size=4", "half=false"])
    assert runs[2][1]["trainer.max_time"] == "00:00:25:00"  # resumed with the time it was given
    assert float(runs[2][1]["callbacks.deadline.at"]) == pytest.approx(time.time() + 15 * 60, abs=30)  # 10 spent
    assert runs[2][1]["hydra.run.dir"] == str(moved / "stage2")
    assert runs[2][1]["init_weights"] == str(moved / "stage1" / "checkpoints" / "best-epoch000.ckpt")
    assert "half" not in runs[2][1]
    assert runs[2][1]["data.batch_size"] == "4" and runs[2][1]["trainer.accelerator"] == "gpu"  # the recipe wins
    assert runs[3][0] == CARD and (moved / "card.md").read_text() == "card"
    assert runs[3][1]["ckpt"] == str(moved / "stage2" / "checkpoints" / "best-epoch000.ckpt")
    assert "trainer.accelerator" not in runs[3][1] and runs[3][1]["half"] == "false"
    assert json.loads((moved / "plan.json").read_text())["progress"]["spent_min"] == pytest.approx(100)


def test_a_fit_continues_only_with_its_camera_and_budget(tmp_path, monkeypatch):
    """The plan keeps the resolved camera: another budget, or another camera (here its noise), is refused in one line
    naming what differs; a plan.json of an earlier cassi (the camera as overrides, flat or typed layout) is refused
    in one line naming them; nothing runs."""
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    with pytest.raises(KeyboardInterrupt):  # stopped in stage 2
        fit_module.fit_camera(tmp_path / "fit", SIM, budget_hours=1, machine=CPU, echo=lambda *a: None)
    done = len(runs)
    with pytest.raises(ValueError, match=r"another camera or budget \(the same camera; budget 1 h, now 2 h\)"):
        fit_module.fit_camera(tmp_path / "fit", SIM, budget_hours=2, machine=CPU)
    noisy = camera("camera=tsa_simulation", "camera.noise.photons=3000")
    with pytest.raises(ValueError, match=r"\(noise=\{'photons': None, .*\(now \{'photons': 3000, "):
        fit_module.fit_camera(tmp_path / "fit", noisy, budget_hours=1, machine=CPU)
    pool, phases = plan(1, noiseless=True, machine=CPU)
    old = {"camera": ["camera=tsa_simulation"], "budget_hours": 1, "pool": pool,
           "phases": [vars(p) for p in phases]}
    for layout in ({**old, "spent_min": 40.0, "minutes": {}}, {"plan": old, "progress": {"spent_min": 40.0}}):
        (tmp_path / "old").mkdir(exist_ok=True)
        (tmp_path / "old" / "plan.json").write_text(json.dumps(layout))
        with pytest.raises(ValueError, match="planned by an earlier cassi with the camera overrides "
                                             "camera=tsa_simulation: continue it with that version"):
            fit_module.fit_camera(tmp_path / "old", SIM, budget_hours=1, machine=CPU)
    assert len(runs) == done


def test_an_init_with_three_u_nets_trains_its_first_two_at_a_short_budget(tmp_path, monkeypatch):
    """cave_any has three U-Nets: under three_stages_min the fit trains its first two together, one phase, its own
    pool."""
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    fit_module.fit_camera(tmp_path, SIM, budget_hours=1, machine=CPU, echo=lambda *a: None,
                          init="pretrained/cave_any")
    assert [script for script, _ in runs] == [TRAIN, CARD]
    train = runs[0][1]
    assert train["hydra.run.dir"] == str(tmp_path / "stage2") and train["init_weights"] == "pretrained/cave_any"
    assert train["model.stages"] == "2" and train["data.train.stages"] == "1" and "data.train.cache" not in train
    _, (pair,) = plan(1, noiseless=True, machine=CPU, init_stages=2)
    assert train["trainer.max_time"] == f"00:00:{int(pair.minutes):02d}:{round(pair.minutes % 1 * 60):02d}"
    assert float(train["callbacks.deadline.at"]) == pytest.approx(time.time() + 55 * 60, abs=30)  # its pool's too


def test_at_a_long_budget_an_init_s_three_u_nets_train_together(tmp_path, monkeypatch):
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    fit_module.fit_camera(tmp_path, SIM, budget_hours=3, machine=CPU, echo=lambda *a: None,
                          init="pretrained/cave_any")
    assert [script for script, _ in runs] == [TRAIN, TRAIN, CARD]
    triple, large = runs[0][1], runs[1][1]
    assert triple["hydra.run.dir"] == str(tmp_path / "stage3") and triple["model.stages"] == "3"
    assert triple["init_weights"] == "pretrained/cave_any" and "data.train.cache" not in triple
    assert triple["data.train.patch_size"] == "64" and "callbacks.deadline.at" not in triple
    # then the three on from stage 3's best, on 128² windows of its pool, until the budget's end less the card's 5
    assert large["hydra.run.dir"] == str(tmp_path / "stage3_large") and large["model.stages"] == "3"
    assert large["init_weights"] == str(tmp_path / "stage3" / "checkpoints" / "best-epoch000.ckpt")
    assert large["data.train.cache"] == str(tmp_path / "stage3" / "first_iterates.pt")
    assert large["data.train.patch_size"] == "128" and float(large["module.optimizer.lr"]) < 1e-3
    assert float(large["callbacks.deadline.at"]) == pytest.approx(time.time() + (180 - 5 - 30) * 60, abs=30)
    assert runs[2][1]["ckpt"] == str(tmp_path / "stage3_large" / "checkpoints" / "best-epoch000.ckpt")


def test_at_a_long_budget_a_third_u_net_is_grown_on_an_init_s_pair_and_its_pool(tmp_path, monkeypatch):
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    two = fit_module.load_model("pretrained/cave_any")
    two.config = {**two.config, "stages": 2}  # an init with two U-Nets (the plan reads its config only)
    monkeypatch.setattr(fit_module, "load_model", lambda path: two)
    fit_module.fit_camera(tmp_path, SIM, budget_hours=3, machine=CPU, echo=lambda *a: None,
                          init="pretrained/cave_any")
    assert [script for script, _ in runs] == [TRAIN, TRAIN, CARD]
    pair, triple = runs[0][1], runs[1][1]
    assert pair["model.stages"] == "2" and pair["init_weights"] == "pretrained/cave_any"
    assert triple["hydra.run.dir"] == str(tmp_path / "stage3") and triple["model.stages"] == "3"
    assert triple["init_weights"] == str(tmp_path / "stage2" / "checkpoints" / "best-epoch000.ckpt")
    assert triple["data.train.cache"] == str(tmp_path / "stage2" / "first_iterates.pt")  # GAP-TV not run again
    # the pair's 30 minutes spent, the third trains until the budget's end less the card's 5
    assert float(triple["callbacks.deadline.at"]) == pytest.approx(time.time() + (180 - 5 - 30) * 60, abs=30)
    assert runs[2][1]["ckpt"] == str(tmp_path / "stage3" / "checkpoints" / "best-epoch000.ckpt")


def test_the_u_nets_width_is_the_machine_s_raised_to_the_init_s_and_fixed_by_the_plan(tmp_path, monkeypatch):
    """machine=cpu_bf16 trains at width 32; an init with wider U-Nets keeps its width (init_weights widens, never
    narrows), and a fit continued on a machine of another width keeps the width it was planned at."""
    import dataclasses

    import cassi.workflows.fit as fit_module

    three = {"stages": 3, "depth": 4}
    assert fit_module.unet_width(["model.width=32"], {**three, "width": 16}) == 32
    assert fit_module.unet_width(["model.width=32"], {**three, "width": [16, 16, 48]}) == 48
    assert fit_module.unet_width([], {**three, "width": 32}) == 32  # machine=cpu names none: the init's
    assert fit_module.unet_width([], {**three, "width": [16, 16, 24]}) is None  # the model config's, the init's shapes
    assert fit_module.unet_width(["model.width=32"], {}) == 32 and fit_module.unet_width([], {}) is None
    assert fit_module.unet_width(["model.width=[32,32,48]"], {**three, "width": 16}) == "[32,32,48]"  # as given

    runs = fake_runs(monkeypatch)
    wide = fit_module.load_model("pretrained/cave_any")
    wide.config = {**wide.config, "width": 48}  # the plan reads its config only
    monkeypatch.setattr(fit_module, "load_model", lambda path: wide)
    bf16 = dataclasses.replace(CPU, train=["trainer.precision=bf16-mixed", "model.width=32"])
    lines = []
    fit_module.fit_camera(tmp_path, SIM, budget_hours=1, machine=bf16, echo=lines.append,
                          init="pretrained/cave_any")
    assert runs[0][0] == TRAIN and runs[0][1]["model.width"] == "48"
    assert any("width 48" in line for line in lines), lines
    assert json.loads((tmp_path / "plan.json").read_text())["plan"]["width"] == 48
    # stopped before its end, continued on a float32 CPU (machine=cpu names no width): still 48
    (tmp_path / "model.ckpt").unlink()
    (tmp_path / "stage2" / "done.json").unlink()
    fit_module.fit_camera(tmp_path, SIM, budget_hours=1, machine=CPU, echo=lambda *a: None,
                          init="pretrained/cave_any")
    assert runs[2][0] == TRAIN and runs[2][1]["model.width"] == "48" and "trainer.precision" not in runs[2][1]
    # a recipe's width has the last word over the machine's, raised to the init's like the machine's
    for init_width, want in ((48, 48), (16, 16)):
        wide.config = {**wide.config, "width": init_width}
        out, start, said = tmp_path / f"recipe{init_width}", len(runs), []
        fit_module.fit_camera(out, SIM, budget_hours=1, machine=bf16, echo=said.append,
                              init="pretrained/cave_any", recipe=["model.width=16"])
        widths = [r["model.width"] for s, r in runs[start:] if s == TRAIN]
        assert widths and set(widths) == {str(want)}, widths
        # the fit says the width it trains at (not the machine's 32)
        assert [line for line in said if "training phase(s)" in line and f"U-Nets of width {want}," in line], said
        assert json.loads((out / "plan.json").read_text())["plan"]["width"] == want


def test_a_last_phase_left_too_little_time_is_skipped_and_the_first_stands(tmp_path, monkeypatch):
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch, stage1_minutes=51)  # 4 of stage 2's 24 planned minutes are left (5: the card's)
    said = []
    fit_module.fit_camera(tmp_path, SIM, budget_hours=1, machine=CPU, echo=said.append,
                          recipe=["project=false", "half=false", "ensemble=false", "data.batch_size=4"])
    assert [script for script, _ in runs] == [TRAIN, CARD]
    # the recipe's card settings go to the card, the rest to training
    assert runs[1][1]["project"] == runs[1][1]["half"] == runs[1][1]["ensemble"] == "false"
    assert "data.batch_size" not in runs[1][1]
    assert runs[0][1]["data.batch_size"] == "4" and not {"project", "half", "ensemble"} & set(runs[0][1])
    assert runs[1][1]["ckpt"] == str(tmp_path / "stage1" / "checkpoints" / "best-epoch000.ckpt")
    assert any(line.startswith("  stage2: skipped, 4.0 of its planned") for line in said), said
    assert json.loads((tmp_path / "stage2" / "done.json").read_text())["skipped"] is True


def test_a_phase_run_survives_failing_ticks_and_ends_with_the_fit_process(tmp_path, monkeypatch):
    import cassi.workflows.fit as fit_module

    (tmp_path / "nap.py").write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
                                     "time.sleep(float(sys.argv[2]))\n")
    # the module a phase's run starts (python -m nap), found as cassi is: through the environment
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(fit_module, "TICK_S", 0.05)
    ticks = []

    def tick():
        ticks.append(1)
        raise ValueError("a metrics.csv cut short")

    fit_module._run("nap", [str(tmp_path / "a.pid"), "1"], tmp_path / "a.log", tick=tick)
    assert len(ticks) >= 3  # each failure reported, the run went on to its end
    # the fit process killed outright (no handler of its own runs): its phase's run does not go on alone
    code = (f"import pathlib, cassi.workflows.fit as m; "
            f"m._run('nap', [{str(tmp_path / 'b.pid')!r}, '120'], pathlib.Path({str(tmp_path / 'b.log')!r}))")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 240  # a guard against a hang: a loaded 2-core machine took over 60 s to start it
    while not (tmp_path / "b.pid").is_file() or not (tmp_path / "b.pid").read_text():
        assert time.monotonic() < deadline and parent.poll() is None, "the run did not start"
        time.sleep(0.05)
    child = int((tmp_path / "b.pid").read_text())
    parent.kill()
    parent.wait()

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, IndexError):
            return False

    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the phase's run outlived the fit process")


@pytest.mark.parametrize("cuda, bf16, given, scene_s, accelerator", [
    (False, False, [], 1.5, False), (False, True, [], 1.5, False), (True, True, [], 0.1, True),
    (True, False, ["machine.scene_s=2"], 2, True)])
def test_the_default_machine_is_the_gpu_where_there_is_one(tmp_path, cuda, bf16, given, scene_s, accelerator):
    """machine=auto (the default) takes gpu.yaml's settings where torch sees CUDA, else cpu_bf16.yaml's (cpu.yaml's
    and bf16 mixed precision) on a CPU with bfloat16 in hardware, else cpu.yaml's, under the keys given; here stopped
    by a budget of 0 at the plan, after the lines that name the pick and the Machine built."""
    code = (f"import runpy, sys, torch, cassi.workflows.fit as f; torch.cuda.is_available = lambda: {cuda}; "
            f"f.native_bf16 = lambda: {bf16}; "
            f"sys.argv = ['fit_camera.py', 'budget_hours=0', 'output_dir={tmp_path / 'fit'}', *{given!r}]; "
            f"runpy.run_path('scripts/fit_camera.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "budget_hours must be > 0" in r.stderr, r.stderr
    pick = "gpu" if cuda else "cpu_bf16" if bf16 else "cpu"
    assert f"machine={pick} " in r.stdout, r.stdout
    assert f"priced at {scene_s:g} s a pool scene" in r.stdout, r.stdout
    assert ("trainer.accelerator=gpu" in r.stdout) == accelerator, r.stdout
    assert ("trainer.precision=bf16-mixed" in r.stdout) == (pick == "cpu_bf16"), r.stdout
    assert ("model.width=32" in r.stdout) == (pick != "cpu"), r.stdout  # wider U-Nets where bf16 or a GPU pays


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n\n")
    assert not native_bf16(info)  # AVX-512 without its bfloat16 instructions
    info.write_text(info.read_text() + "processor\t: 1\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert native_bf16(info)
    info.write_text("flags\t\t: fpu amx_tile amx_bf16\n")
    assert native_bf16(info)
    assert not native_bf16(tmp_path / "absent")  # no such file (not Linux): float32


def test_a_bad_camera_fails_before_any_work(tmp_path, shared_data):
    r = fit(tmp_path / "fit", f"camera.mask={tmp_path / 'nope.mat'}")
    assert r.returncode != 0 and f"camera.mask {tmp_path / 'nope.mat'} does not exist" in r.stderr
    assert not (tmp_path / "fit" / "stage1").exists()
    # bands beyond the training scenes' 400-700 nm: refused before any work, not when the pool meets them
    nm = "[" + ",".join(str(450 + 10 * c) for c in range(28)) + "]"
    r = fit(tmp_path / "fit", f"camera.wavelengths={nm}")
    assert r.returncode != 0 and "2 band(s) at 710, 720 nm lie outside the 400–700 nm" in r.stderr
    assert not (tmp_path / "fit" / "stage1").exists()


def test_a_published_model_is_fine_tuned_through_the_camera_end_to_end(tmp_path, monkeypatch):
    """A converted model (here MST-S as convert_checkpoint.py writes it) as init=: one phase, its architecture trained
    from its weights on crops measured through the camera, then the card; another band count is refused first."""
    import cassi.workflows.fit as fit_module
    from cassi.models.zoo import toolbox

    mst = toolbox.build("mst_s")
    torch.save({"state_dict": {f"reconstructor.{k}": v for k, v in mst.state_dict().items()},
                "cassi": {"model": mst.config, "geometry": {"offsets": [2.0 * c for c in range(28)], "axis": "w",
                                                            "bands": 28}, "wavelengths": None,
                          "converted": {"source": "mst", "method": "mst_s"}}}, ckpt := tmp_path / "m.ckpt")
    with pytest.raises(ValueError, match=f"init={ckpt} holds a MST of 28 bands; the camera has 31"):
        fit_camera(tmp_path / "bad", SIM, CPU, budget_hours=0.5, init=str(ckpt), bands=31)
    assert not (tmp_path / "bad").exists()
    runs = fake_runs(monkeypatch)
    gpu = Machine(scene_s=0.1, two_stages_min=2, train=["trainer.accelerator=gpu", "model.width=32"])
    said = []
    fit_module.fit_camera(tmp_path / "fit", camera("camera=tsa_real"), gpu, budget_hours=0.5, init=str(ckpt), bands=28,
                          echo=said.append, scene=200)
    fixed = json.loads((tmp_path / "fit" / "plan.json").read_text())["plan"]
    assert [p["name"] for p in fixed["phases"]] == ["finetune"] and fixed["pool"] == 0 and fixed["width"] is None
    assert fixed["phases"][0]["minutes"] == pytest.approx(30 - 3)  # the budget less the card's reserve
    assert any(line.startswith("fit_camera: fine-tuning") for line in said)
    (module, train), (card_module, card) = runs
    assert module == TRAIN and card_module == CARD
    assert train["model"] == "from_checkpoint" and train["model.path"] == train["init_weights"] == str(ckpt)
    assert train["data"] == "cave_train" and train["trainer.accelerator"] == "gpu"
    # the camera travels resolved: the fit's own config group option, on Hydra's search path, for every job
    assert train["camera"] == card["camera"] == "fit"
    assert train["hydra.searchpath"] == card["hydra.searchpath"] == f"['file://{tmp_path / 'fit' / 'conf'}']"
    written = OmegaConf.load(tmp_path / "fit" / "conf" / "camera" / "fit.yaml")
    assert OmegaConf.to_container(written) == fixed["camera"] == camera("camera=tsa_real")
    assert train["module.optimizer.lr"] == str(fit_module.FINETUNE_LR) and train["module.scheduler"] == "null"
    assert train["data.val.crop_to"] == "200" and "callbacks.deadline.at" in train
    assert not any(k.startswith(("model.width", "data.train.cubes", "experiment")) for k in train)
    assert card["ckpt"] == str(tmp_path / "fit" / "finetune" / "checkpoints" / "best-epoch000.ckpt")
    assert card["validation.test.crop_to"] == "200"


def test_the_scenes_follow_a_smaller_mask_and_bad_cameras_are_named():
    """256² scenes, or a smaller mask's smaller side; no wavelengths, bands beyond CAVE, per-band masks and masks
    under the 64² training windows are refused in one line."""
    assert scene_side(Camera(mask=torch.ones(300, 400))) == 256
    assert scene_side(Camera(mask=None, masks="bernoulli")) == 256
    assert scene_side(Camera(mask=torch.ones(200, 120), wavelengths="cave", bands=31)) == 120
    mixed = Camera(masks="mixture", mixture=[{"masks": "bernoulli"}, {"mask": torch.ones(180, 256), "masks": "crops"}])
    assert scene_side(mixed) == 180
    with pytest.raises(ValueError, match="camera.wavelengths=null: .* needs their centres"):
        scene_side(Camera(mask=torch.ones(256, 256), wavelengths=None))
    with pytest.raises(ValueError, match=r"1 band\(s\) at 395 nm lie outside"):
        scene_side(Camera(mask=torch.ones(256, 256), bands=3, wavelengths=[395, 500, 600]))
    with pytest.raises(ValueError, match=r"shape \(28, 256, 256\): a fit needs the \(H, W\) coded aperture"):
        scene_side(Camera(mask=torch.ones(28, 256, 256)))
    with pytest.raises(ValueError, match="63 px on its smaller side"):
        scene_side(Camera(mask=torch.ones(63, 300)))


def test_a_smaller_mask_s_scenes_reach_training_and_the_card(tmp_path, monkeypatch):
    import cassi.workflows.fit as fit_module

    runs = fake_runs(monkeypatch)
    said = []
    fit_module.fit_camera(tmp_path / "a", camera("camera.mask=m.npy"), budget_hours=0.5, machine=CPU, echo=said.append,
                          scene=120)
    assert "scenes and validation windows of 120² px" in said[0]
    train, card = runs[0][1], runs[-1][1]
    assert train["data.train.cubes.patch_size"] == "120" and train["data.val.crop_to"] == "120"
    assert card["validation.test.crop_to"] == "120" and card["test.test.crop_to"] == "100"  # the 150² test crops too
    assert "test.test.crop_to" not in train
    fit_module.fit_camera(tmp_path / "b", camera("camera.mask=m.npy"), budget_hours=0.5, machine=CPU, echo=said.append,
                          scene=200, recipe=["data.val.crop_to=64"])  # the recipe's own sizes win
    train, card = runs[-2][1], runs[-1][1]
    assert train["data.train.cubes.patch_size"] == "200" and train["data.val.crop_to"] == "64"
    assert card["validation.test.crop_to"] == "200" and "test.test.crop_to" not in card
    fit_module.fit_camera(tmp_path / "c", camera("camera.mask=m.npy"), budget_hours=0.5, machine=CPU, echo=said.append)
    assert not any(k in runs[-2][1] for k in ("data.train.cubes.patch_size", "data.val.crop_to"))


@pytest.mark.slow
def test_fit_camera_killed_once_resumes_and_writes_a_loadable_model_and_card(tmp_path, shared_data):
    out = tmp_path / "fit"
    # stage 1 starts from a 5-band Refiner dispersing along h, carried to the camera's 28 bands along w
    torch.manual_seed(0)
    start = Refiner(bands=5, width=4, depth=2, mask_input=True)
    torch.save({"state_dict": {f"reconstructor.{k}": v for k, v in start.state_dict().items()},
                "cassi": {"model": start.config, "geometry": {"offsets": [0, 2, 4, 6, 8], "axis": "h", "bands": 5},
                          "wavelengths": None}}, init := tmp_path / "start.ckpt")
    # the camera's mask: a variable of a file holding several (camera.key), which the card's other masks must not read
    scipy.io.savemat(mask := tmp_path / "camera.mat", {"code": (torch.rand(256, 256) < 0.5).double().numpy(),
                                                        "notes": torch.zeros(256, 256).numpy()})
    camera = [f"camera.mask={mask}", "camera.key=code"]
    proc = fit(out, *camera, wait=False, init=init)
    last = out / "stage1" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 600
    while not last.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert last.is_file(), proc.communicate()[0][-3000:] if proc.poll() is not None else "no last.ckpt in time"
    os.killpg(proc.pid, signal.SIGKILL)  # the fit and its training process, mid-way
    proc.wait()
    assert not (out / "model.ckpt").exists()
    first = (out / "stage1" / "console.log").read_text()
    assert f"init_weights={init}" in first and "carried from 5 to 28 bands" in first and "along h to w" in first
    r = fit(out, *camera, init=init)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "(resumed)" in r.stdout and "ckpt_path=" in (out / "stage1" / "console.log").read_text()
    # stage 2 grew on stage 1's best and trained both on stage 1's pool (GAP-TV is not run again)
    second = (out / "stage2" / "console.log").read_text()
    assert f"data.train.cache={out / 'stage1' / 'first_iterates.pt'}" in second and "init_weights=" in second
    assert not (out / "stage2" / "first_iterates.pt").exists()
    model = load_model(out / "model.ckpt")
    assert type(model).__name__ == "Refiner" and model.stages == 2 and model.mask_input  # its U-Nets read the mask
    assert model.camera["noise"].startswith("ShotNoise(photons=3000")
    # trained unprojected (a noisy camera): the card scored it projected onto y too and kept the better on validation
    gain = float(re.search(r"stages projected onto y at inference: validation PSNR ([-+.\d]+) dB",
                           (out / "card.log").read_text()).group(1))
    assert model.project is (gain > 0) and model.config["project"] is (gain > 0)
    # and with the flip ensemble on every stage: kept where it raised the validation PSNR by more than 0.05 dB
    gain = float(re.search(r"flip ensemble on every stage: validation PSNR ([-+.\d]+) dB",
                           (out / "card.log").read_text()).group(1))
    assert (model.flip_ensemble is True) is (gain > 0.05) and (model.config["flip_ensemble"] is True) is (gain > 0.05)
    assert torch.load(last, weights_only=True)["global_step"] == 6  # the run went on to its end after the kill
    card = (out / "card.md").read_text()
    assert "GAP-TV" in card and "model" in card and "| cave_sponges_y0x0 |" in card  # the validation windows
    # the card tries other masks on purpose (its table across masks): no warning for each scene's window of each
    # (a 1 h camera-C card logged 11 before), and none for the camera's own mask in the 64² test crops
    log = (out / "card.log").read_text()
    assert "across masks: bernoulli_0.5" in log and "is another camera's" not in log
    assert "across masks: tsa_simulation" in log  # another file's mask, read without the camera's key
    planned = json.loads((out / "plan.json").read_text())["plan"]["camera"]
    assert planned["mask"] == str(mask) and planned["key"] == "code" and planned["noise"]["photons"] == 3000
    # the phases ran as modules (python -m cassi.workflows.train / .card) on the repository's configs, the card's
    # Hydra job named as the script's
    assert (out / "stage2" / "train.log").is_file() and (out / "card_run" / "model_card.log").is_file()
    again = fit(out, *camera, init=init)  # everything done: nothing is redone
    assert again.returncode == 0 and "stage1: done" in again.stdout
    # the README's next command: the user's measurements (a 64² corner of the mask, measured here) with the model
    from cassi import CASSI
    from cassi.io import save_measurement

    code = torch.from_numpy(scipy.io.loadmat(mask)["code"]).float()
    scipy.io.savemat(small := tmp_path / "small.mat", {"code": code[:64, :64].double().numpy()})
    y = CASSI(code[:64, :64], bands=28, step=2)(torch.rand(1, 28, 64, 64, generator=torch.Generator().manual_seed(3)))
    save_measurement(tmp_path / "meas" / "scene.mat", y[0])
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "reconstruct.py"), "data=measurements",
                        "data.predict.entries=meas/*.mat", f"camera.mask={small}", "camera.key=code",
                        f"ckpt={out / 'model.ckpt'}", "output_dir=rec"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = json.loads((tmp_path / "rec" / "summary.json").read_text())["scenes"]
    assert row["status"] == "reconstructed" and "another camera" not in r.stdout + r.stderr
