"""Training windows of precomputed solver reconstructions, for a learned correction of that solver
(``cassi.models.Refiner``: x = x₀ + s·U([x₀, r] / s)): x₀ = solver(op, y), r = A⁺(y − A x₀), s = mean(x₀)/0.5.

Every scene is simulated and reconstructed once (and cached in a pool file); training then sees random windows
of (x, x₀, r) — no operator and no solver in the training loop::

    pool = FirstIterates(cubes, simulator, model.solver_spec, patch_size=64, samples_per_epoch=4096)
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import Dataset

from cassi._checks import plain
from cassi.data.datasets import stable_seed
from cassi.solvers.base import DEFAULT_SOLVER, Solver, build_solver

__all__ = ["FirstIterates", "POOL_CHUNK", "scene_scale"]

log = logging.getLogger(__name__)

#: scenes of a pool (:class:`FirstIterates`) solved at once, by device type: one on the CPU (several at once were
#: no faster there), 32 on a GPU (one 256² scene leaves it idle between kernels)
POOL_CHUNK = {"cpu": 1, "cuda": 32}


def scene_scale(x0: torch.Tensor) -> torch.Tensor:
    """s = mean(x₀)/0.5 per sample (B, 1, 1, 1); an all-dark sample keeps s = 2e-6."""
    return (x0.detach().mean(dim=(1, 2, 3), keepdim=True) / 0.5).clamp_min(2e-6)


class FirstIterates(Dataset):
    """Training windows for a ``cassi.models.Refiner``: every sample of ``cubes`` is simulated once (y from
    ``simulator``'s training masks and noise, seeded per sample) and reconstructed by ``solver``; then
    each item is a random ``patch_size`` window (and flip) of one scene's (x, x₀, r).

    Args:
        cubes: a dataset of {"x": (C, H, W), "name"} (e.g. ``CubeFiles`` with patch_size=256, augment and
            samples_per_epoch = the number of scenes); each sample is taken once, at epoch 0.
        simulator: a ``cassi.physics.Simulator`` (its ``masks``, geometry and noise).
        solver: the first iterate's solver: the Refiner's ``solver`` dict (or a Solver; default GAP-TV as shipped).
        patch_size: window size (int or (h, w)); samples_per_epoch: windows per epoch; seed: window i of
            epoch e comes from (seed, e, i).
        cache: a file keeping the computed scenes (x, x₀, r in float16) so that a resumed or repeated run skips the
            solver; used only when it was made from the same scenes, solver and simulator, else rebuilt.
        stages, init: the windows feed stage ``stages`` of a Refiner (a model of more stages trains it and every
            later one end to end: ``data.train.stages=1 model.stages=2``); for stages > 1 the
            stages before it come from ``init``, a trained Refiner checkpoint (``init_weights``) with at least
            stages − 1 stages: x₀, r become its (stages − 1)-th estimate and what that leaves of y.
        load: how ``init`` becomes a model, ``load(init, map_location=device)`` (``cassi.models.load_model``, which
            the configs give; needed for stages > 1). The model needs ``stages``, ``project`` and
            ``step(op, y, x, r, k) -> (x, r)``, as a Refiner has.
        project: the trained Refiner's ``project`` (the earlier stages' outputs are projected alike).
        device: where the solver (and the earlier stages) run over the scenes: None, CUDA when there is one; the
            scenes are kept on the CPU either way (the masks and noise are drawn on the CPU: the same masks, the
            noise equal up to the rounding of y).

    Items: {"x", "x0", "r": (C, h, w) float32 (x0, r: the trained stage's input), "mask": (1|C, h, w) the
    scene's mask there, "noise": (1, h', w') the scene's measurement noise y − A x over the window's own
    measurement A x (h' = h + Δ along h, or w' = w + Δ along w), "scale": (1, 1, 1) the whole scene's s =
    mean(x0)/0.5, "name", "stage": ``stages`` − 1,
    the stage they feed (0-based): a model of more stages trains that one and every later one end to end}. They
    flip together, across the dispersion axis only (a flip along it would show errors of the opposite dispersion
    direction).
    Under DDP one process per node computes the scenes (``CASSIDataModule.prepare_data``) and the other ranks
    load them from ``cache``.
    """

    def __init__(self, cubes: Dataset, simulator, solver=None, patch_size=64, samples_per_epoch: int = 1024,
                 seed: int = 0, cache: str | os.PathLike | None = None, stages: int = 1,
                 init: str | os.PathLike | None = None, project: bool = False, device: str | None = None,
                 load: Callable | None = None):
        self.cubes, self.simulator, self.seed, self.epoch = cubes, simulator, int(seed), 0
        self.device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        self.stages, self.init, self.project, self.load = int(stages), init, bool(project), load
        if self.stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages!r}")
        if self.stages > 1 and not init:
            raise ValueError(f"training stage {self.stages} of a Refiner needs the {self.stages - 1} before it: "
                             f"give init_weights=<a trained Refiner checkpoint with >= {self.stages - 1} stages>")
        if self.stages > 1 and not callable(load):
            raise ValueError(f"training stage {self.stages} of a Refiner loads init {init}: give load, how a "
                             f"checkpoint becomes a model (e.g. cassi.models.load_model), got {load!r}")
        self.solver_spec = solver if isinstance(solver, Solver) else plain(DEFAULT_SOLVER if solver is None else solver)
        self.patch = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        self.length = int(samples_per_epoch)
        if self.length < 1 or len(self.patch) != 2 or min(self.patch) < 1:
            raise ValueError(f"need samples_per_epoch >= 1 and a positive patch_size, got "
                             f"{samples_per_epoch!r}, {patch_size!r}")
        self.files = getattr(cubes, "files", None)  # for the datamodule's split-overlap check
        self.seeds = getattr(cubes, "seeds", None)
        self._scenes: dict | None = None
        self.cache = None if cache is None else Path(cache)
        # windows flip across the dispersion axis only: a flip along it would reverse the dispersion direction
        self.flip_dim = -1 if getattr(simulator, "axis", "w") == "h" else -2

    # ------------------------------------------------------------------ the scenes
    def _key(self) -> dict:
        """What the cached scenes depend on: the solver, the simulator (geometry, noise, the mask source's
        settings and mask), the scenes' dataset settings and this dataset's seed (masks and noise)."""
        def settings(obj) -> dict:
            plain = (int, float, str, bool, type(None))
            return {k: (_text(v) if not isinstance(v, plain) else v) for k, v in sorted(vars(obj).items())
                    if not k.startswith("_") and k not in ("epoch", "cache") and not isinstance(v, torch.Tensor)}

        def opaque(v) -> bool:  # printed as <… object at 0x…>: an address, another in every process
            return type(v).__repr__ is object.__repr__ and hasattr(v, "__dict__")

        def _text(v) -> str:
            """str(v), with the objects that lack a repr (a mixture's CubeFiles source) written as their settings."""
            if opaque(v):
                return f"{type(v).__name__}({settings(v)})"
            if isinstance(v, (list, tuple)) and any(opaque(i) for i in v):
                return "[" + ", ".join(_text(i) for i in v) + "]"
            if isinstance(v, dict) and any(opaque(i) for i in v.values()):
                return "{" + ", ".join(f"{k!r}: {_text(i)}" for k, i in v.items()) + "}"
            return str(v)

        masks = getattr(self.simulator, "masks", None)
        mask = getattr(masks, "mask", None)
        digest = hashlib.blake2b(mask.numpy().tobytes()).hexdigest() if isinstance(mask, torch.Tensor) else None
        return {"solver": repr(self.solver_spec), "simulator": repr(self.simulator), "mask": digest,
                "masks": settings(masks) if masks is not None else None, "count": len(self.cubes),
                "cubes": settings(self.cubes), "seed": self.seed}

    def _fits(self, stored: dict) -> bool:
        """Whether a cache's stored key describes the scenes of ``_key()``. A setting of the scenes' dataset or the
        mask source that the stored key lacks (an option added since) counts as its constructor's default."""
        now = self._key()
        if not isinstance(stored, dict) or stored.keys() != now.keys():
            return False
        for part, obj in (("masks", getattr(self.simulator, "masks", None)), ("cubes", self.cubes)):
            if isinstance(stored[part], dict) and isinstance(now[part], dict):
                default = {}  # constructor defaults, a subclass's over its bases'
                for cls in reversed(type(obj).__mro__):
                    if "__init__" in vars(cls) and cls is not object:
                        default.update((k, p.default) for k, p in inspect.signature(cls.__init__).parameters.items())
                stored = {**stored, part: {**{k: default[k] for k in now[part].keys() - stored[part].keys()
                                              if k in default}, **stored[part]}}
        return stored == now

    @property
    def scenes(self) -> dict:
        """{"x", "x0", "r": (N, C, H, W) float16, "y": (N, 1, H, W+Δ), "mask": (N, 1|C, H, W), "scale": (N, 1, 1, 1),
        "names"}: computed (or read from the
        cache) on first use, or by :meth:`prepare`."""
        if self._scenes is None:
            self._scenes = self._noise(self._advance(self._load() or self._compute()))
        return self._scenes

    def prepare(self) -> None:
        """Compute (or load) the scenes now: the datamodule calls this in the main process before training,
        so that data-loader workers share them instead of each running the solver."""
        self.scenes

    def _load(self) -> dict | None:
        if self.cache is None or not self.cache.is_file():
            return None
        try:
            # memory-mapped: the scenes stay in the page cache, shared by every process that trains on this file
            data = torch.load(self.cache, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # a partial or foreign file: rebuild it
            log.warning("first iterates: %s is unreadable (%s): recomputing", self.cache, e)
            return None
        if not self._fits(data.get("key")):
            log.warning("first iterates: %s was made from other scenes, solver or simulator: recomputing", self.cache)
            return None
        if self._too_small(data["x"]):
            log.warning("first iterates: %s holds scenes smaller than patch_size %s: recomputing", self.cache,
                        self.patch)
            return None
        log.info("first iterates: %d scenes from %s", len(data["names"]), self.cache)
        shutil.rmtree(self._parts(), ignore_errors=True)  # a kill between the last write and the pieces' removal
        return data

    def _parts(self) -> Path | None:
        """The folder of the pool's finished pieces while it is computed (``<cache>.parts``), None without a cache."""
        return None if self.cache is None else self.cache.with_name(self.cache.name + ".parts")

    def _resume(self, data: dict, n: int, key: dict) -> int:
        """Fill ``data`` from the pieces a stopped computation left (``<cache>.parts/<start>.pt``, rows
        start…start+len); returns the number of leading scenes restored (0: start afresh, stale pieces removed)."""
        parts = self._parts()
        if parts is None or not parts.is_dir():
            return 0
        done = 0
        for f in sorted(parts.glob("*.pt"), key=lambda f: int(f.stem) if f.stem.isdigit() else -1):
            try:
                piece = torch.load(f, map_location="cpu", weights_only=True)
            except Exception:  # a foreign file (pieces are written atomically): what came before it stands
                break
            if piece.get("key") != key or piece.get("start") != done or piece.get("count") != n:
                break
            rows = len(piece["names"])
            for k, v in piece["rows"].items():
                if k not in data:
                    data[k] = torch.empty((n, *v.shape[1:]), dtype=v.dtype)
                data[k][done:done + rows] = v
            data["names"].extend(piece["names"])
            done += rows
        if done == 0:
            shutil.rmtree(parts, ignore_errors=True)
        else:
            log.info("first iterates: %d/%d scenes restored from %s", done, n, parts)
        return done

    def _compute(self) -> dict:
        """Run the solver on every scene; with a cache, the finished scenes are saved in pieces of about a tenth as
        it goes (``<cache>.parts``), so that a run stopped at any moment continues where it was. The pieces and
        the cache are both on disk at the end, briefly: twice the pool's size."""
        from cassi.io import remove_leftovers, write_text_atomic

        solver = build_solver(self.solver_spec)
        n = len(self.cubes)
        if callable(getattr(self.cubes, "set_epoch", None)):
            self.cubes.set_epoch(0)  # the scenes are drawn once
        data: dict = {"names": []}  # filled in place: (N, …) tensors allocated at the first scene, no second copy
        if self.cache is not None:  # what a kill during the last write left
            remove_leftovers(self.cache)
        key = self._key()
        start, parts = self._resume(data, n, key), self._parts()
        try:
            self._solve_all(solver, data, start, n, key)
        except ValueError:  # bad scenes: nothing of them stays (a stop or any other failure keeps the pieces)
            if parts is not None:
                shutil.rmtree(parts, ignore_errors=True)
            raise
        data["key"] = key
        if self.cache is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.cache, lambda tmp: torch.save(data, tmp))
            shutil.rmtree(parts, ignore_errors=True)
        return data

    def _solve_all(self, solver, data: dict, start: int, n: int, key: dict) -> None:
        """Scenes start…n−1 into ``data`` (rows allocated at the first), a piece saved every tenth. Each scene is
        measured on its own (its own seed); the solver runs on ``POOL_CHUNK[device]`` scenes at once (on a GPU a
        single 256² scene leaves it idle between kernels), which gives each scene what it gives alone (a solver with a
        tolerance, which would stop a batch on its largest residual, gets one scene at a time)."""
        from rich.progress import Progress

        from cassi.io import write_text_atomic

        parts, every, piece_start = self._parts(), max(1, n // 10), start
        chunk = max(1, POOL_CHUNK.get(self.device.type, 1)) if not getattr(solver, "tol", 0) else 1
        t0 = time.monotonic()
        with Progress(transient=False) as bar, torch.no_grad():
            task = bar.add_task(f"first iterates ({type(solver).__name__}) of {n} scenes", total=n, completed=start)
            i = start
            while i < n:
                xs, ys, masks, names = [], [], [], []
                for j in range(i, min(n, i + chunk)):
                    item = self.cubes[j]
                    x = item["x"][None].float().to(self.device)
                    if self._too_small(x):  # before the solver runs
                        raise ValueError(f"patch_size {self.patch} is larger than the scenes "
                                         f"({x.shape[-2]}×{x.shape[-1]})")
                    seed = stable_seed(self.seed, "first-iterates", j, item.get("name", ""))
                    gen = torch.Generator().manual_seed(seed)
                    batch = self.simulator({"x": x}, generator=gen, training=True)
                    ref = (data["x"].shape[1:], data["mask"].shape[1:]) if "x" in data else \
                        (xs[0].shape[1:], masks[0].shape[1:]) if xs else None
                    if ref is not None and (x.shape[1:] != ref[0] or batch["mask"].shape[1:] != ref[1]):
                        raise ValueError(f"FirstIterates needs scenes of one size (give cubes a patch_size or "
                                         f"crop_to): "
                                         f"scene {j} ({item.get('name', j)}) is {tuple(x.shape[1:])} with a mask "
                                         f"{tuple(batch['mask'].shape[1:])}, scene 0 {tuple(ref[0])} with "
                                         f"{tuple(ref[1])}")
                    xs.append(x), ys.append(batch["y"]), masks.append(batch["mask"])
                    names.append(str(item.get("name", j)))
                x, y, mask = torch.cat(xs), torch.cat(ys), torch.cat(masks)
                op = self.simulator.operator(mask, x.shape[1])
                x0 = solver(op, y).x
                # y in float32: the residuals y − A x are far below y
                rows = {"x": x.half(), "x0": x0.half(), "r": op.pinv(y - op(x0)).half(),
                        "y": y.float(), "mask": mask.float(), "scale": scene_scale(x0)}
                end = i + len(names)
                for k, v in rows.items():
                    if k not in data:
                        data[k] = torch.empty((n, *v.shape[1:]), dtype=v.dtype)
                    data[k][i:end] = v
                data["names"].extend(names)
                bar.advance(task, len(names))
                if parts is not None and end < n and (end - piece_start >= every):  # a piece: rows piece_start…end−1
                    parts.mkdir(parents=True, exist_ok=True)
                    piece = {"key": key, "start": piece_start, "count": n, "names": data["names"][piece_start:],
                             "rows": {k: v[piece_start:end].clone() for k, v in data.items() if k != "names"}}
                    write_text_atomic(parts / f"{piece_start}.pt", lambda tmp: torch.save(piece, tmp))
                    piece_start = end
                if not bar.console.is_terminal and end // every > i // every:  # a log file: about 10 lines
                    log.info("first iterates: %d/%d scenes, %.1f min", end, n, (time.monotonic() - t0) / 60)
                i = end

    def _too_small(self, x: torch.Tensor) -> bool:
        """True when the scenes x (…, H, W) are smaller than a window."""
        return any(n < p for n, p in zip(x.shape[-2:], self.patch))

    def _advance(self, data: dict) -> dict:
        """x0, r, scale after the first stages − 1 stages of the ``init`` Refiner (unchanged for stages = 1)."""
        if self.stages == 1:
            return data
        model = self.load(self.init, map_location=self.device)
        if not (callable(getattr(model, "step", None)) and callable(getattr(model, "refine", None))) \
                or getattr(model, "stages", 0) < self.stages - 1:
            raise ValueError(f"init {self.init}: stage {self.stages} is trained on the output of stages "
                             f"1..{self.stages - 1} of a Refiner, but it holds {model!r}")
        model.project = self.project  # chained as the Refiner being trained chains them
        data = dict(data, x0=data["x0"].clone(), r=data["r"].clone(), scale=data["scale"].clone())
        with torch.no_grad():
            for i in range(len(data["names"])):
                y, mask = data["y"][i:i + 1].to(self.device), data["mask"][i:i + 1].to(self.device)
                op = self.simulator.operator(mask, data["x"].shape[1])
                x, r = data["x0"][i:i + 1].to(self.device).float(), data["r"][i:i + 1].to(self.device).float()
                for k in range(self.stages - 1):
                    x, r = model.step(op, y, x, r, k)
                data["x0"][i], data["r"][i], data["scale"][i] = x[0].half(), r[0].half(), scene_scale(x)[0]
        log.info("first iterates: %d scenes through stages 1..%d of %s", len(data["names"]), self.stages - 1,
                 self.init)
        return data

    def _noise(self, data: dict) -> dict:
        """``data`` with "n" (N, 1, H', W') float16: each scene's measurement noise, n = y − A x (of the stored
        float16 x: only its rounding where the camera is noiseless). Windows carry it, so that the stages after
        the first train on residuals of the noisy measurement, A⁺(A x + n − A x̃), as they meet them at inference."""
        n = torch.empty(data["y"].shape, dtype=torch.float16)
        with torch.no_grad():
            for i in range(len(data["names"])):
                x = data["x"][i:i + 1].to(self.device).float()
                op = self.simulator.operator(data["mask"][i:i + 1].to(self.device), x.shape[1])
                n[i] = (data["y"][i:i + 1].to(self.device) - op(x))[0].half().cpu()
        return dict(data, n=n)

    # ------------------------------------------------------------------ windows
    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        s = self.scenes
        g = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch, index))
        n, (H, W), (h, w) = s["x"].shape[0], s["x"].shape[-2:], self.patch
        j = int(torch.randint(n, (), generator=g))
        top, left = (int(torch.randint(m, (), generator=g)) for m in (H - h + 1, W - w + 1))
        flips = [self.flip_dim] if int(torch.randint(2, (), generator=g)) else []
        dh, dw = (a - b for a, b in zip(s["n"].shape[-2:], (H, W)))  # y's extent beyond x: the dispersion
        cuts = {k: s[k][j, :, top:top + h, left:left + w] for k in ("x", "x0", "r", "mask")}
        cuts["noise"] = s["n"][j, :, top:top + h + dh, left:left + w + dw]
        out = {k: (v.float().flip(flips) if flips else v.float()).contiguous() for k, v in cuts.items()}
        return out | {"scale": s["scale"][j].float(), "name": s["names"][j], "stage": self.stages - 1}
