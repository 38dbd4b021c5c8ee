"""The model card job (conf/model_card.yaml, ``scripts/model_card.py``): a checkpoint scored beside A⁺y and GAP-TV
on the validation and the test scenes, the automatic choices (stages projected onto y, flip ensemble, float16
weights), the table across masks, and shipping to ``cassi/pretrained/<name>.{ckpt,md,reference.pt}``. The card's
markdown and its reference input are :mod:`cassi.models.card`'s."""
from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

import cassi.threads
from cassi.io import write_text_atomic
from cassi.lightning import seed_everything
from cassi.lightning.callbacks import ResultsTable
from cassi.lightning.module import ReconstructionModule
from cassi.models import export_weights, load_model, resolve_checkpoint
from cassi.models.camera import other_masks_expected
from cassi.models.card import card_markdown, masks_section, reference_input, reference_output
from cassi.models.checkpoint import PRETRAINED_DIR
from cassi.physics.camera import Camera
from cassi.workflows import CONF

__all__ = ["CardError", "card_job", "model_card", "measure_shipped", "score", "mean_psnr", "across_masks", "choose",
           "choose_half", "ship"]


class CardError(ValueError):
    """A model card job refused before (or instead of) its work; ``scripts/model_card.py`` (and ``python -m
    cassi.workflows.card``) exits with ``error: <message>``."""


def score(cfg: DictConfig, reconstructor, operator, split: str) -> list[dict]:
    """Per-scene rows (name, psnr, ssim, sam, time) of ``reconstructor`` on ``cfg[split]`` (a datamodule
    config), through ``cfg.trainer``'s test loop."""
    with tempfile.TemporaryDirectory() as tmp:
        table = ResultsTable(Path(tmp) / "t")
        trainer = instantiate(cfg.trainer, callbacks=[table])
        trainer.test(ReconstructionModule(reconstructor, operator), datamodule=instantiate(cfg[split]))
        return table.rows


def mean_psnr(rows: list[dict]) -> float:
    """Mean of the rows' "psnr" (dB)."""
    return sum(r["psnr"] for r in rows) / len(rows)


def across_masks(cfg: DictConfig, model, gap_tv, operator) -> list[dict]:
    """The card's rows across masks: the model and GAP-TV on the test scenes through each of ``cfg.across_masks``
    (label: camera keys over the model's camera), mean PSNR and gain, with the mask's record (what
    :func:`cassi.models.camera.check_camera` compares a user's mask with)."""
    rows = []
    for label, keys in (cfg.across_masks or {}).items():
        keys = OmegaConf.to_container(keys, resolve=True)
        if "mask" in keys:  # another file: the model's camera.key names a variable of its own mask's file
            keys.setdefault("key", None)
        spec = {**OmegaConf.to_container(cfg.camera, resolve=True), **keys}
        c = cfg.copy()
        with open_dict(c):
            c.camera = spec
        if spec.get("mask") is not None and not Path(spec["mask"]).is_file():
            print(f"across masks: {label}: skipped, {spec['mask']} does not exist")
            continue
        if spec.get("masks") in ("fixed", "crops"):  # test crops are windows of the file's mask
            spec["masks"] = "crops"
        record = Camera(**spec).sources()[0].describe()
        with other_masks_expected():  # each scene's window of this mask would warn
            ours, theirs = (score(c, rec, operator, "test") for rec in (model, gap_tv))
        psnr, base = mean_psnr(ours), mean_psnr(theirs)
        rows.append({"label": str(label), "masks": record, "psnr": psnr, "gap_tv": base, "gain": psnr - base})
        print(f"across masks: {label}: {psnr:.2f} dB against GAP-TV's {base:.2f} ({psnr - base:+.2f})")
    return rows


def choose(cfg: DictConfig, model, operator, results: dict, config: dict, key: str, value, what: str, force: bool,
           least: float) -> None:
    """Score ``model`` with ``key = value`` on the validation scenes; keep it where ``force`` or where it raises
    the validation PSNR by more than ``least`` dB: then it goes into ``config`` (stored with the shipped weights)
    and ``results`` (both splits scored again)."""
    before = getattr(model, key)
    setattr(model, key, value)
    rows = score(cfg, model, operator, "validation")
    gain = mean_psnr(rows) - mean_psnr(results["validation"][cfg.name])
    keep = force or gain > least
    print(f"{what}: validation PSNR {gain:+.3f} dB -> {'kept' if keep else f'as trained ({before})'}")
    setattr(model, key, value if keep else before)
    if keep:
        config[key] = value
        model.config = {**model.config, **config}
        results["validation"][cfg.name] = rows
        results["test"][cfg.name] = score(cfg, model, operator, "test")


def choose_half(cfg: DictConfig, operator, results: dict, config: dict) -> bool:
    """``cfg.half``, or for ``auto``: float16 storage where every validation scene's PSNR stays within 0.05 dB of
    float32's (``results``)."""
    if cfg.half != "auto":
        return cfg.half
    with tempfile.TemporaryDirectory() as tmp:
        fp16 = load_model(export_weights(cfg.ckpt, Path(tmp) / "half.ckpt", half=True, config=config),
                          operator=operator)
    rows = score(cfg, fp16, operator, "validation")
    gap = max(abs(a["psnr"] - b["psnr"]) for a, b in zip(rows, results["validation"][cfg.name]))
    half = gap <= 0.05
    print(f"float16 weights: largest validation PSNR change {gap:.4f} dB -> {'float16' if half else 'float32'}")
    return half


