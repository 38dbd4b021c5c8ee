"""Load a trained model from a checkpoint path alone (no training config, no Lightning, no Hydra).

A cassi checkpoint is a Lightning checkpoint written by ``cassi.lightning.TrainingModule``; besides
the weights (``state_dict``, EMA weights when EMA was on) it holds an entry ``"cassi"``:
{"model": {"_target_": a registered class (:mod:`cassi.registry`), **constructor arguments}, "geometry": {"offsets", "axis",
"bands"}, "wavelengths": [nm] | None}. ``pretrained/<name>`` names a checkpoint shipped in
``cassi/pretrained/<name>.ckpt``.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import torch
from torch import nn

from cassi.registry import resolve

__all__ = ["architecture", "export_weights", "load_model", "load_prior", "resolve_checkpoint", "PRETRAINED_DIR"]

PRETRAINED_DIR = Path(__file__).resolve().parents[1] / "pretrained"
PREFIX = "reconstructor."  # the model's attribute in TrainingModule


def resolve_checkpoint(path) -> Path:
    """The checkpoint file for a path or a ``pretrained/<name>``; FileNotFoundError naming it otherwise."""
    text = os.fspath(path)
    if text.startswith("pretrained/") and not Path(text).exists():
        name = text.split("/", 1)[1].removesuffix(".ckpt")
        found = PRETRAINED_DIR / f"{name}.ckpt"
        if not found.is_file():
            have = sorted(p.stem for p in PRETRAINED_DIR.glob("*.ckpt")) if PRETRAINED_DIR.is_dir() else []
            raise FileNotFoundError(f"no pretrained model {name!r}; shipped: {have or 'none'}")
        return found
    p = Path(text).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {text} does not exist")
    return p


def _read(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch file, truncated, or not loadable as plain data
        raise ValueError(f"{path} is not a cassi checkpoint: torch.load failed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from e
    if not isinstance(ckpt, dict) or "cassi" not in ckpt or "state_dict" not in ckpt:
        raise ValueError(f"{path} is not a cassi checkpoint (no 'cassi' entry: it was not written by "
                         f"cassi.lightning.TrainingModule)")
    return ckpt


def _build(spec, path: Path) -> nn.Module:
    """The model a checkpoint's spec {"_target_": registered class name, **arguments} describes; ValueError
    naming the file when the class is not registered (nothing is imported) or the arguments do not fit."""
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: the model spec must be a dict {{'_target_': ..., **arguments}}, got {type(spec).__name__}")
    spec = dict(spec)
    try:
        cls = resolve(spec.pop("_target_", None), nn.Module, "model class")
        return cls(**spec)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def load_model(path, map_location="cpu", operator=None) -> nn.Module:
    """The trained model of a cassi checkpoint (a path or ``pretrained/<name>``), in eval mode on
    ``map_location``, called like a solver: ``model(op, y) -> x`` (B, C, H, W). Its ``geometry``
    (offsets, axis) and band count are checked against every operator it is given, and at once
    against ``operator`` (a callable ``mask -> CASSI``, e.g. the configured partial) when given, so
    that a mismatch fails before any work."""
    path = resolve_checkpoint(path)
    ckpt = _read(path)
    info = ckpt["cassi"]
    model = _build(info["model"], path)
    state = {k[len(PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(PREFIX)}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"{path}: the weights do not fit {info['model'].get('_target_')}: "
                         f"{str(e).splitlines()[0]}") from e
    model.geometry = info.get("geometry")
    model.camera = info.get("camera")  # the training masks and noise (cassi.models.camera): checked per operator
    model.wavelengths = info.get("wavelengths")
    model.converted = info.get("converted")  # a published model's source, method, file (cassi.models.zoo.convert)
    model.source = str(path)
    if operator is not None:  # the band count and dispersion (a stand-in mask: its size and camera come later)
        model.check_geometry(operator(mask=torch.ones(1, 1)))
    return model.to(map_location).eval()


def architecture(path) -> nn.Module:
    """The model a cassi checkpoint (a path or ``pretrained/<name>``) describes, untrained: its class and constructor
    arguments, fresh weights (``model=from_checkpoint``: fine-tune it with ``init_weights=``, or train it from
    scratch)."""
    if path is None:
        raise ValueError("model=from_checkpoint needs a checkpoint: init_weights=<ckpt> (its weights too) or "
                         "model.path=<ckpt> (its architecture alone)")
    path = resolve_checkpoint(path)
    return _build(_read(path)["cassi"]["model"], path)


def training_time(ckpt: dict) -> dict:
    """{"cpu_min", "wall_min"} that trained ``ckpt`` (a loaded checkpoint): its ElapsedTime callback's state, or a
    weights-only checkpoint's "elapsed" (:func:`export_weights`); {} when it records neither."""
    state = next((s for k, s in ckpt.get("callbacks", {}).items() if k.startswith("ElapsedTime")), None)
    if state is None:
        return dict(ckpt.get("cassi", {}).get("elapsed", {}))
    return {k: float(state[k]) for k in ("cpu_min", "wall_min") if k in state}


