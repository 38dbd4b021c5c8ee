"""LightningModule that trains a learned reconstructor (e.g. ``cassi.models.GAPNet``) on simulated batches.

Batches come from ``CASSIDataModule``: ground truth "x" (B, C, H, W) with "mask" and "y" = A x
simulated on the model's device. One ``cassi.CASSI`` is built per batch from its masks, the model
runs all its stages, and the loss compares the final (or a weighted sum of the last) stage outputs
with "x". Validation logs PSNR, table PSNR, SSIM and SAM (``val/…``); test (inherited from
:class:`ReconstructionModule`) logs ``test/…`` and per-scene rows. Checkpoints carry what rebuilds
the model from the path alone (``cassi.models.load_model``): its constructor config, the
dispersion geometry it was trained for and the wavelengths.
"""
from __future__ import annotations

import inspect
import logging
import math
from typing import Callable, Sequence

import torch
from lightning.pytorch.callbacks import Timer
from torch import nn

import cassi
from cassi.io import band_wavelengths
from cassi.lightning.module import ReconstructionModule
from cassi.metrics import all_metrics
from cassi.models.camera import describe_camera
from cassi.models.card import training_record
from cassi.models.checkpoint import load_model, resolve_checkpoint
from cassi.models.losses import ReconstructionLoss

log = logging.getLogger(__name__)

__all__ = ["TrainingModule", "warmup_cosine"]


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int | None = None, warmup_steps: int = 0,
                  min_lr: float = 1e-6, progress: Callable[[], float] | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """lr_t = lr·t/warmup for t < warmup, then cosine from lr to ``min_lr`` at ``total_steps``
    (per optimizer step). ``total_steps`` is filled in by :class:`TrainingModule` from the Trainer; a run bounded by
    time alone (``trainer.max_time``, no step or epoch limit) gets ``progress`` instead: the fraction of its time
    budget spent (resumes included), which the cosine then follows."""
    if (total_steps is None) == (progress is None) or (total_steps is not None and total_steps < 1) \
            or warmup_steps < 0:
        raise ValueError(f"need total_steps >= 1 or progress (one of them), and warmup_steps >= 0; got "
                         f"{total_steps}, {progress}, {warmup_steps}")
    base = [g["lr"] for g in optimizer.param_groups]

    def factor(step: int, lr: float) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if progress is not None:
            t = min(1.0, max(0.0, float(progress())))
        else:
            t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        floor = min(min_lr / lr, 1.0) if lr > 0 else 0.0
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda s, lr=lr: factor(s, lr) for lr in base])