def ship(cfg: DictConfig, out: Path, half: bool, measured: list[dict] | None, config: dict) -> nn.Module:
    """Writes ``out/<name>.ckpt`` (weights-only, with ``measured`` and ``config`` in its record) and
    ``out/<name>.reference.pt`` ({"x", "mask", "out"} of :func:`cassi.models.card.reference_input`); returns the
    shipped model, loaded from that file."""
    out.mkdir(parents=True, exist_ok=True)
    weights = export_weights(cfg.ckpt, out / f"{cfg.name}.ckpt", half=half, measured=measured, config=config)
    shipped = load_model(weights)
    x, op = reference_input(shipped)
    buf = io.BytesIO()
    torch.save({"x": x, "mask": op.mask, "out": reference_output(shipped)}, buf)
    write_text_atomic(out / f"{cfg.name}.reference.pt", buf.getvalue())
    return shipped


def _check(cfg: DictConfig) -> None:
    if cfg.measure not in ("all", "across_masks"):
        raise CardError(f"measure must be all or across_masks, got {cfg.measure!r}")
    for key in ("project", "ensemble"):
        if str(cfg[key]) not in ("auto", "True", "False"):
            raise CardError(f"{key} must be true, false or auto, got {cfg[key]!r}")


def measure_shipped(cfg: DictConfig, operator) -> None:
    """``measure=across_masks``: the table across masks of the shipped model ``cfg.out_dir/<name>.ckpt`` (which
    ``cfg.ckpt`` must be), set in its card and its weights' record; the rest of both kept."""
    out = Path(cfg.out_dir)
    card, weights = out / f"{cfg.name}.md", out / f"{cfg.name}.ckpt"
    if not (card.is_file() and weights.is_file() and resolve_checkpoint(cfg.ckpt).resolve() == weights.resolve()):
        raise CardError(f"measure=across_masks updates a shipped model in place: ckpt must be {weights} "
                        f"(pretrained/{cfg.name}), with its card {card}")
    model = load_model(cfg.ckpt, operator=operator)
    measured = across_masks(cfg, model, instantiate(cfg.masks_baseline), operator)
    if not measured:
        raise CardError("across_masks measured no mask (none given, or none of their files exists)")
    export_weights(weights, weights, measured=measured)  # the same weights (and dtype), the rows in the record
    write_text_atomic(card, masks_section(card.read_text(), measured))
    print(f"wrote the table across masks into {card} and {weights}")


def model_card(cfg: DictConfig) -> None:
    """The model card job of conf/model_card.yaml: ``cfg.ckpt`` scored with A⁺y and GAP-TV on both splits, the
    automatic choices made (``project``, ``ensemble``, ``half``), the table across masks, the card written (and
    with ``ship=true`` the weights and reference output); ``measure=across_masks``: :func:`measure_shipped`.
    CardError for a config it refuses (before any work), or a table across masks with no mask measured."""
    cassi.threads.configure(cfg.threads)
    seed_everything(cfg.seed)
    operator = instantiate(cfg.operator)
    out = Path(cfg.out_dir)
    _check(cfg)
    if cfg.measure == "across_masks":  # a shipped model, in place
        return measure_shipped(cfg, operator)
    model = load_model(cfg.ckpt, operator=operator)
    methods = {"A⁺y": instantiate(cfg.baselines.pinv), "GAP-TV": instantiate(cfg.baselines.gap_tv), cfg.name: model}
    results = {split: {label: score(cfg, rec, operator, split) for label, rec in methods.items()}
               for split in ("validation", "test")}
    config = {}  # model settings chosen here, stored with the shipped weights
    if getattr(model, "project", True) is False and cfg.project in ("auto", True):  # onto {A x = y} at inference
        choose(cfg, model, operator, results, config, "project", True, "stages projected onto y at inference",
               cfg.project is True, 0.0)
    if getattr(model, "flip_ensemble", True) is not True and cfg.ensemble in ("auto", True):
        choose(cfg, model, operator, results, config, "flip_ensemble", True, "flip ensemble on every stage",
               cfg.ensemble is True, 0.05)  # it doubles the U-Nets' time: kept for more than 0.05 dB
    half = choose_half(cfg, operator, results, config)
    measured = across_masks(cfg, model, instantiate(cfg.masks_baseline), operator) or None
    if measured:
        model.camera = {**(model.camera or {}), "measured": measured}
    if cfg.ship:
        model = ship(cfg, out, bool(half), measured, config)
    trained = torch.load(resolve_checkpoint(cfg.ckpt), map_location="cpu", weights_only=True)
    notes = cfg.notes or ""
    if "\n" not in notes and Path(notes).suffix == ".md" and Path(notes).is_file():  # notes from a file
        notes = Path(notes).read_text()
    shipped_here = cfg.ship and out.resolve() == PRETRAINED_DIR  # else the card names the file it describes
    load = None if shipped_here else str(out / f"{cfg.name}.ckpt") if cfg.ship else str(cfg.ckpt)
    text = card_markdown(cfg.name, model, trained, results, notes=notes, half=bool(half), load=load)
    path = out / f"{cfg.name}.md" if cfg.ship else Path(cfg.paths.output_dir) / f"{cfg.name}.md"
    write_text_atomic(path, text)
    print(text)
    print(f"wrote {path}" + (f" and {out / cfg.name}.ckpt" if cfg.ship else ""))


def card_job(cfg: DictConfig) -> None:
    """:func:`model_card` as a command runs it: a refused job exits with ``error: <message>`` (status 1)."""
    try:
        model_card(cfg)
    except CardError as e:
        sys.exit(f"error: {e}")


@hydra.main(version_base="1.3", config_path=CONF, config_name="model_card")
def main(cfg: DictConfig) -> None:
    """``python -m cassi.workflows.card <overrides>``: the job of ``scripts/model_card.py`` as a module (a fit's card
    runs so)."""
    card_job(cfg)


if __name__ == "__main__":
    main()
