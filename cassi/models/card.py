"""Model cards of shipped models: a fixed reference input (the tests reproduce each card's figure on it)
and the card's markdown (scores beside A⁺y and GAP-TV, training cost, geometry, notes)."""
from __future__ import annotations

import torch
from torch import nn

from cassi.data.synthetic import synthetic_cube
from cassi.geometry import Geometry
from cassi.metrics import all_metrics
from cassi.models.camera import other_masks_expected
from cassi.models.checkpoint import training_time
from cassi.physics.masks import bernoulli_mask
from cassi.physics.operator import CASSI

__all__ = ["reference_input", "reference_output", "reference_psnr", "card_markdown", "masks_section",
           "training_record", "training_text"]

_TOTALS = ("steps", "cpu_min", "wall_min")


def training_record(ckpt: dict) -> dict:
    """The training the weights of ``ckpt`` (a loaded checkpoint: a training one, or the weights-only file of
    ``export_weights``) hold, over every piece of its ``init_weights=`` chain: {"pieces", "steps", "cpu_min",
    "wall_min", "partial", "complete", "last": this checkpoint's own piece {"steps", "cpu_min", "wall_min"}}.

    A piece's steps and CPU time come from the checkpoint (its optimizer steps and ``ElapsedTime`` state, or
    the weights-only "step" and "elapsed"); what the weights it started from hold, from its "cassi" entry's
    "trained_before" ({"pieces", "steps", "cpu_min", "wall_min"}: zero for a run from scratch, written by
    ``cassi.lightning.TrainingModule``). "partial" names the figures that are lower bounds because some piece
    does not record them (a checkpoint written before this record, a run without ``ElapsedTime``): they count
    what is recorded; "complete" is True when there is none. A figure nothing records is None."""
    info = ckpt.get("cassi") or {}
    step = ckpt.get("global_step", info.get("step"))
    last = {"steps": None if step is None else int(step), **training_time(ckpt)}
    last = {k: last.get(k) for k in _TOTALS}
    before = info.get("trained_before")
    recorded = isinstance(before, dict)
    before = before if recorded else {}
    total, partial = {"pieces": int(before.get("pieces") or 0) + 1}, set(before.get("partial") or ())
    if not recorded:
        partial.add("pieces")
    for k in _TOTALS:
        known = [v for v in (before.get(k), last[k]) if v is not None]
        total[k] = sum(known) if known else None
        if last[k] is None or before.get(k) is None and (not recorded or total["pieces"] > 1):
            partial.add(k)
    partial = sorted(partial)
    return {**total, "partial": partial, "complete": not partial, "last": last}


def _cost(record: dict, partial=()) -> str:
    """"N optimizer steps, H CPU-hours (W h wall)" of a training record or piece ("at least" before a figure
    in ``partial``; "not recorded" for a missing one)."""
    def fig(key: str, text) -> str:
        return f"at least {text}" if key in partial else str(text)

    steps = ("optimizer steps not recorded" if record.get("steps") is None
             else f"{fig('steps', record['steps'])} optimizer steps")
    if record.get("cpu_min") is None:
        return f"{steps}, CPU time not recorded in the checkpoint"
    wall = record.get("wall_min")
    return (f"{steps}, {fig('cpu_min', format(record['cpu_min'] / 60, '.2f'))} CPU-hours"
            + (f" ({fig('wall_min', format(wall / 60, '.2f'))} h wall)" if wall is not None else ""))


def training_text(record: dict) -> str:
    """The card's training line, from :func:`training_record`: the total training the weights hold (every
    ``init_weights=`` piece), then the last piece's."""
    last = _cost(record["last"])
    if record["pieces"] == 1 and "pieces" not in record["partial"]:
        return f"{last}: all of it (one piece, from scratch)"
    if "pieces" in record["partial"] and record["pieces"] == 1:  # a checkpoint written before the record
        return (f"this checkpoint's piece {last}; whether it started from trained weights (`init_weights=`), and "
                f"their training, is not recorded in the checkpoint")
    note = "" if record["complete"] else " (some pieces' figures are not recorded)"
    pieces = f"{'at least ' if 'pieces' in record['partial'] else ''}{record['pieces']} pieces"
    return (f"in all {pieces} (an `init_weights=` chain), {_cost(record, record['partial'])}"
            f"{note}; the last piece {last}")


