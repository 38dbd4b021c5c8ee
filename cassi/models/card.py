"""Model cards of shipped models: a fixed reference input (the tests reproduce each card's figure on it)
and the card's markdown (scores beside A⁺y and GAP-TV, training cost, geometry, notes)."""
from __future__ import annotations

import math

import torch
from torch import nn

from cassi.data.masks import bernoulli_mask
from cassi.data.synthetic import synthetic_cube
from cassi.metrics import all_metrics
from cassi.models.checkpoint import training_time
from cassi.operator import CASSI

__all__ = ["reference_input", "reference_output", "reference_psnr", "card_markdown"]


def reference_input(model: nn.Module, size: tuple[int, int] = (64, 96), seed: int = 0):
    """(x (1, C, H, W), op): the seeded synthetic scene ``synthetic_cube(H, W, C, seed)`` measured through a
    seeded Bernoulli(0.5) mask with the model's dispersion (offsets, axis) — the same on every machine."""
    geo = getattr(model, "geometry", None) or {}
    x = synthetic_cube(*size, bands=model.bands, seed=seed)[None]
    mask = bernoulli_mask(*size, p=0.5, seed=seed)
    offsets = geo.get("offsets")
    op = CASSI(mask, bands=model.bands, offsets=offsets, step=None if offsets else 2, axis=geo.get("axis", "w"),
               backend="loop")
    return x, op


@torch.no_grad()
def reference_output(model: nn.Module) -> torch.Tensor:
    """The model's reconstruction (1, C, H, W) of :func:`reference_input` (float32, CPU, eval mode)."""
    x, op = reference_input(model)
    return model.eval()(op, op(x))


def reference_psnr(model: nn.Module) -> float:
    """PSNR (dB) of :func:`reference_output` against the reference scene."""
    x, _ = reference_input(model)
    return float(all_metrics(reference_output(model), x)["psnr"])


def _table(results: dict[str, list[dict]]) -> list[str]:
    """Rows per scene and the mean: PSNR / SSIM / SAM of every method, then time per scene."""
    methods = list(results)
    scenes = [r["name"] for r in results[methods[0]]]
    head = "| scene | " + " | ".join(f"{m} PSNR / SSIM / SAM" for m in methods) + " |"
    lines = [head, "|" + "---|" * (len(methods) + 1)]
    for i, name in enumerate([*scenes, "**mean**"]):
        cells = []
        for m in methods:
            rows = results[m] if name == "**mean**" else [results[m][i]]
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("psnr", "ssim", "sam")}
            cells.append(f"{mean['psnr']:.2f} / {mean['ssim']:.3f} / {mean['sam']:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    times = {m: sum(r["time"] for r in results[m]) / len(results[m]) for m in methods}
    lines.append("| time per scene (s) | " + " | ".join(f"{times[m]:.3f}" for m in methods) + " |")
    return lines


def card_markdown(name: str, model: nn.Module, checkpoint: dict, results: dict, notes: str = "",
                  half: bool = False) -> str:
    """The model card: ``results`` {"validation"|"test": {method: per-scene rows (name, psnr, ssim, sam,
    time)}}, ``checkpoint`` the training checkpoint (steps, CPU time of the ElapsedTime callback) or a
    weights-only one (its "cassi" entry's "step" and "elapsed")."""
    n = sum(p.numel() for p in model.parameters())
    geo = model.geometry or {}
    offs = geo.get("offsets") or []
    steps = {round(b - a, 6) for a, b in zip(offs, offs[1:])}
    dispersion = f"step {steps.pop():g} px per band" if len(steps) == 1 else f"offsets {offs}"
    elapsed = training_time(checkpoint)
    steps_trained = checkpoint.get("global_step", checkpoint.get("cassi", {}).get("step", "?"))  # or weights-only
    cost = (f"{elapsed['cpu_min'] / 60:.2f} CPU-hours ({elapsed.get('wall_min', math.nan) / 60:.2f} h wall)"
            if "cpu_min" in elapsed else "CPU time not recorded in the checkpoint")
    wl = model.wavelengths or []
    lines = [
        f"# `{name}` — {type(model).__name__}, {n / 1e6:.2f} M parameters",
        "",
        f"Load: `cassi.models.load_model('pretrained/{name}')`, or `ckpt=pretrained/{name}` in "
        f"`scripts/reconstruct.py` / `scripts/evaluate.py`.",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{model.config.get('_target_')}` {', '.join(f'{k}={v}' for k, v in model.config.items() if k != '_target_')} |",
        f"| geometry it fits | {model.bands} bands, {dispersion}, dispersion along `{geo.get('axis', 'w')}`"
        f" (any other geometry is refused before any work) |",
        f"| wavelengths (nm) | {wl[0]:g} … {wl[-1]:g} ({len(wl)} bands) |" if wl else "| wavelengths | not stored |",
        f"| training | {steps_trained} optimizer steps, {cost} |",
        f"| weights | {'float16' if half else 'float32'} "
        f"({'validation PSNR within 0.05 dB of float32' if half else 'as trained'}) |",
        f"| reference | PSNR {reference_psnr(model):.2f} dB on `cassi.models.card.reference_input` "
        f"(64×96 synthetic scene, Bernoulli mask, seed 0; the tests reproduce it within 0.01 dB) |",
        "",
        "## Validation (the scenes its checkpoint was chosen on)",
        "",
        *_table(results["validation"]),
        "",
        "## Test (scenes never seen in training or checkpoint selection)",
        "",
        *_table(results["test"]),
        "",
    ]
    if notes:
        lines += [notes.strip(), ""]
    return "\n".join(lines)
