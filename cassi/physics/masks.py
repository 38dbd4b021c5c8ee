"""Coded-aperture masks: random binary masks and crops of a large real mask.

Shapes follow the operator's conventions: one mask is (H, W); a mask per
sample is (B, 1, H, W), which broadcasts over the C bands of (B, C, H, W).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from cassi._checks import check_int, size_pair

__all__ = ["bernoulli_mask", "random_crops", "center_crop", "mask_stats", "segment_hashes", "window_segment_hashes", "SEGMENT"]


def _check_crop(mask: torch.Tensor, h: int, w: int) -> None:
    H, W = mask.shape[-2:]
    if h > H or w > W:
        raise ValueError(f"crop size (h, w) = ({h}, {w}) is larger than the mask's (H, W) = ({H}, {W})")


def bernoulli_mask(
    height: int,
    width: int,
    p: float = 0.5,
    seed: int = 0,
    batch: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Random binary mask: each pixel is 1 with probability ``p``, else 0.

    Returns (H, W) when ``batch`` is None, else (B, 1, H, W) with a different
    mask per sample; the same (height, width, p, seed, batch) always gives the
    same mask (a local generator is used; the global RNG state is untouched).
    Raises ValueError unless 0 < p <= 1.
    """
    check_int("height", height)
    check_int("width", width)
    check_int("seed", seed, minimum=0)
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"p must be a number in (0, 1], got {p!r} ({type(p).__name__})")
    if not 0 < p <= 1:
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    shape = (height, width) if batch is None else (check_int("batch", batch), 1, height, width)
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < p).to(dtype)


def random_crops(
    mask: torch.Tensor,
    size,
    batch: int,
    generator: torch.Generator | None = None,
    return_offsets: bool = False,
):
    """``batch`` random (h, w) windows of a large (H, W) mask, as (B, 1, h, w).

    This is how real-data training uses one large calibrated mask (e.g. the
    660 x 660 KAIST mask): each sample sees a different window. Offsets are
    uniform over all positions that keep the window inside the mask, drawn
    with ``generator`` (a CPU generator; the global RNG if None).

    Args:
        mask: (H, W) tensor, any dtype and device (the crops keep both).
        size: int s for s x s, or a pair (h, w), with h <= H and w <= W.
        batch: number of crops B >= 1.
        return_offsets: also return the (B, 2) int64 (top, left) corners, so
            that crop b is ``mask[top:top + h, left:left + w]``.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of shape (H, W), got {type(mask).__name__}")
    if mask.ndim != 2:
        raise ValueError(f"mask must have shape (H, W), got shape {tuple(mask.shape)}")
    h, w = size_pair(size)
    check_int("batch", batch)
    _check_crop(mask, h, w)
    H, W = mask.shape
    top = torch.randint(H - h + 1, (batch,), generator=generator)
    left = torch.randint(W - w + 1, (batch,), generator=generator)
    rows = (top[:, None] + torch.arange(h)).to(mask.device)  # (B, h)
    cols = (left[:, None] + torch.arange(w)).to(mask.device)  # (B, w)
    crops = mask[rows[:, :, None], cols[:, None, :]].unsqueeze(1)
    return (crops, torch.stack([top, left], 1)) if return_offsets else crops


def center_crop(mask: torch.Tensor, size) -> torch.Tensor:
    """The central (h, w) window of the last two dims of ``mask`` (..., H, W).

    The top-left corner is ((H - h) // 2, (W - w) // 2). Returns a view.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of shape (..., H, W), got {type(mask).__name__}")
    if mask.ndim < 2:
        raise ValueError(f"mask must have shape (..., H, W), got shape {tuple(mask.shape)}")
    h, w = size_pair(size)
    _check_crop(mask, h, w)
    top, left = (mask.shape[-2] - h) // 2, (mask.shape[-1] - w) // 2
    return mask[..., top:top + h, left:left + w]


def mask_stats(mask: torch.Tensor) -> dict:
    """{"sha256" (of the float32 values, C-order), "shape", "fill" (mean), "binary"} of one mask (.., H, W)."""
    m = torch.as_tensor(mask).detach().to("cpu", torch.float32).contiguous()
    return {"sha256": hashlib.sha256(m.numpy().tobytes()).hexdigest(), "shape": list(m.shape),
            "fill": round(float(m.mean()), 4), "binary": bool(((m == 0) | (m == 1)).all())}


#: length of the row segments that identify windows of a mask (:func:`segment_hashes`)
SEGMENT = 64


def _hash(values) -> int:
    return int.from_bytes(hashlib.sha256(values.tobytes()).digest()[:8], "little", signed=True)


def _names_a_mask(segment) -> bool:
    """Whether a segment is specific enough to name its mask: no constant run of SEGMENT/2 px or longer in it (a dark
    border's, or a sparse mask's empty stretch, could be any mask's)."""
    ends = np.flatnonzero(np.diff(segment) != 0)
    return np.diff(np.concatenate(([-1], ends, [len(segment) - 1]))).max() < SEGMENT // 2


def _rows(mask: torch.Tensor) -> np.ndarray:
    """The mask's rows (the last dim) as one float32 (rows, width) array on the CPU."""
    return torch.as_tensor(mask).detach().to("cpu", torch.float32).reshape(-1, mask.shape[-1]).contiguous().numpy()


def _segments(m, offsets):
    """{hash of m[r, c:c + SEGMENT] for (r, c) in offsets}, those that name no mask left out."""
    return {_hash(seg) for r, c in offsets if _names_a_mask(seg := m[r, c:c + SEGMENT])}


def segment_hashes(mask: torch.Tensor) -> list[int]:
    """Hashes (64-bit) of the mask's row segments of :data:`SEGMENT` pixels, row r's at the columns c ≡ r (mod
    SEGMENT) (the last dim is the row): every window of the mask at least SEGMENT × SEGMENT px contains one of them
    in its first SEGMENT rows (:func:`window_segment_hashes`), so a window, a centre crop of a scene's size among
    them, is recognised without storing the mask (these hashes: about one per SEGMENT pixels)."""
    m = _rows(mask)
    rows, width = m.shape
    return sorted(_segments(m, ((r, c) for r in range(rows) for c in range(r % SEGMENT, width - SEGMENT + 1, SEGMENT))))


def window_segment_hashes(window: torch.Tensor) -> set[int]:
    """Hashes of an (H, W) window's row segments that :func:`segment_hashes` of a mask holding it includes: its first
    SEGMENT rows at the first SEGMENT columns (fewer where it is smaller; none below SEGMENT px wide)."""
    m = _rows(window)
    rows, width = m.shape
    return _segments(m, ((r, c) for r in range(min(SEGMENT, rows)) for c in range(min(SEGMENT, width - SEGMENT + 1))))