def export_weights(path, out, half: bool = False, measured: list[dict] | None = None,
                   config: dict | None = None) -> Path:
    """Write the weights-only checkpoint of a training checkpoint (``path`` or ``pretrained/<name>``) to
    ``out``, atomically: {"cassi": its model/geometry/wavelengths + "step" (optimizer steps trained) and
    "monitor" (the best validation value, when the checkpoint records one) and "elapsed" (the ElapsedTime
    callback's {"cpu_min", "wall_min"}, when recorded), "state_dict": the model's weights
    (the EMA weights when EMA was on), in float16 with ``half``}. It loads with :func:`load_model` and
    starts a new training run with ``init_weights=`` (no optimizer or schedule state: a few MB). ``measured``: the
    model card's rows across masks, kept in its camera record (:func:`cassi.models.camera.check_camera` names them);
    ``config``: model settings over the trained ones (e.g. ``{"project": True}``, chosen by the card)."""
    from cassi.io import write_text_atomic

    ckpt = _read(resolve_checkpoint(path))
    info = dict(ckpt["cassi"])
    info.setdefault("step", ckpt.get("global_step"))
    best = next((s for k, s in ckpt.get("callbacks", {}).items() if k.startswith("ModelCheckpoint")
                 and isinstance(s, dict) and s.get("monitor") and s.get("best_model_score") is not None), None)
    if best is not None:
        info["monitor"] = {"name": best["monitor"], "best": float(best["best_model_score"])}
    elapsed = training_time(ckpt)
    if elapsed:
        info["elapsed"] = elapsed
    if config:
        info["model"] = {**info["model"], **config}
    if measured is not None:
        info["camera"] = {**(info.get("camera") or {}), "measured": list(measured)}
    state = {k: (v.half() if half and v.is_floating_point() else v) for k, v in ckpt["state_dict"].items()
             if k.startswith(PREFIX)}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"cassi": info, "state_dict": state}, buf)
    write_text_atomic(out, buf.getvalue())
    return out


def load_prior(path, stage: int = -1, map_location="cpu"):
    """A trained model's stage prior as a denoiser for plug-and-play: ``D(x)`` or ``D(x, σ)``
    (B, C, H, W) -> (B, C, H, W). For priors with a noise channel (DAUHST) σ fills it (default: the
    channel the model estimated on average, 0 if unknown)."""
    model = load_model(path, map_location)
    prior = model.prior(stage % model.stages)
    noisy = getattr(model, "estimator", None) is not None

    @torch.no_grad()
    def denoise(x: torch.Tensor, sigma: float | None = None) -> torch.Tensor:
        if noisy:
            level = torch.full_like(x[:, :1], 0.0 if sigma is None else float(sigma))
            x = torch.cat([x, level], dim=1)
        return prior(x).to(x.dtype)

    denoise.model = model
    return denoise