def reference_input(model: nn.Module, size: tuple[int, int] = (64, 96), seed: int = 0):
    """(x (1, C, H, W), op): the seeded synthetic scene ``synthetic_cube(H, W, C, seed)`` measured through a
    seeded Bernoulli(0.5) mask with the model's dispersion (offsets, axis) — the same on every machine."""
    geo = getattr(model, "geometry", None) or {}
    x = synthetic_cube(*size, bands=model.bands, seed=seed)[None]
    mask = bernoulli_mask(*size, p=0.5, seed=seed)
    axis = geo.get("axis") or "w"
    geometry = Geometry.from_record(geo) if geo.get("offsets") else Geometry.of(model.bands, 2, axis=axis)
    return x, CASSI(mask, bands=model.bands, backend="loop", geometry=geometry)


@torch.no_grad()
def reference_output(model: nn.Module) -> torch.Tensor:
    """The model's reconstruction (1, C, H, W) of :func:`reference_input` (float32, CPU, eval mode); its synthetic
    mask is a fingerprint's, not a camera's: no warning."""
    x, op = reference_input(model)
    with other_masks_expected():
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


MASKS_HEADING = ("## Across masks (test scenes, the camera's noise, GAP-TV as `solver=gap_tv`; a model warns on a mask "
                 "it was not trained for, naming the gain measured here)")


def masks_table(measured: list[dict]) -> list[str]:
    """The card's table across masks: per mask (``measured`` rows: label, psnr, gap_tv, gain), the model's and
    GAP-TV's mean PSNR on the test scenes and the gain."""
    lines = ["| mask | model PSNR | GAP-TV PSNR | gain (dB) |", "|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['psnr']:.2f} | {r['gap_tv']:.2f} | {r['gain']:+.2f} |" for r in measured]
    return lines


def masks_section(card: str, measured: list[dict]) -> str:
    """``card`` (a card of :func:`card_markdown`) with its table across masks set to ``measured``: the section
    replaced where it has one, else put after the test table; the rest of the card unchanged. ValueError when
    ``card`` has no test table."""
    lines = card.splitlines()

    def end_of_table(i: int) -> int:  # the line after the section starting at heading i (its table, blank lines)
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("|")):
            i += 1
        return i

    old = next((i for i, line in enumerate(lines) if line.startswith("## Across masks (")), None)
    if old is not None:
        del lines[old:end_of_table(old)]
    test = next((i for i, line in enumerate(lines) if line.startswith("## Test (scenes never seen")), None)
    if test is None:
        raise ValueError("not a model card of cassi.models.card.card_markdown: no test table")
    at = end_of_table(test)
    lines[at:at] = [MASKS_HEADING, "", *masks_table(measured), ""]
    return "\n".join(lines) + ("\n" if card.endswith("\n") else "")


def card_markdown(name: str, model: nn.Module, checkpoint: dict, results: dict, notes: str = "",
                  half: bool = False, load: str | None = None) -> str:
    """The model card: ``results`` {"validation"|"test": {method: per-scene rows (name, psnr, ssim, sam,
    time)}}, ``checkpoint`` the training checkpoint (steps, CPU time of the ElapsedTime callback) or a
    weights-only one (its "cassi" entry's "step" and "elapsed"); its training line states the total training
    the weights hold over their ``init_weights=`` chain (:func:`training_record`) and the last piece's. ``load``:
    what loads it (default ``pretrained/<name>``, a shipped model; else its checkpoint's path)."""
    load = load or f"pretrained/{name}"
    n = sum(p.numel() for p in model.parameters())
    geo = model.geometry or {}
    offs = geo.get("offsets") or []
    steps = {round(b - a, 6) for a, b in zip(offs, offs[1:])}
    dispersion = f"step {steps.pop():g} px per band" if len(steps) == 1 else f"offsets {offs}"
    wl = model.wavelengths or []
    lines = [
        f"# `{name}` — {type(model).__name__}, {n / 1e6:.2f} M parameters",
        "",
        f"Load: `cassi.models.load_model('{load}')`, or `ckpt={load}` in "
        f"`scripts/reconstruct.py` / `scripts/evaluate.py`.",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{model.config.get('_target_')}` {', '.join(f'{k}={v}' for k, v in model.config.items() if k != '_target_')} |",
        f"| geometry it fits | {model.bands} bands, {dispersion}, dispersion along `{geo.get('axis', 'w')}`"
        f" (any other geometry is refused before any work) |",
        f"| wavelengths (nm) | {wl[0]:g} … {wl[-1]:g} ({len(wl)} bands) |" if wl else "| wavelengths | not stored |",
        f"| training | {training_text(training_record(checkpoint))} |",
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
    measured = (getattr(model, "camera", None) or {}).get("measured")
    if measured:
        lines += [MASKS_HEADING, "", *masks_table(measured), ""]
    if notes:
        lines += [notes.strip(), ""]
    return "\n".join(lines)
