"""Fit a learned model to a camera in one command (scripts/fit_camera.py): the recipe that made cave_tsa, planned to a
wall-clock budget and resumable at any moment.

Phases, each a training job (:func:`cassi.workflows.train.train`) in a fresh process (``python -m
cassi.workflows.train``) in its own folder ``D/<phase>``:

1. ``stage1``: GAP-TV corrected by one residual U-Net (``model=refiner``), started from ``init`` (its first U-Net,
   carried to the camera's bands and dispersion axis: ``transfer_weights``), that also reads the mask
   (``model.mask_input``), trained on windows of a pool of GAP-TV reconstructions of training crops measured
   through the camera (relit, shaded, spectrally shifted/stretched, read at scales from ½ to 2: ``zoom``), in 64²
   windows (more steps a minute than cave_tsa's 96²), each stage projected onto y when the camera is noiseless; the
   checkpoint is chosen on validation windows. What each of these choices measured: docs/camera.md.
2. ``stage2`` (when the budget allows): a second U-Net grown on stage 1 (``init_weights``), both trained together;
   where ``init`` has two U-Nets (the default, ``pretrained/cave_any``), this phase first, started from both, at
   any budget.
3. ``stage3`` (from an ``init`` with two U-Nets, at long budgets: :func:`plan`): a third U-Net grown on the pair,
   the three trained together on the same pool; from an ``init`` with three (``cave_any``) at long budgets the
   three, then ``stage3_large``: the three trained on from stage 3's best on 128² windows of the same pool.
4. ``card``: the best checkpoint scored beside A⁺y and GAP-TV on the validation windows (the quadrants of the
   validation scenes it was chosen on) and the test scenes (``python -m cassi.workflows.card``), written as
   ``D/model.ckpt`` (float16 where it costs < 0.05 dB) and ``D/card.md``.

From a model that is not a Refiner (``init``: a converted published model, or any cassi checkpoint of another
architecture, of the camera's band count) the fit has one phase, ``finetune``: that model trained on through the
camera end to end (``model=from_checkpoint``, ``data=cave_train``: random 64² crops of the training scenes measured
through the camera every step, no pool) at ``FINETUNE_LR``, constant, until the budget's end less the card's
reserve, the checkpoint chosen on the validation windows; then the card.

A phase that finished leaves ``D/<phase>/done.json`` (its best checkpoint named relative to ``D``, so that a fit
can be moved, e.g. from a GPU machine, and continued); run the same command again after a stop and it continues:
finished phases are kept, an unfinished training resumes from its ``last.ckpt``, an unfinished pool from its
pieces. ``D/plan.json`` holds the plan (:class:`Plan`, made at the first run and kept) and the progress
(:class:`Progress`: the time spent, booked as it goes, kills included); the last phase trains until the
budget's end, less the card's reserve (:func:`reserve`), from whenever its training loop starts
(``callbacks.deadline``: the pool's time is an estimate, ``machine.scene_s``); with two stages the second is skipped
when what the budget has left is under a fifth of its plan.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from cassi.io import write_text_atomic
from cassi.models import load_model
from cassi.models.refine import Refiner, stage_shapes

__all__ = ["Machine", "Phase", "Plan", "Progress", "camera_overrides", "fit_camera", "fit_from_config", "native_bf16",
           "pick_machine", "plan", "progress", "read_state", "scene_side", "unet_width", "write_camera", "write_state"]

logger = logging.getLogger(__name__)
TRAIN = "cassi.workflows.train"  # the phases' jobs, each run as a module in a fresh process (python -m ...)
CARD = "cassi.workflows.card"
TICK_S = 30  # s between bookings of the time spent (and progress lines) while a phase runs
# recipe overrides for the card's job, not training's
CARD_KEYS = ("validation.", "test.", "baselines.", "masks_baseline.", "half=", "project=", "ensemble=", "across_masks")
SCENE = 256                # px: the side of the pool's scenes and validation windows, where the mask allows
WINDOW = 64                # px: the side of the training windows (the last phase's at long budgets: scene // 2)
SCENE_NM = (400.0, 700.0)  # the training scenes' range (CAVE, 31 bands every 10 nm), resampled to the camera's bands
TEST_SIDES = (100, 150)    # px: the card's test crops (data=shared_cave), centre-cropped to a smaller mask
LARGE_LR = 2.0e-4           # the learning rate of the larger windows' phase (cave_any piece 13's; the recipe's: 1e-3)
FINETUNE = "finetune"       # the one phase of a fit from another architecture than the Refiner's
FINETUNE_LR = 1.0e-4        # its learning rate, constant: a quarter of the MST toolbox's 4e-4 from scratch
CAMERA = "fit"              # D/conf/camera/fit.yaml: the fit's camera, resolved, for each of its jobs (camera=fit)


@dataclass
class Phase:
    name: str
    minutes: float            # wall-clock share of the budget for its training loop
    overrides: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """What a fit does, fixed at its first run (``plan.json``'s "plan"; a fit continued elsewhere keeps it): the
    camera (its resolved config, which every job of the fit reads: :func:`camera_overrides`), the budget, the
    pool's size (scenes), the training phases and the U-Nets' width (the machine's or recipe's raised to the init's:
    :func:`unet_width`; None: the model config's)."""
    camera: dict
    budget_hours: float
    pool: int
    phases: list[Phase]
    width: int | str | None = None


@dataclass
class Progress:
    """How far a fit went (``plan.json``'s "progress"): the minutes spent (booked as it goes, kills included) and
    each phase's training minutes, fixed when it first starts (a resume keeps them)."""
    spent_min: float = 0.0
    minutes: dict[str, float] = field(default_factory=dict)


def camera_overrides(out: Path) -> list[str]:
    """The overrides that give a job of the fit in ``out`` its camera: ``out/conf`` on Hydra's search path, where
    :func:`write_camera` put the plan's camera as ``camera=fit``."""
    conf = str(out / "conf").replace("\\", "\\\\").replace("'", "\\'")
    return [f"hydra.searchpath=['file://{conf}']", f"camera={CAMERA}"]


def write_camera(out: Path, camera: dict) -> None:
    """The plan's camera as the config group option ``camera=fit`` in ``out/conf`` (written at each run, from the
    plan: a moved fit finds it)."""
    path = out / "conf" / "camera" / f"{CAMERA}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# the camera of the fit in {out} (its plan.json's), resolved: every job of the fit reads it\n"
    write_text_atomic(path, head + OmegaConf.to_yaml(OmegaConf.create(camera)))


def write_state(path: Path, fixed: Plan, done: Progress) -> None:
    """Write ``{"plan": ..., "progress": ...}`` to ``path`` (plan.json), atomically (a kill leaves the old one)."""
    write_text_atomic(path, json.dumps({"plan": asdict(fixed), "progress": asdict(done)}, indent=1))


def read_state(path: Path) -> tuple[Plan, Progress] | None:
    """The plan and progress in ``path`` (plan.json), None where there is none."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if "plan" not in data:  # the flat layout of an earlier cassi: the same refusal as its camera overrides
        data = {"plan": {k: data[k] for k in ("camera", "budget_hours", "pool", "phases")}, "progress": {}}
    fixed = data["plan"]
    return (Plan(**{**fixed, "phases": [Phase(**p) for p in fixed["phases"]]}),
            Progress(**data["progress"]))


@dataclass
class Machine:
    """Where a fit runs, as the plan prices it (conf/machine/*.yaml): ``scene_s`` seconds of GAP-TV for one 256² pool
    scene, ``two_stages_min`` the minutes of training from which a second stage is planned, ``train`` train.py
    overrides for every training phase (e.g. the GPU's accelerator and batch). The plan is made once, at a fit's
    first run: a fit continued on another machine keeps it and takes that machine's ``train``. The measured
    values live in conf/machine/cpu.yaml and gpu.yaml only."""
    scene_s: float
    two_stages_min: float
    train: list[str] = field(default_factory=list)

    @property
    def three_stages_min(self) -> float:
        """Minutes of training from which a third U-Net is grown on an init's two, or an init's three are all
        trained: twice ``two_stages_min``."""
        return 2 * self.two_stages_min


def native_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bfloat16 in hardware (x86 ``avx512_bf16`` or ``amx_bf16`` among the flags of
    ``cpuinfo``; False where there is no such file): there fit_camera's machine=auto trains in bf16 mixed
    precision (conf/machine/cpu_bf16.yaml). Elsewhere bfloat16 is emulated, which is not faster."""
    try:
        flags = {f for line in Path(cpuinfo).read_text().splitlines() if line.startswith("flags")
                 for f in line.split(":", 1)[1].split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def unet_width(train: list[str], init: dict) -> int | str | None:
    """The width of the U-Nets a fit trains: the last ``model.width=`` of ``train`` (the machine's overrides, then the
    recipe's), raised to the widest of the ``init`` Refiner's (its config; ``init_weights`` widens a U-Net, never
    narrows one); a list of widths (one per stage) as it is; where ``train`` names none, the init's when one width
    serves all its stages; None: the model config's."""
    given = [o.split("=", 1)[1] for o in train if o.startswith("model.width=")]
    widths = [w for w, _ in stage_shapes(init)] if {"width", "depth", "stages"} <= set(init) else []
    if given:
        return max([int(given[-1]), *widths]) if given[-1].strip().isdigit() else given[-1]
    return widths[0] if widths and len(set(widths)) == 1 else None


def scene_side(camera) -> int:
    """The side (px) of the fit's square scenes for a :class:`cassi.physics.camera.Camera`: 256, or a smaller mask's
    smaller side. ValueError in one line for a camera a fit cannot train for: bands without wavelengths or beyond the
    training scenes' 400–700 nm, a mask of several planes (C, H, W), or one under 64 px (the training windows)."""
    nm = camera.wavelengths
    if nm is None:
        raise ValueError(f"camera.wavelengths=null: a fit makes its training scenes by resampling CAVE "
                         f"({SCENE_NM[0]:g}–{SCENE_NM[1]:g} nm) to the camera's {camera.bands} bands, so it needs their "
                         f"centres: a list of nm, 'tsa' or 'cave'")
    outside = [w for w in nm if not SCENE_NM[0] <= w <= SCENE_NM[1]]
    if outside:
        raise ValueError(f"camera.wavelengths: {len(outside)} band(s) at {', '.join(f'{w:g}' for w in outside[:4])}"
                         f"{' …' if len(outside) > 4 else ''} nm lie outside the {SCENE_NM[0]:g}–{SCENE_NM[1]:g} nm "
                         f"of the training scenes (CAVE): a fit cannot make training data for them")
    sides = [SCENE]
    for part in camera.mixture or [camera]:
        shape = part.mask_shape()
        if shape is None:
            continue
        if len(shape) != 2:
            raise ValueError(f"camera.mask {part.mask} has shape {tuple(shape)}: a fit needs the (H, W) coded "
                             f"aperture, one plane that the dispersion shifts")
        sides.append(min(shape))
    if min(sides) < WINDOW:
        raise ValueError(f"camera.mask is {min(sides)} px on its smaller side: a fit trains on {WINDOW}² windows of "
                         f"scenes the mask covers, so it needs a mask of at least {WINDOW}×{WINDOW}")
    return min(sides)


def reserve(minutes: float) -> float:
    """Minutes of a budget kept for the card and the phases' start-ups: a tenth, at most 5 (a tenth of a long
    budget would be left unused: docs/camera.md)."""
    return min(0.1 * minutes, 5.0)


def plan(budget_hours: float, noiseless: bool, machine: Machine, pool: int | None = None,
         init_stages: int = 1, scene: int = SCENE) -> tuple[int, list[Phase]]:
    """(pool size, phases) for a budget: about a fifth of the time for GAP-TV's pool (``machine.scene_s`` a 256²
    scene), the rest for training.

    From an init with three U-Nets (``init_stages``, e.g. ``cave_any``) all three train together from the start from
    ``machine.three_stages_min`` minutes of training, its first two alone below (as from an init with two); the
    three on 64² windows for two thirds of the training, then on windows of half the ``scene``'s side (128²) at
    ``LARGE_LR`` for the last third (``stage3_large``; where that half is over 64 px): 64² windows flatten within a
    long fit, and larger windows paid on ``cave_any`` (its card, piece 13; the split is not measured).
    From an init with two U-Nets both train together from the start at any budget: all the training time theirs
    under ``machine.three_stages_min`` minutes, else 40% of it, then a third U-Net grown on them and the three
    trained together for 60% (the pair flattens within a long fit; the split is not measured).

    Else one stage under ``machine.two_stages_min`` minutes of training (a second U-Net grown on a short budget did
    not pay), else a first stage alone for 45% of it, then a second grown on it and the pair trained for 55% (on the
    same pool). What each rule measured: docs/camera.md."""
    if budget_hours <= 0:
        raise ValueError(f"budget_hours must be > 0, got {budget_hours}")
    minutes = budget_hours * 60
    pool = pool or int(min(768, max(16, 0.2 * minutes * 60 / machine.scene_s)))
    train = max(1.0, minutes - pool * machine.scene_s / 60 - reserve(minutes))
    project = [f"model.project={str(noiseless).lower()}"]
    def stages(k: int) -> list[str]:  # K U-Nets trained together on the first phase's pool (cache: _phases)
        return [*project, f"model.stages={k}", "data.train.stages=1"]

    if init_stages >= 2:
        if train < machine.three_stages_min:
            return pool, [Phase("stage2", train, stages(2))]
        if init_stages >= 3:
            window = scene // 2  # the last third on windows of half the scene (128² in 256² scenes), where over WINDOW
            if window <= WINDOW:
                return pool, [Phase("stage3", train, stages(3))]
            return pool, [Phase("stage3", 2 / 3 * train, stages(3)),
                          Phase("stage3_large", train / 3, [*stages(3), f"data.train.patch_size={window}",
                                                            f"module.optimizer.lr={LARGE_LR}"])]
        return pool, [Phase("stage2", 0.4 * train, stages(2)), Phase("stage3", 0.6 * train, stages(3))]
    if train < machine.two_stages_min:
        return pool, [Phase("stage1", train, project)]
    return pool, [Phase("stage1", 0.45 * train, project), Phase("stage2", 0.55 * train, stages(2))]


def _best(run: Path) -> Path | None:
    found = sorted((run / "checkpoints").glob("best-*.ckpt"), key=os.path.getmtime)
    return found[-1] if found else None


def _relative(path: Path, out: Path) -> str:
    """``path`` as done.json names it: relative to the fit's folder when inside it (older fits named it absolute)."""
    return str(path.relative_to(out)) if path.is_relative_to(out) else str(path)


def _die_with_parent() -> None:
    """In the child, before it runs (Linux): SIGTERM when the fit process dies, however it dies (a SIGKILL too)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # another platform: a stop of the fit process alone leaves the run going
        pass


def _run(module: str, overrides: list[str], log: Path, tick=None) -> None:
    """Run a module's job (``python -m <module> <overrides>``) in a fresh process, its output appended to ``log``;
    ``tick()`` is called every ``TICK_S`` while it runs (fit_camera books the time spent; a failing tick is reported,
    never fatal). The child ends with this process: on Ctrl-C, SIGTERM or an error here it is stopped (SIGTERM, then
    SIGKILL after 10 s), on a SIGKILL of this process the kernel stops it. RuntimeError naming the log when it
    fails."""
    cmd = [sys.executable, "-m", module, *overrides]
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        try:
            while True:
                try:
                    code = proc.wait(timeout=TICK_S)
                    break
                except subprocess.TimeoutExpired:
                    if tick is not None:
                        try:
                            tick()
                        except Exception as e:  # e.g. a metrics.csv being rewritten, a full disk
                            logger.warning("fit_camera: booking or progress failed (%s); the run goes on", e)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"{module} failed (exit {code}); its log: {log}\n{tail}")


def progress(run: Path) -> str | None:
    """One line on how a phase's run in ``run`` stands, from what it wrote: the pool's last count in its console
    log, then its newest validation (``logs/version_*/metrics.csv``); None before either."""
    import csv
    import re

    line = None
    log = run / "console.log"
    if log.is_file():
        counts = re.findall(r"first iterates: (\d+/\d+) scenes, ([\d.]+) min", log.read_text(errors="replace"))
        if counts:
            line = f"GAP-TV pool {counts[-1][0]} scenes, {counts[-1][1]} min"
    rows = []  # (step, wall minutes or None, validation PSNR) of every validation, resumed pieces in order
    for table in sorted(run.glob("logs/version_*/metrics.csv"), key=os.path.getmtime):
        with open(table, newline="") as f:
            for r in csv.DictReader(f):
                try:  # a row cut short while the logger rewrites its file: skipped
                    rows.append((int(r["step"]), float(r["time/wall_min"]) if r.get("time/wall_min") else None,
                                 float(r["val/psnr"])))
                except (KeyError, TypeError, ValueError):
                    continue
    if rows:
        step, wall, psnr = rows[-1]
        line = (f"step {step}{f', {wall:.1f} min' if wall is not None else ''}: validation {psnr:.2f} dB "
                f"(best {max(r[2] for r in rows):.2f})")
    return line


def pick_machine(cfg, choice: str | None, echo=print) -> Machine:
    """The :class:`Machine` of conf/fit_camera.yaml's ``machine`` group; ``choice`` ``"auto"``: ``gpu`` where torch
    sees CUDA, else ``cpu_bf16`` on a CPU that computes bfloat16 in hardware (:func:`native_bf16`), else ``cpu``
    (composed through Hydra's search path; values given on the command line win). Needs Hydra initialized."""
    import torch
    from hydra import compose

    machine = OmegaConf.to_container(cfg, resolve=True)
    if choice == "auto":
        pick = "gpu" if torch.cuda.is_available() else "cpu_bf16" if native_bf16() else "cpu"
        given = {k: v for k, v in machine.items() if v is not None}
        machine = {**OmegaConf.to_container(compose(config_name=f"machine/{pick}").machine), **given}
        why = {"gpu": "CUDA", "cpu_bf16": "no CUDA GPU, a CPU with bfloat16", "cpu": "no CUDA GPU"}[pick]
        echo(f"fit_camera: machine={pick} ({why} here; give machine=cpu, cpu_bf16 or gpu to choose)")
    machine = Machine(**machine)
    echo(f"fit_camera: plan priced at {machine.scene_s:g} s a pool scene, two stages from {machine.two_stages_min:g} "
         f"min of training (from an init with two, a third from {machine.three_stages_min:g}); the machine's "
         f"train.py overrides: {' '.join(machine.train) or 'none'} (the recipe's and the init's width follow: the "
         f"U-Nets' width is in the next line)")
    return machine


def fit_from_config(cfg, machine_choice: str | None = None, echo=print) -> Path:
    """The job of conf/fit_camera.yaml (scripts/fit_camera.py): the camera checked (ValueError in one line before
    any work: a missing mask file, a geometry a fit cannot train for), the machine picked (:func:`pick_machine`),
    then :func:`fit_camera`. Needs Hydra initialized (for ``machine=auto``)."""
    import cassi.threads
    from cassi.physics.camera import Camera

    cassi.threads.configure(cfg.threads)
    camera = OmegaConf.to_container(cfg.camera, resolve=True)
    cam = Camera(**camera)
    cam.check()  # a missing file first
    scene = scene_side(cam)  # 256, or a smaller mask's side
    cam.check(frame=(scene, scene))
    machine = pick_machine(cfg.machine, machine_choice, echo)
    return fit_camera(cfg.output_dir, camera, machine, cfg.budget_hours, [f"threads={cfg.threads}", *cfg.recipe],
                      cfg.pool, init=cfg.init, echo=echo, scene=scene, bands=cam.bands)


def fit_camera(output_dir, camera: dict, machine: Machine, budget_hours: float = 3.0,
               recipe: list[str] | None = None, pool: int | None = None,
               init: str | None = None, echo=print, scene: int = SCENE, bands: int | None = None) -> Path:
    """Run (or continue) the phases into ``output_dir``; returns ``output_dir/model.ckpt``. ``camera``: the camera's
    resolved config (conf/camera; every job of the fit reads it, and a fit continues only with the same; noiseless
    where its ``noise`` names none); ``recipe``: more
    overrides for every training run (e.g. smaller data for a test); ``init``: the weights the fit starts from (a
    Refiner checkpoint or ``pretrained/<name>``, carried to the camera's bands and dispersion axis; a model of
    another architecture: fine-tuned, module docstring), None: from scratch; ``bands``: the camera's band count (a
    fine-tuned model must have it); ``machine``: where it runs (the plan's prices and train.py overrides); ``scene``: the side of the
    pool's scenes and the validation windows (:func:`scene_side`: under 256 for a smaller mask, which the card's
    test crops are then cut to as well)."""
    out = Path(output_dir).resolve()
    state_path = out / "plan.json"
    train = [*machine.train, *(recipe or [])]  # a recipe's model.width= (e.g. 16 under cpu_bf16) has the last word
    state = read_state(state_path)
    start = load_model(init) if init and not state else None
    if start is not None and not isinstance(start, Refiner) and bands is not None and start.bands != bands:
        raise ValueError(f"init={init} holds a {type(start).__name__} of {start.bands} bands; the camera has {bands}: "
                         f"a fine-tune keeps the model's bands (a Refiner init is carried to any band count)")
    out.mkdir(parents=True, exist_ok=True)
    if state and isinstance(state[0].camera, list):  # planned before the camera was stored resolved
        raise ValueError(f"{out} holds a fit planned by an earlier cassi with the camera overrides "
                         f"{' '.join(state[0].camera)}: continue it with that version, or start it in another "
                         f"output_dir")
    if state and (state[0].camera != camera or state[0].budget_hours != budget_hours):
        was = state[0].camera
        differ = ", ".join(f"{k}={was.get(k)!r} (now {camera.get(k)!r})" for k in sorted({*was, *camera})
                           if was.get(k) != camera.get(k))
        raise ValueError(f"{out} holds a fit for another camera or budget ({differ or 'the same camera'}; budget "
                         f"{state[0].budget_hours} h, now {budget_hours} h); give the same camera and budget to "
                         f"continue it, or another output_dir")
    noiseless = not any(v is not None for v in (camera.get("noise") or {}).values())
    if scene < SCENE:
        echo(f"fit_camera: scenes and validation windows of {scene}² px, the mask's smaller side (under {SCENE})")
    if state:  # planned at the first run: a fit continued elsewhere (a GPU's, on the CPU) keeps its plan
        fixed, done = state
    else:
        if start is not None and not isinstance(start, Refiner):
            if budget_hours <= 0:
                raise ValueError(f"budget_hours must be > 0, got {budget_hours}")
            minutes = budget_hours * 60
            fixed = Plan(camera, budget_hours, 0, [Phase(FINETUNE, max(1.0, minutes - reserve(minutes)))])
        else:
            config = getattr(start, "config", {})
            size, phases = plan(budget_hours, noiseless, machine, pool, init_stages=config.get("stages", 1),
                                scene=scene)
            fixed = Plan(camera, budget_hours, size, phases, unet_width(train, config))
        done = Progress()
        if fixed.phases[0].name != FINETUNE and unet_width(train, {}) not in (None, fixed.width):
            # the machine or recipe named a narrower width
            echo(f"fit_camera: U-Nets of width {fixed.width}, the init's, wider than the machine's or recipe's "
                 f"(a U-Net can be widened, not narrowed)")
    # the width fixed by the plan (a fit continued on a machine of another width keeps its own)
    train = [o for o in train if not o.startswith("model.width=")] + ([f"model.width={fixed.width}"]
                                                                      if fixed.width else [])
    if scene < SCENE:  # the recipe's own sizes, given after these, still win
        card = [f"validation.test.crop_to={scene}"]
        if scene < max(TEST_SIDES):
            card.append(f"test.test.crop_to={max((t for t in TEST_SIDES if t <= scene), default=scene)}")
        pool = [] if fixed.phases[0].name == FINETUNE else [f"data.train.cubes.patch_size={scene}"]
        train = [*pool, f"data.val.crop_to={scene}", *card, *train]
    clock, shown = time.monotonic(), None

    def save(book: bool = True, run: Path | None = None) -> None:
        """Book the time since the last booking as spent (kept across kills); echo the run's progress if new."""
        nonlocal clock, shown
        if run is not None and (line := progress(run)) and line != shown:
            shown = line
            echo(f"  {run.name}: {line}")
        now = time.monotonic()
        if book:
            done.spent_min += (now - clock) / 60
        clock = now
        write_state(state_path, fixed, done)

    save(book=False)
    write_camera(out, fixed.camera)
    stop = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():  # SIGTERM (kill, a scheduler) ends the run in it too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return _phases(out, fixed, done, train, init, save, echo)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)


def _phases(out: Path, fixed: Plan, done: Progress, recipe, init, save, echo) -> Path:
    """fit_camera's phases in turn (those done are kept), then the card."""
    budget_hours, phases, size, width = fixed.budget_hours, fixed.phases, fixed.pool, fixed.width
    if phases[0].name == FINETUNE:
        echo(f"fit_camera: fine-tuning {init} end to end through the camera, budget {budget_hours:g} h "
             f"({done.spent_min:.1f} min spent before) -> {out}")
        base = ["model=from_checkpoint", f"model.path={init}", "data=cave_train", *camera_overrides(out),
                "data.val.crop_grid=2", f"module.optimizer.lr={FINETUNE_LR}", "module.scheduler=null",
                "trainer.max_epochs=-1", "test=false", "callbacks.progress=null"]
    else:
        echo(f"fit_camera: {len(phases)} training phase(s), pool of {size} scenes, "
             f"U-Nets of width {width if width is not None else 'the model config sets'}, budget {budget_hours:g} h "
             f"({done.spent_min:.1f} min spent before) -> {out}")
        base = ["experiment=cave_tsa", "model.mask_input=true", *camera_overrides(out),
                f"data.train.cubes.samples_per_epoch={size}", "data.train.cubes.spectral_shift=10",
                "data.train.cubes.spectral_stretch=0.05", "data.train.cubes.zoom=1", f"data.train.patch_size={WINDOW}",
                "test=false", "callbacks.progress=null"]
    previous = None
    for phase in phases:
        run = out / phase.name
        finished = run / "done.json"
        if finished.is_file():
            previous = out / json.loads(finished.read_text())["best"]  # relative (a fit's folder can be moved)
            echo(f"  {phase.name}: done ({previous.name})")
            continue
        run.mkdir(exist_ok=True)
        last = run / "checkpoints" / "last.ckpt"
        # the last phase trains until the budget's end (less the card's reserve), however long its pool takes: the
        # plan's pool time is an estimate (machine.scene_s), cameras differ, and what a faster pool leaves is training's
        end = budget_hours * 60 - reserve(budget_hours * 60) - done.spent_min
        if phase.name not in done.minutes:
            done.minutes[phase.name] = end if phase is phases[-1] and len(phases) > 1 else phase.minutes
            save()
        left = done.minutes[phase.name]
        if previous is not None and left < 0.2 * phase.minutes:  # too little left for it to pay: the last one stands
            echo(f"  {phase.name}: skipped, {max(left, 0):.1f} of its planned {phase.minutes:.1f} min are left")
            write_text_atomic(finished, json.dumps({"best": _relative(previous, out), "skipped": True}))
            continue
        left = max(1.0, left)
        deadline = [f"callbacks.deadline.at={time.time() + 60 * max(end, 1.0):.0f}"] if phase is phases[-1] else []
        hms = f"00:{int(left // 60):02d}:{int(left % 60):02d}:{int(round(left % 1 * 60)) % 60:02d}"
        overrides = [*base, *phase.overrides, f"hydra.run.dir={run}", f"paths.output_dir={run}",
                     f"trainer.max_time={hms}", *deadline, "trainer.max_steps=-1",
                     *([f"init_weights={previous or init}"] if (previous or init) and not last.is_file() else []),
                     *([f"ckpt_path={last}"] if last.is_file() else []),
                     *([f"data.train.cache={out / phases[0].name / 'first_iterates.pt'}"] if phase is not phases[0] else []),
                     *[o for o in recipe or [] if not o.startswith(CARD_KEYS)]]
        span = (f"until the budget's end, {max(end, 1.0):.1f} min from now"
                f"{'' if phase.name == FINETUNE else ' (its pool included)'}" if deadline
                else f"for up to {left:.1f} min")
        echo(f"  {phase.name}: training {span}{' (resumed)' if last.is_file() else ''}; "
             f"log {run / 'console.log'}")
        _run(TRAIN, overrides, run / "console.log", tick=lambda: save(run=run))  # train.log: Hydra's own
        save()
        previous = _best(run)
        if previous is None:
            raise RuntimeError(f"{phase.name} wrote no best checkpoint in {run / 'checkpoints'}")
        write_text_atomic(finished, json.dumps({"best": _relative(previous, out)}))
        echo(f"  {phase.name}: best {previous.name}")
    model = out / "model.ckpt"
    if not model.is_file():
        echo("  card: scoring the model beside A⁺y and GAP-TV")
        _run(CARD, [f"ckpt={previous}", "name=model", "ship=true", f"out_dir={out}", *camera_overrides(out),
                    "validation.test.crop_grid=2",  # the validation windows the checkpoint was chosen on
                    f"hydra.run.dir={out / 'card_run'}", *[o for o in recipe or [] if o.startswith(CARD_KEYS)]],
             out / "card.log", tick=save)
        save()
        shutil.move(str(out / "model.md"), out / "card.md")
    echo(f"fit_camera: {model} and {out / 'card.md'} (load with ckpt={model})")
    return model

