"""What camera a model was trained for: its geometry, refused when an operator's differs, and its masks, with a
warning when it meets another's.

A checkpoint records the dispersion it was trained for as ``"geometry"``: {"offsets", "axis", "bands"}
(:meth:`cassi.geometry.Geometry.record`); :func:`check_geometry` compares it with an operator's geometry.
A training checkpoint records ``"camera"``: {"masks": the training masks' description, "noise": the noise model
or None} (from the data's :class:`cassi.physics.simulate.Simulator`). Mask descriptions:

- {"kind": "fixed", "sha256", "shape", "fill", "binary", "segments"}: one mask (its fingerprint and statistics;
  the segments recognise the centre crop that scenes smaller than it meet)
- {"kind": "crops", "sha256", "shape", "fill", "binary", "segments"}: random windows of one larger mask (the
  hashes of its row segments recognise a window of 64² px or more: :func:`cassi.physics.masks.segment_hashes`)
- {"kind": "bernoulli", "p"}: a fresh Bernoulli(p) mask per sample
- {"kind": "blocks", "p", "block"}: a fresh mask of binary blocks of ``block`` px per sample
  (``p`` a fill factor or a range [lo, hi] of them)
- {"kind": "mixture", "sources": [...], "weights": [...]}: each sample's mask from one of those sources

:func:`check_camera` compares an operator's mask with that record and logs one warning line (once per model and
mask) when the model reconstructs through a mask it was not trained for. Imports torch only.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from cassi.geometry import Geometry
from cassi.physics.masks import mask_stats, window_segment_hashes

__all__ = ["mask_stats", "describe_camera", "check_camera", "check_geometry", "other_masks_expected"]

log = logging.getLogger("cassi.models")
_expected = 0  # > 0 inside other_masks_expected()


@contextmanager
def other_masks_expected():
    """Within it, :func:`check_camera` logs nothing: for tools that score a model across masks on purpose (the model
    card's table across masks), where each scene's window of each mask would otherwise warn."""
    global _expected
    _expected += 1
    try:
        yield
    finally:
        _expected -= 1


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
    if kind == "mixture":
        return "a mixture of " + ", ".join(_text(s) for s in info.get("sources", []))
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
    if kind == "mixture":
        return any(_fits(s, mask, stats) for s in info.get("sources", []))
    if kind in ("fixed", "crops"):  # the whole mask, or a window of it (a segment of its first rows is the mask's)
        if stats["sha256"] == info.get("sha256"):
            return True
        known = set(info.get("segments") or ())
        return bool(known) and not known.isdisjoint(window_segment_hashes(mask.reshape(-1, *mask.shape[-2:])[0]))
    if kind in ("bernoulli", "blocks"):
        b = int(info.get("block", 1))
        m = mask.reshape(-1, *mask.shape[-2:])[0]
        h, w = (m.shape[0] // b) * b, (m.shape[1] // b) * b  # blocks: constant on the b×b grid
        blocky = b == 1 or bool((m[:h, :w] == m[:h:b, :w:b].repeat_interleave(b, 0).repeat_interleave(b, 1)).all())
        p = info.get("p", -1)
        lo, hi = (p, p) if isinstance(p, (int, float)) else p
        return stats["binary"] and blocky and lo - 0.05 < stats["fill"] < hi + 0.05
    return True  # an unknown source: nothing to compare


def check_geometry(model, op) -> None:
    """ValueError in one line when ``op``'s band count is not ``model.bands``, or when its geometry is not the one
    ``model.geometry`` records (a loaded checkpoint's: offsets within 1e-4 px, axis)."""
    source = getattr(model, "source", None)
    where = f"the model from {source}" if source else f"this {type(model).__name__}"
    if op.bands != model.bands:
        raise ValueError(f"{where} reconstructs {model.bands} bands but the operator has {op.bands}; "
                         f"use data with {model.bands} bands (e.g. bands={model.bands}) or another model")
    record = getattr(model, "geometry", None)
    if not record:
        return
    offs, axis = record.get("offsets"), record.get("axis") or "w"
    same = op.geometry.matches(Geometry(offs, axis)) if offs is not None else axis == op.axis
    if not same:
        raise ValueError(f"{where} was trained for dispersion offsets {_short(offs)} along {axis!r}, "
                         f"but the operator has offsets {_short(op.offsets)} along {op.axis!r}; "
                         f"set camera.step/camera.offsets/camera.axis to match or use another model")


def _short(offs) -> str:
    if offs is None:
        return "?"
    return str(list(offs)) if len(offs) <= 4 else f"[{offs[0]:g}, {offs[1]:g}, …, {offs[-1]:g}] ({len(offs)} bands)"


def check_camera(model, op) -> bool:
    """Log one warning line when ``op``'s mask is not one ``model`` (with a ``camera`` record) was trained for;
    once per model and mask, none inside :func:`other_masks_expected`. True when it fits or nothing is recorded."""
    camera = getattr(model, "camera", None)
    if not camera or not isinstance(camera.get("masks"), dict):
        return True
    mask = op.mask[0] if op.mask.shape[0] == 1 else op.mask
    stats = mask_stats(mask[0] if mask.ndim == 3 and mask.shape[0] == 1 else mask)
    seen = model.__dict__.setdefault("_cameras_checked", {})
    if stats["sha256"] in seen:
        return seen[stats["sha256"]]
    ok = _fits(camera["masks"], mask, stats)
    if _expected:  # tried on purpose: neither said nor remembered, so a later use of this mask still warns
        return ok
    seen[stats["sha256"]] = ok
    if not ok:
        where = getattr(model, "source", None) or type(model).__name__
        shape = "×".join(str(s) for s in stats["shape"])
        log.warning("%s was trained for %s; this mask %s (%s, fill %s) is another camera's: %s (fit a model for it: "
                    "scripts/fit_camera.py)", where, _text(camera["masks"]), stats["sha256"][:12], shape,
                    stats["fill"], _effect(camera.get("measured") or [], mask, stats))
    return ok


def _effect(measured: list[dict], mask: torch.Tensor, stats: dict) -> str:
    """What the model card measured on such a mask (its rows across masks), in words."""
    like = [r for r in measured if isinstance(r.get("masks"), dict) and _fits(r["masks"], mask, stats)]
    if like:
        r = like[0]
        return (f"its card measured {r['gain']:+.2f} dB against GAP-TV on {r['label']} "
                f"({r['psnr']:.2f} against {r['gap_tv']:.2f} dB)")
    if measured:
        gains = [r["gain"] for r in measured]
        return (f"its quality there is not measured; on the masks of its card it gains {min(gains):+.2f} to "
                f"{max(gains):+.2f} dB over GAP-TV")
    return "its quality there is not measured and may fall below GAP-TV's"
