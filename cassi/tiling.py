"""Reconstruct large frames in overlapping spatial tiles, blended without seams, with any reconstructor.

A reconstructor is a callable ``(op, y, gt=None) -> result`` with ``result.x`` (B, C, H, W) (or the tensor
itself): every ``cassi.solvers`` solver and every trained model wrapper. ``Tiled`` runs it on tiles of at most
``size`` × ``size`` pixels, one after another, so its memory follows the tile, not the frame; only the output
cube and one (H, W) weight map are frame-sized.

How tiles are cut, and why the result is right. Let the dispersion run along columns (axis "w"; "h" is the
same with rows and columns swapped) and Δ = ceil(max offset). The operator maps x column j of band c to y
column j + d_c, so

* along the non-dispersed axis rows never mix: the rows [r0, r1) of y are exactly A applied to rows [r0, r1)
  of x; only the prior (e.g. TV) couples neighbouring rows;
* along the dispersed axis, a tile of x columns [a, b) is given the y columns [a, b + Δ) and its own crop of
  the mask. A y column j in [a + Δ, b) receives light from x columns j − d_c ∈ [j − Δ, j] only, all inside
  the tile: the tile's model of it is exact. The first and last Δ y columns also hold light from x outside
  the tile, which the tile's model cannot explain, and the estimate is wrong near both edges. An x column at
  distance ≥ Δ from both inner edges touches only exactly modelled y columns.

So each tile discards, at every inner edge, Δ pixels along the dispersed axis (0 along the other) plus the
first quarter of the overlap, where the prior still feels the edge; across the next half of the overlap its
weight ramps linearly from 0 to 1. Neighbouring tiles overlap by at least ``overlap`` (+ 2Δ along the
dispersed axis), so wherever one tile's weight is below 1 its neighbour's is above 0, and the result
x = Σ_t w_t x_t / Σ_t w_t is a continuous blend (no seam) of estimates that are each correct away from their
edges. Edges of the frame are true edges of the whole problem and keep weight 1. Tiles along an axis all have
the same size (≤ ``size``), so an operator backend tuned for one tile shape serves all of them.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from cassi.solvers.base import Result, check_int

__all__ = ["Tiled", "tile_spans", "tile_weights"]


def tile_spans(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) of n equal tiles of at most ``size`` covering [0, length), neighbours sharing ≥ ``overlap``.

    One tile when length ≤ size; else n = ceil((length − overlap)/(size − overlap)) tiles of
    t = ceil((length + (n−1)·overlap)/n), spread evenly (starts floor(i·(length − t)/(n − 1)))."""
    if length <= size:
        return [(0, length)]
    if size <= overlap:
        raise ValueError(f"tile size {size} must exceed the overlap {overlap} along an axis of {length} px")
    n = math.ceil((length - overlap) / (size - overlap))
    t = math.ceil((length + (n - 1) * overlap) / n)
    starts = [i * (length - t) // (n - 1) for i in range(n)]
    return [(s, s + t) for s in starts]


def tile_weights(length: int, spans: list[tuple[int, int]], margin: int, overlap: int) -> list[torch.Tensor]:
    """Per span, (stop − start,) float64 blending weights: at an inner edge 0 for ``margin`` + overlap/4 px,
    then a linear ramp to 1 over overlap/2 px (margin: Δ along the dispersed axis, 0 along the other)."""
    out = []
    for a, b in spans:
        p = torch.arange(a, b, dtype=torch.float64) + 0.5
        d = torch.full_like(p, math.inf)
        if a > 0:
            d = torch.minimum(d, p - a)
        if b < length:
            d = torch.minimum(d, b - p)
        ramp = max(overlap / 2, 1.0)
        out.append(((d - margin - overlap / 4) / ramp).clamp(0, 1))
    return out


class Tiled:
    """Wrap ``reconstructor`` to run on overlapping tiles of at most ``size`` px when a frame is larger.

    Args:
        reconstructor: callable (op, y, gt=None) -> result with ``.x`` (B, C, H, W), or the tensor.
        size: the largest tile side in pixels of x; frames with both sides ≤ size are passed through whole.
        overlap: pixels shared by neighbouring tiles beyond the 2Δ the dispersed axis needs (see the module
            docstring).
    Called as ``Tiled(...)(op, y, gt=None) -> Result`` (x (B, C, H, W); iterations: the most of any tile).
    """

    def __init__(self, reconstructor: Callable, size: int = 512, overlap: int = 64):
        self.reconstructor = reconstructor
        self.size = check_int("size", size)
        self.overlap = check_int("overlap", overlap, 0)
        if self.size <= self.overlap:
            raise ValueError(f"tile size {size} must exceed the overlap {overlap}")

    def __repr__(self) -> str:
        return f"Tiled({self.reconstructor!r}, size={self.size}, overlap={self.overlap})"

    def plan(self, op) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[torch.Tensor], list[torch.Tensor]]:
        """Row spans, column spans and their weights for the operator's (H, W)."""
        H, W = op.x_shape[-2:]
        margin_h, margin_w = (op.delta, 0) if op.axis == "h" else (0, op.delta)
        rows = tile_spans(H, self.size, self.overlap + 2 * margin_h)
        cols = tile_spans(W, self.size, self.overlap + 2 * margin_w)
        return rows, cols, tile_weights(H, rows, margin_h, self.overlap), tile_weights(W, cols, margin_w, self.overlap)

    def __call__(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> Result:
        rows, cols, w_rows, w_cols = self.plan(op)
        if len(rows) == 1 and len(cols) == 1:
            result = self.reconstructor(op, y, gt=gt)
            return result if hasattr(result, "x") else Result(result)
        dh, dw = (op.delta, 0) if op.axis == "h" else (0, op.delta)
        out = y.new_zeros((y.shape[0], *op.x_shape))
        total = torch.zeros(op.x_shape[-2:], dtype=torch.float64, device=y.device)
        iterations = 0
        for (r0, r1), wr in zip(rows, w_rows):
            for (c0, c1), wc in zip(cols, w_cols):
                mask = op.mask[..., r0:r1, c0:c1]
                if not mask.any():  # nothing of this tile reaches the detector: its estimate is 0
                    x = None
                else:
                    sub = type(op)(mask, backend=op.backend, geometry=op.geometry)
                    yt = y[..., r0:r1 + dh, c0:c1 + dw].contiguous()
                    gtt = None if gt is None else gt[..., r0:r1, c0:c1].contiguous()
                    result = self.reconstructor(sub, yt, gt=gtt)
                    x = getattr(result, "x", result)
                    iterations = max(iterations, int(getattr(result, "iterations", 0) or 0))
                w = (wr[:, None] * wc[None, :]).to(y.device)
                if x is not None:
                    out[..., r0:r1, c0:c1].add_(x * w.to(x.dtype))
                total[r0:r1, c0:c1].add_(w)
                del x
        out.div_(total.to(out.dtype))
        return Result(out, {}, iterations)