class TrainingModule(ReconstructionModule):
    """Trains ``model`` (called as ``model(op, y, return_stages=True) -> [x₀, …, x_K]``).

    Args:
        model: a learned reconstructor with a ``config`` dict (every ``cassi.models`` class has one).
        operator: callable ``mask -> CASSI`` (a Hydra partial of ``cassi.CASSI``: bands/step/offsets/axis/backend).
        loss: callable (pred, target) -> scalar; default L1 (``cassi.models.ReconstructionLoss``).
        optimizer: callable ``params -> Optimizer`` (a Hydra partial); default Adam(lr=4e-4).
        scheduler: callable ``optimizer -> LRScheduler`` stepped every optimizer step, or None; one that
            takes ``total_steps`` gets the Trainer's estimated number of optimizer steps.
        stage_weights: weights of the last len(w) stage outputs in the loss (e.g. [0.5, 0.75, 1], the
            weighted supervision of DPU); None: the final output only.
        wavelengths: nm per band, stored in checkpoints (and used to render previews).
        log_images: how many validation scenes to log as images (to TensorBoard, when that is the logger).
        init_weights: start from these weights (a checkpoint path or ``pretrained/<name>``, e.g. the
            weights-only file ``cassi.models.export_weights`` writes) with a fresh optimizer and schedule;
            the checkpoint's model must have the same constructor arguments as ``model``.
        init_training: the training ``init_weights`` holds in all, {"pieces", "steps", "cpu_min", "wall_min"}
            (any of them), for a checkpoint that does not record it (one written before the record, e.g. the
            shipped models: their cards give the figures); by default it is read from the checkpoint.
    Checkpoints record, besides this run's steps and CPU time, what the weights it started from hold
    (``"cassi"`` entry ``"trained_before"``), so that the total over an ``init_weights=`` chain of runs is
    known (``cassi.models.card.training_record``; model cards state it).
    """

    def __init__(self, model: nn.Module, operator: Callable, loss: Callable | None = None,
                 optimizer: Callable | None = None, scheduler: Callable | None = None,
                 stage_weights: Sequence[float] | None = None, wavelengths: Sequence[float] | str | None = None,
                 log_images: int = 1, init_weights: str | None = None, init_training: dict | None = None):
        super().__init__(model, operator)
        config = getattr(model, "config", None)
        if not isinstance(config, dict) or "_target_" not in config:
            raise TypeError(f"model {type(model).__name__} has no config dict (its constructor call); "
                            f"use a cassi.models class or set model.config = {{'_target_': ..., **kwargs}}")
        if stage_weights is not None:
            stage_weights = [float(w) for w in stage_weights]
            stages = getattr(model, "stages", None)
            if not stage_weights or min(stage_weights) < 0 or (stages is not None and len(stage_weights) > stages):
                raise ValueError(f"stage_weights must be 1..{stages} weights >= 0, got {stage_weights}")
        self.wavelengths = band_wavelengths(wavelengths, getattr(model, "bands", None), "the model reconstructs")
        if init_weights:
            self._init_weights(model, config, init_weights)
        elif init_training:
            raise ValueError("init_training describes the training of init_weights, which is not given")
        self.trained_before = self._trained_before(init_weights, init_training)
        self.loss = loss if loss is not None else ReconstructionLoss("l1")
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.stage_weights, self.log_images = stage_weights, log_images
        self.geometry: dict | None = None
        self.save_hyperparameters({"model": dict(config), "loss": repr(self.loss), "stage_weights": stage_weights,
                                   "wavelengths": self.wavelengths})

    def _init_weights(self, model: nn.Module, config: dict, path: str) -> None:
        """Copy the weights of the checkpoint ``path`` into ``model`` (ValueError when its model differs). A model
        that can start from other weights (other stages, widths, another camera) defines
        ``load_warm_start(trained, path, axis=, wavelengths=)`` and does it itself, given the checkpoint's model and
        this run's dispersion axis and nm per band; any other must match the checkpoint's constructor arguments
        (but ``checkpointing``)."""
        trained = load_model(path)
        model.camera = getattr(trained, "camera", None)  # kept when the run's data record none
        warm_start = getattr(model, "load_warm_start", None)
        if callable(warm_start):
            axis = self.operator(mask=torch.ones(1, 1)).axis if self.operator is not None else None
            warm_start(trained, path, axis=axis, wavelengths=self.wavelengths)
            return
        want = {k: v for k, v in config.items() if k != "checkpointing"}
        have = {k: v for k, v in trained.config.items() if k != "checkpointing"}
        if want != have:
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise ValueError(f"init_weights={path}: its model differs from the configured one in "
                             + ", ".join(f"{k} ({have.get(k)!r} there, {want.get(k)!r} here)" for k in diff))
        missing = model.load_state_dict(trained.state_dict(), strict=False).missing_keys
        if missing:
            raise ValueError(f"init_weights={path}: no weights for {missing[:3]}")

    @staticmethod
    def _trained_before(init_weights: str | None, given: dict | None) -> dict:
        """What the starting weights hold: zero from scratch; else the total training_record of the checkpoint
        ``init_weights``, its figures replaced by those ``given`` (and then taken as exact)."""
        if not init_weights:
            return {"pieces": 0, "steps": 0, "cpu_min": 0.0, "wall_min": 0.0, "partial": []}
        record = training_record(torch.load(resolve_checkpoint(init_weights), map_location="cpu", weights_only=True))
        record = {k: record[k] for k in ("pieces", "steps", "cpu_min", "wall_min", "partial")}
        for k, v in dict(given or {}).items():
            if k not in ("pieces", "steps", "cpu_min", "wall_min"):
                raise ValueError(f"init_training: unknown figure {k!r} (pieces, steps, cpu_min, wall_min)")
            record[k] = float(v) if k.endswith("_min") else int(v)
            record["partial"] = [p for p in record["partial"] if p != k]
        return record

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        cassi.threads.adapt()
        x = batch["x"]
        if self.geometry is None:  # the dispersion it is trained for (a window batch has no mask: any one fits)
            op = self.operator(mask=batch["mask"] if "mask" in batch else torch.ones(1, 1, 1, 1, device=x.device))
            self.geometry = op.geometry.record()
        if "x0" in batch:  # windows of a solver's reconstructions (cassi.data.FirstIterates): the learned part
            windows = getattr(self.reconstructor, "forward_windows", None)  # the models that learn from them
            if windows is None or self.stage_weights is not None:
                raise ValueError(f"training batches of first iterates (x0, r windows) train a model that takes "
                                 f"them (cassi.models.Refiner) without stage_weights, not "
                                 f"{type(self.reconstructor).__name__}"
                                 f"{' with stage_weights' if self.stage_weights is not None else ''}")
            loss = self.loss(windows(batch, self.operator), x)
        elif self.stage_weights is None:
            op = self.operator(mask=batch["mask"])
            loss = self.loss(self.reconstructor(op, batch["y"]), x)
        else:
            op = self.operator(mask=batch["mask"])
            outs = self.reconstructor(op, batch["y"], return_stages=True)[-len(self.stage_weights):]
            loss = sum(w * self.loss(o, x) for w, o in zip(self.stage_weights, outs)) / sum(self.stage_weights)
        self.log("train/loss", loss, prog_bar=True, batch_size=x.shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        x, _ = self.reconstruct(batch)
        scores = all_metrics(x, batch["x"])
        for k, v in scores.items():
            self.log(f"val/{k}", v.mean(), batch_size=x.shape[0], sync_dist=True, prog_bar=k == "psnr")
        if batch_idx < self.log_images:
            self._log_image(x[0], batch["x"][0], batch_idx)

    def _log_image(self, x: torch.Tensor, gt: torch.Tensor, index: int) -> None:
        """Truth | reconstruction as an sRGB-like image (C, H, 2W) to TensorBoard, if that is the logger."""
        experiment = getattr(self.logger, "experiment", None)
        if not hasattr(experiment, "add_image") or not self.trainer.is_global_zero:
            return
        from cassi.viz import to_rgb

        pair = torch.cat([gt, x], dim=-1).clamp(0, 1).float().cpu()
        rgb = torch.as_tensor(to_rgb(pair, self.wavelengths))
        experiment.add_image(f"val/scene{index}", rgb, self.global_step, dataformats="HWC")

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = self.optimizer_factory(params) if self.optimizer_factory else torch.optim.Adam(params, lr=4e-4)
        if self.scheduler_factory is None:
            return opt
        kwargs, wants = {}, inspect.signature(self.scheduler_factory).parameters
        if "total_steps" in wants:
            total = self.trainer.estimated_stepping_batches
            if math.isfinite(total):
                kwargs["total_steps"] = max(1, int(total))
            else:  # bounded by time alone: the schedule follows the time budget (Lightning's Timer, resumable)
                timer = next((c for c in self.trainer.callbacks if isinstance(c, Timer)
                              and getattr(c, "_duration", None)), None)
                if timer is None or "progress" not in wants:
                    raise ValueError("the learning-rate schedule needs an end: set trainer.max_steps, "
                                     "trainer.max_epochs or trainer.max_time")
                kwargs["progress"] = lambda: timer.time_elapsed("train") / timer._duration
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt, **kwargs),
                                                   "interval": "step"}}

    def on_fit_start(self) -> None:
        """The model is trained for the training data's camera from here: its record (from ``init_weights``, e.g. a
        model of another camera being fine-tuned) becomes that one, so that no batch warns of another camera."""
        camera = self._camera()
        if camera is not None:
            self.reconstructor.camera = camera

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["cassi"] = {"model": dict(self.reconstructor.config), "geometry": self.geometry,
                               "wavelengths": self.wavelengths, "version": cassi.__version__,
                               "camera": self._camera(), "trained_before": self.trained_before}

    def _camera(self) -> dict | None:
        """The camera the model is trained for (:mod:`cassi.models.camera`): the training data's simulator (the
        datamodule's, or that of a first-iterate pool), or the camera recorded in ``init_weights``."""
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        train = getattr(dm, "datasets", {}).get("train") if dm is not None else None
        for sim in (getattr(train, "simulator", None), getattr(dm, "simulator", None)):
            camera = describe_camera(sim)
            if camera is not None:
                return camera
        return getattr(self.reconstructor, "camera", None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.geometry = checkpoint.get("cassi", {}).get("geometry")
        # resumed: the run's record (a checkpoint written before it: what this command's init_weights says)
        self.trained_before = checkpoint.get("cassi", {}).get("trained_before", self.trained_before)


def best_score(callback) -> float | None:
    """The best monitored value; under ddp_spawn only the best path comes back to this process, so the
    score is read from the ModelCheckpoint state saved in that checkpoint."""
    if callback is None:
        return None
    if callback.best_model_score is None and callback.best_model_path:
        states = torch.load(callback.best_model_path, map_location="cpu", weights_only=True).get("callbacks", {})
        scores = [s.get("best_model_score") for k, s in states.items() if k.startswith("ModelCheckpoint")
                  and s.get("best_model_path") == callback.best_model_path]
        return float(scores[0]) if scores and scores[0] is not None else None
    return None if callback.best_model_score is None else float(callback.best_model_score)
