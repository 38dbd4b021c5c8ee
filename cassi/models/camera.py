"""What camera a model was trained for, and a warning when it meets another.

A training checkpoint records ``"camera"``: {"masks": the training masks' description, "noise": the noise model
or None} (from the data's :class:`cassi.data.simulate.Simulator`). Mask descriptions:

- {"kind": "fixed", "sha256", "shape", "fill", "binary"}: one mask (its fingerprint and statistics)
- {"kind": "crops", "sha256", "shape", "fill", "binary", "segments"}: random windows of one larger mask (the
  hashes of its row segments recognise a window: :func:`cassi.data.masks.segment_hashes`)
- {"kind": "bernoulli", "p"}: a fresh Bernoulli(p) mask per sample
- {"kind": "blocks", "p", "block"}: a fresh mask of binary blocks of ``block`` px per sample

:func:`check_camera` compares an operator's mask with that record and logs one warning line (once per model and
mask) when the model reconstructs through a mask it was not trained for. Imports torch only.
"""
from __future__ import annotations

import logging

import torch

from cassi.data.masks import mask_stats, row_segment_hashes

__all__ = ["mask_stats", "describe_camera", "check_camera"]

log = logging.getLogger("cassi.models")


def describe_camera(simulator) -> dict | None:
    """The camera record of a Simulator (its training masks and noise), or None when it is not one."""
    masks = getattr(simulator, "masks", None)
    if masks is None:
        return None
    describe = getattr(masks, "describe", None)
    info = describe() if callable(describe) else {"kind": type(masks).__name__}
    noise = getattr(simulator, "noise", None)
    return {"masks": info, "noise": None if noise is None else repr(noise)}


def _text(info: dict) -> str:
    kind = info.get("kind")
    if kind == "bernoulli":
        return f"Bernoulli({info.get('p')}) masks"
    if kind == "blocks":
        return f"Bernoulli({info.get('p')}) masks of {info.get('block')}-px blocks"
    if kind in ("fixed", "crops"):
        what = "the mask" if kind == "fixed" else "random crops of the mask"
        shape = "×".join(str(s) for s in info.get("shape", []))
        return f"{what} {str(info.get('sha256', '?'))[:12]} ({shape}, fill {info.get('fill')})"
    return f"masks from {kind}"


def _fits(info: dict, mask: torch.Tensor, stats: dict) -> bool:
    kind = info.get("kind")
    if kind == "fixed":
        return stats["sha256"] == info.get("sha256")
    if kind == "crops":  # the whole mask, or a window of it (one of its first row's segments is the mask's)
        if stats["sha256"] == info.get("sha256"):
            return True
        known = set(info.get("segments") or ())
        row = mask.reshape(-1, mask.shape[-2], mask.shape[-1])[0, 0]
        return bool(known) and any(h in known for h in row_segment_hashes(row))
    if kind in ("bernoulli", "blocks"):
        b = int(info.get("block", 1))
        m = mask.reshape(-1, *mask.shape[-2:])[0]
        h, w = (m.shape[0] // b) * b, (m.shape[1] // b) * b  # blocks: constant on the b×b grid
        blocky = b == 1 or bool((m[:h, :w] == m[:h:b, :w:b].repeat_interleave(b, 0).repeat_interleave(b, 1)).all())
        return stats["binary"] and blocky and abs(stats["fill"] - float(info.get("p", -1))) < 0.05
    return True  # an unknown source: nothing to compare


def check_camera(model, op) -> bool:
    """Log one warning line when ``op``'s mask is not one ``model`` (with a ``camera`` record) was trained for;
    once per model and mask. True when it fits or nothing is recorded."""
    camera = getattr(model, "camera", None)
    if not camera or not isinstance(camera.get("masks"), dict):
        return True
    mask = op.mask[0] if op.mask.shape[0] == 1 else op.mask
    stats = mask_stats(mask[0] if mask.ndim == 3 and mask.shape[0] == 1 else mask)
    seen = model.__dict__.setdefault("_cameras_checked", {})
    if stats["sha256"] in seen:
        return seen[stats["sha256"]]
    ok = _fits(camera["masks"], mask, stats)
    seen[stats["sha256"]] = ok
    if not ok:
        where = getattr(model, "source", None) or type(model).__name__
        shape = "×".join(str(s) for s in stats["shape"])
        log.warning("%s was trained for %s; this mask %s (%s, fill %s) is another camera's: its quality there is "
                    "not measured and may fall below GAP-TV's (fit a model for it)",
                    where, _text(camera["masks"]), stats["sha256"][:12], shape, stats["fill"])
    return ok
