"""DAUHST (Cai et al., NeurIPS 2022: degradation-aware unfolding half-shuffle transformer), weight-compatible with
the MST toolbox's ``dauhst_2stg`` … ``dauhst_9stg`` (simulation) and its real-data variant.

:class:`DAUHST` works, as the toolbox does, in the dispersed frame of width W' = W+Δ, with every band rolled back
by its offset (so that band c's scene columns come first and its Δ spare columns wrap around after them):

    z₀ = roll₋d(fuse([y·2/C on band c's columns, Phi]))         (α, β) = estimator(fuse(...))  (B, K) each
    x_k = [data_step(z[..., :W], y, α_k), z[..., W:]]           z_k = HST_k([x_k, β_k])        x = z_K[..., :W]

with data_step(z, y, α) = z + Aᵀ((y − A z) ⊘ (Φ + α)) (cassi's fused step: in the dispersed frame the toolbox's
x + At((y − A(x, Phi)) ⊘ (α + Φ_s), Phi) changes only the W columns where band c's Phi is nonzero, which are the
first W columns once rolled back; the Δ wrap-around columns pass unchanged). HST_k is a three-scale U-shaped
transformer whose blocks attend within 8×8 windows at the first scale and, at the deeper scales, with half the
heads within windows and half across windows (pixels at the same place of every window: "shuffle"), each with a
learned additive position bias. The across-window bias is a table over the window grid of one frame size
(``frame``, the toolbox's 256×320: a 256² scene's dispersed frame padded to a multiple of 32); other frames
resize it bilinearly (``resize``: "grid" over the 2-D window grid, "flat" over the table as an image, as the
toolbox's real-data test code does), so any size runs and 256² gives exactly the toolbox's output.

:class:`DAUHSTReal` is the toolbox's real-data variant: no data step and no mask; x = HST_K(…HST_1(fuse(H))), with
H = y shifted back per band (not scaled: y as the toolbox's real code feeds it, i.e. a measurement scaled to its
training range), position tables for 384×384.

Both: any band count, any frame size, dispersion along h (the transposed problem), batches of masks, bf16
autocast, activation checkpointing per stage. :class:`DAUHST` needs integer offsets (it works in the dispersed
frame); :class:`DAUHSTReal` takes any. (B, 1, H, W+Δ) -> (B, C, H, W).
"""
from __future__ import annotations

import re
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi._checks import check_positive_int
from cassi.models.unrolled import _config
from cassi.models.zoo.toolbox import (ToolboxModel, dispersed_last, integer_offsets, register_method, roll_bands,
                                      shift_back, shifted_mask, undo)
from cassi.registry import register

__all__ = ["DAUHST", "DAUHSTReal", "HalfShuffleTransformer", "HSTPrior", "StageEstimator"]

RESIZE = ("grid", "flat")


# ---------------------------------------------------------------------------------------------- helpers
def _reflect_pad(x: torch.Tensor, bottom: int, right: int) -> torch.Tensor:
    """x padded at the bottom/right by mirror reflection; a pad wider than the frame reflects again (the
    toolbox's single reflect when it fits)."""
    while bottom or right:
        b = min(bottom, x.shape[-2] - 1)
        r = min(right, x.shape[-1] - 1)
        if b <= 0 and r <= 0:  # a one-pixel frame has nothing to mirror
            return F.pad(x, (0, right, 0, bottom), mode="replicate")
        x = F.pad(x, (0, max(r, 0), 0, max(b, 0)), mode="reflect")
        bottom, right = bottom - max(b, 0), right - max(r, 0)
    return x


def _rows(t: torch.Tensor, a: int, b: int, dim: int = 1) -> torch.Tensor:
    """t's rows a..b−1 along ``dim``; t itself when that is all of them (no slice to record for autograd)."""
    return t if a == 0 and b >= t.shape[dim] else t.narrow(dim, a, min(b, t.shape[dim]) - a)


def _head(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """The first n entries of t along ``dim``, as a split (its backward is one cat, not a frame of zeros)."""
    return t if n == t.shape[dim] else t.split([n, t.shape[dim] - n], dim=dim)[0]


def _tap_sums(t: torch.Tensor) -> list[torch.Tensor]:
    """Along the last axis (length n), for the taps k = 0, 1, 2 of a 3-wide, stride-2, padding-1 window: the sum
    over its (n−1)//2 + 1 outputs i of t[2i + k − 1] (positions outside [0, n) are the zero padding). Tap 1 sees
    every even position, tap 2 every odd one, tap 0 every odd one but n−1."""
    even, odd = t[..., 0::2].sum(-1), t[..., 1::2].sum(-1)
    return [odd - t[..., -1] if t.shape[-1] % 2 == 0 else odd, even, odd]


def _trunc_normal(t: torch.Tensor, std: float) -> torch.Tensor:
    """Truncated normal at ±2 (absolute), the toolbox's initialisation of linear weights and position tables."""
    return nn.init.trunc_normal_(t, std=std, a=-2.0, b=2.0)


# ---------------------------------------------------------------------------------------------- blocks
#: Bytes of the largest temporary of one strip: without gradients, at one thread, the blocks run in strips of rows
#: so that their temporaries stay in cache and are reused by the allocator (a fresh tensor above glibc's mmap
#: threshold pays page faults that cost more than the arithmetic on it); same values as whole frames. At more
#: threads they run on whole frames (fewer parallel regions: on busy cores, strips lost; measured: docs/zoo/dauhst.md,
#: "Speed on this CPU"). With gradients, whole frames too (the backward of a slice would
#: fill a whole frame of zeros per strip), except the parts recomputed in strips (:class:`_StripsRecomputed`).
STRIP_BYTES = 4 << 20
#: glibc's largest mmap threshold: a fresh tensor above it always comes from new pages (with gradients, the FFN's
#: 4·D-channel temporaries above it are recomputed in strips in backward, :class:`_StripsRecomputed`)
FRESH_BYTES = 32 << 20


def _strip(rows: int, per_row: int, multiple: int = 1, force: bool = False) -> int:
    """Rows per strip (a multiple of ``multiple``) whose temporaries take about STRIP_BYTES·threads²; all rows
    when gradients are recorded or at more than one thread (unless ``force``)."""
    if not force and (torch.is_grad_enabled() or torch.get_num_threads() > 1):
        return rows
    k = max(1, STRIP_BYTES * torch.get_num_threads() ** 2 // max(1, per_row * multiple))
    return min(rows, k * multiple)


def _softmax_(t: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, in place when no gradient is recorded."""
    if torch.is_grad_enabled():
        return torch.softmax(t, dim=-1)
    return torch.ops.aten._softmax.out(t, -1, False, out=t)


def _gelu_(t: torch.Tensor) -> torch.Tensor:
    """GELU (erf), in place when no gradient is recorded."""
    return F.gelu(t) if torch.is_grad_enabled() else torch.ops.aten.gelu_(t)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ + bias) v over (N, heads, L, d) (q already scaled); bias (heads, L, L). Plain matmuls:
    scaled_dot_product_attention with a float mask scans the mask for fully masked rows on the CPU, which costs
    more than the attention here."""
    sim = torch.matmul(q, k.transpose(-1, -2))
    sim += bias
    return torch.matmul(_softmax_(sim), v)


class _Attention(nn.Module):
    """Window self-attention on (B, H, W, D) tokens, D = heads·head_dim, H and W multiples of ``window``.

    heads = 1: attention within w×w windows, plus a learned bias (w², w²). heads ≥ 2 (even): heads/2 heads within
    windows (bias per head, (w², w²)), heads/2 across the windows among the pixels at one position of every
    window (bias per head over the window grid ``grid`` = (gh, gw), resized for other grids)."""

    def __init__(self, dim: int, heads: int, head_dim: int, window: int, grid: tuple[int, int], resize: str):
        super().__init__()
        if heads > 1 and heads % 2:
            raise ValueError(f"half-shuffle attention needs an even number of heads, got {heads}")
        self.heads, self.head_dim, self.window, self.grid, self.resize = heads, head_dim, window, grid, resize
        inner = heads * head_dim
        self.q = nn.Linear(dim, inner, bias=False)
        self.kv = nn.Linear(dim, 2 * inner, bias=False)
        self.proj = nn.Linear(inner, dim)
        n = window * window
        if heads == 1:  # the toolbox's shapes, so that its tables load as they are
            self.bias = nn.Parameter(_trunc_normal(torch.empty(1, 1, n, n), 1.0))
        else:
            g = grid[0] * grid[1]
            self.local_bias = nn.Parameter(_trunc_normal(torch.empty(1, 1, heads // 2, n, n), 1.0))
            self.shuffle_bias = nn.Parameter(_trunc_normal(torch.empty(1, 1, heads // 2, g, g), 1.0))

    def _grid_bias(self, nh: int, nw: int, dtype) -> torch.Tensor:
        """The across-window bias for an nh×nw window grid: (heads/2, nh·nw, nh·nw)."""
        table = self.shuffle_bias.reshape(self.heads // 2, *self.shuffle_bias.shape[-2:])
        gh, gw = self.grid
        if (nh, nw) != (gh, gw):
            if self.resize == "flat":  # the toolbox's real-data test code: the table resized as an image
                table = F.interpolate(table[None], size=(nh * nw, nh * nw), mode="bilinear", align_corners=False)[0]
            else:  # bilinear over the grid of keys, then over the grid of queries
                h = self.heads // 2
                t = table.reshape(h * gh * gw, 1, gh, gw)
                t = F.interpolate(t, size=(nh, nw), mode="bilinear", align_corners=False)
                t = t.reshape(h, gh * gw, nh * nw).transpose(1, 2).reshape(h * nh * nw, 1, gh, gw)
                t = F.interpolate(t, size=(nh, nw), mode="bilinear", align_corners=False)
                table = t.reshape(h, nh * nw, nh * nw).transpose(1, 2)
        return table.to(dtype)

    def _qkv(self, norm: nn.LayerNorm, t: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3·heads·d): q (scaled by 1/√d), k, v of LN(t), one matmul."""
        n = norm(t)
        weight = torch.cat([self.q.weight * self.head_dim ** -0.5, self.kv.weight])
        return F.linear(n, weight.to(n.dtype) if torch.is_autocast_enabled() else weight)

    def _local(self, qkv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Attention within windows of one strip of q, k, v (B, R, W, 3, heads, d) -> (B, R, W, heads, d)."""
        B, R, W, _, heads, d = qkv.shape
        w = self.window
        nh, nw = R // w, W // w
        t = qkv.reshape(B, nh, w, nw, w, 3, heads, d).permute(5, 0, 1, 3, 6, 2, 4, 7)
        q, k, v = t.reshape(3, B * nh * nw, heads, w * w, d).unbind(0)
        o = _attend(q, k, v, bias.to(q.dtype))
        return o.view(B, nh, nw, heads, w, w, d).permute(0, 1, 4, 2, 5, 3, 6).reshape(B, R, W, heads, d)

    halo = 0  # windows-only attention: strips of window rows are independent

    def rows(self, t: torch.Tensor) -> int:
        return _strip(t.shape[1], t.shape[2] * max(3 * t.shape[3], self.window ** 2) * t.element_size(),
                      self.window, force=True)

    def strip(self, norm: nn.LayerNorm, t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """Windows-only attention(LN t) on rows r0..r1−1 (whole windows): (B, r1−r0, W, D)."""
        qkv = self._qkv(norm, _rows(t, r0, r1)).unflatten(-1, (3, 1, self.head_dim))
        return self.proj(self._local(qkv, self.bias[0]).flatten(-2))

    def forward(self, norm: nn.LayerNorm, t: torch.Tensor) -> torch.Tensor:
        """t + attention(LN t), (B, H, W, D) -> (B, H, W, D); in place on t when no gradient is recorded."""
        B, H, W, D = t.shape
        w, d, grad = self.window, self.head_dim, torch.is_grad_enabled()
        if self.heads == 1:  # windows only: strips of window rows, each on its own
            if not grad:
                rows = self.rows(t)
                for r0 in range(0, H, rows):
                    t[:, r0:r0 + rows] += self.strip(norm, t, r0, min(H, r0 + rows))
                return t
            if _recompute(self, norm, t, 3 * D):
                return t + _StripsRecomputed.apply(self, norm, t, *norm.parameters(), *self.parameters())
            return t + self.strip(norm, t, 0, H)
        h, nh, nw = self.heads // 2, H // w, W // w
        loc, shu = self._qkv(norm, t).unflatten(-1, (3, 2, h, d)).unbind(4)
        # across windows: the tokens at in-window position (i, j) of every window, in groups of positions
        shu = shu.reshape(B, nh, w, nw, w, 3, h, d).permute(5, 0, 2, 4, 6, 1, 3, 7)
        sq, sk, sv = shu.reshape(3, B * w * w, h, nh * nw, d).unbind(0)
        bias = self._grid_bias(nh, nw, sq.dtype)
        if grad:
            lo = self._local(loc, self.local_bias[0, 0])
            so = _attend(sq, sk, sv, bias)
            so = so.view(B, w, w, h, nh, nw, d).permute(0, 4, 1, 5, 2, 3, 6).reshape(B, H, W, h, d)
            return t + self.proj(torch.stack([lo, so], dim=3).view(B, H, W, D))
        out = torch.empty(B, H, W, 2, h, d, dtype=sq.dtype, device=sq.device)
        rows = _strip(H, W * max(3 * D, h * w * w) * t.element_size(), w)
        for r0 in range(0, H, rows):  # within windows: strips of window rows
            out[:, r0:r0 + rows, :, 0] = self._local(loc[:, r0:r0 + rows], self.local_bias[0, 0])
        so = torch.empty_like(sq)
        step = max(1, STRIP_BYTES // max(1, h * (nh * nw) ** 2 * sq.element_size()))
        step = B * w * w if torch.get_num_threads() > 1 else step
        for i in range(0, B * w * w, step):
            so[i:i + step] = _attend(sq[i:i + step], sk[i:i + step], sv[i:i + step], bias)
        out[:, :, :, 1] = so.view(B, w, w, h, nh, nw, d).permute(0, 4, 1, 5, 2, 3, 6).reshape(B, H, W, h, d)
        return t.add_(self.proj(out.view(B, H, W, D)))


class _FeedForward(nn.Module):
    """(B, H, W, D) -> (B, H, W, D): 1×1 to 4D, GELU, depthwise 3×3, GELU, 1×1 back (no biases)."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.expand = nn.Conv2d(dim, dim * mult, 1, bias=False)
        self.dw = nn.Conv2d(dim * mult, dim * mult, 3, padding=1, groups=dim * mult, bias=False)
        self.project = nn.Conv2d(dim * mult, dim, 1, bias=False)

    halo = 1  # the depthwise 3×3 reads one row above and below

    def rows(self, t: torch.Tensor) -> int:
        return _strip(t.shape[1], t.shape[2] * self.expand.out_channels * t.element_size(), force=True)

    def strip(self, norm: nn.LayerNorm, t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """FFN(LN t) on rows r0..r1−1, from rows r0−1..r1 of t (the 3×3's neighbours): (B, r1−r0, W, D)."""
        a, b = max(0, r0 - 1), min(t.shape[1], r1 + 1)
        h = _gelu_(F.linear(norm(_rows(t, a, b)), self.expand.weight.flatten(1)))
        h = _gelu_(_rows(self.dw(h.permute(0, 3, 1, 2)), r0 - a, r1 - a, dim=2)).permute(0, 2, 3, 1)
        return F.linear(h, self.project.weight.flatten(1))

    def forward(self, norm: nn.LayerNorm, t: torch.Tensor) -> torch.Tensor:
        """t + FFN(LN t), in strips of rows: in place on t without gradients; with gradients on the CPU through
        :class:`_StripsRecomputed` (float32, temporaries above FRESH_BYTES), else on the whole frame."""
        H = t.shape[1]
        if torch.is_grad_enabled():
            if _recompute(self, norm, t, self.expand.out_channels):
                return t + _StripsRecomputed.apply(self, norm, t, *norm.parameters(), *self.parameters())
            return t + self.strip(norm, t, 0, H)
        out, rows = torch.empty_like(t), self.rows(t)
        for r0 in range(0, H, rows):
            out[:, r0:r0 + rows] = self.strip(norm, t, r0, min(H, r0 + rows))
        return t.add_(out)


class _StripsRecomputed(torch.autograd.Function):
    """``part``(LN t) with gradients, for the CPU, where ``part`` (a block's FFN or its windows-only attention)
    computes rows r0..r1−1 from rows r0−halo..r1+halo−1 of t (``part.strip``): the forward runs in strips without
    keeping their temporaries, the backward recomputes each strip and back-propagates it on its own, so that no
    whole-frame temporary is allocated (fresh whole-frame tensors cost the CPU more in page faults than their
    arithmetic). Same values and gradients as the whole frame."""

    @staticmethod
    def forward(ctx, part, norm, t, *params):
        ctx.part, ctx.norm = part, norm
        ctx.save_for_backward(t)
        H, rows = t.shape[1], part.rows(t)
        out = torch.empty_like(t)
        with torch.no_grad():
            for r0 in range(0, H, rows):
                out[:, r0:r0 + rows] = part.strip(norm, t, r0, min(H, r0 + rows))
        return out

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        part, norm = ctx.part, ctx.norm
        params = [*norm.parameters(), *part.parameters()]
        wanted = [p for p in params if p.requires_grad]
        H, rows = t.shape[1], part.rows(t)
        gt, gp = torch.zeros_like(t), [torch.zeros_like(p) for p in wanted]
        for r0 in range(0, H, rows):
            r1 = min(H, r0 + rows)
            a, b = max(0, r0 - part.halo), min(H, r1 + part.halo)
            with torch.enable_grad():
                piece = t[:, a:b].detach().requires_grad_()
                grads = torch.autograd.grad(part.strip(norm, piece, r0 - a, r1 - a), [piece, *wanted], g[:, r0:r1])
            gt[:, a:b] += grads[0]
            for acc, gr in zip(gp, grads[1:]):
                acc += gr
        it = iter(gp)
        return (None, None, gt, *(next(it) if p.requires_grad else None for p in params))


def _recompute(part: nn.Module, norm: nn.LayerNorm, t: torch.Tensor, temporary: int) -> bool:
    """Whether ``part`` should run through :class:`_StripsRecomputed`: gradients, float32 on the CPU, and a
    whole-frame temporary of ``temporary`` channels above FRESH_BYTES."""
    return (torch.is_grad_enabled() and t.device.type == "cpu" and t.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
            and t.numel() // t.shape[-1] * temporary * t.element_size() > FRESH_BYTES)


class _Block(nn.Module):
    """Pre-norm transformer block on (B, H, W, D): t + attention(LN t), then t + FFN(LN t)."""

    def __init__(self, dim: int, heads: int, head_dim: int, window: int, grid: tuple[int, int], resize: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads, head_dim, window, grid, resize)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = _FeedForward(dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.norm2, self.attn(self.norm1, t))


def _run_blocks(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """(B, D, H, W) -> (B, D, H, W) (a channels-last view) through the blocks on (B, H, W, D) tokens. Without
    gradients the blocks update their input in place: x must be a temporary of the caller's."""
    t = x.permute(0, 2, 3, 1).contiguous()
    for block in blocks:
        t = block(t)
    return t.permute(0, 3, 1, 2)


class HalfShuffleTransformer(nn.Module):
    """DAUHST's stage prior (HST): a U-shaped transformer. 3×3 embedding to ``dim``; scales s = 0..S−1 of
    dim·2^s channels and 2^s heads of ``dim`` channels (``blocks[s]`` blocks each; the first scale attends within
    windows only, the others half within, half across windows); 4×4 stride-2 convs down, 2×2 transposed convs up,
    1×1 fusion of the skip; 3×3 mapping to ``out_channels`` plus the first ``out_channels`` input channels.
    Pads (mirror) to a multiple of window·2^(S−1) inside and crops back. ``frame`` (H, W): the padded frame the
    across-window bias tables are sized for (other frames resize them: ``resize``).
    (B, C_in, H, W) -> (B, C_out, H, W), any H, W."""

    def __init__(self, in_channels: int, out_channels: int, dim: int = 28, blocks: Sequence[int] = (1, 1, 1),
                 window: int = 8, frame: Sequence[int] = (256, 320), resize: str = "grid"):
        super().__init__()
        blocks = [int(b) for b in blocks]
        if len(blocks) < 1 or min(blocks) < 0 or dim < 1 or window < 1:
            raise ValueError(f"HalfShuffleTransformer needs dim >= 1, window >= 1 and blocks per scale >= 0, got "
                             f"dim={dim}, window={window}, blocks={blocks}")
        if resize not in RESIZE:
            raise ValueError(f"resize must be one of {RESIZE}, got {resize!r}")
        self.out_channels, self.scales = out_channels, len(blocks)
        self.multiple = window * 2 ** (self.scales - 1)
        fh, fw = (int(v) for v in frame)
        if fh % self.multiple or fw % self.multiple or fh < 1 or fw < 1:
            raise ValueError(f"frame {fh}×{fw} must be a positive multiple of window·2^(scales−1) = "
                             f"{self.multiple}")
        self.frame = (fh, fw)

        def stack(s: int, n: int) -> nn.ModuleList:
            grid = (fh // (window * 2 ** s), fw // (window * 2 ** s))
            return nn.ModuleList(_Block(dim * 2 ** s, 2 ** s, dim, window, grid, resize) for _ in range(n))

        S = self.scales
        self.embed = nn.Conv2d(in_channels, dim, 3, padding=1, bias=False)
        self.enc = nn.ModuleList(stack(s, blocks[s]) for s in range(S - 1))
        self.down = nn.ModuleList(nn.Conv2d(dim * 2 ** s, dim * 2 ** (s + 1), 4, 2, 1, bias=False)
                                  for s in range(S - 1))
        self.mid = stack(S - 1, blocks[-1])
        # decoder i works at scale S−2−i
        self.up = nn.ModuleList(nn.ConvTranspose2d(dim * 2 ** (S - 1 - i), dim * 2 ** (S - 2 - i), 2, stride=2)
                                for i in range(S - 1))
        self.fuse = nn.ModuleList(nn.Conv2d(dim * 2 ** (S - 1 - i), dim * 2 ** (S - 2 - i), 1, bias=False)
                                  for i in range(S - 1))
        self.dec = nn.ModuleList(stack(S - 2 - i, blocks[S - 2 - i]) for i in range(S - 1))
        self.mapping = nn.Conv2d(dim, out_channels, 3, padding=1, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _trunc_normal(m.weight, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = x.shape[-2:]
        x = _reflect_pad(x, -H % self.multiple, -W % self.multiple)
        fea, skips = self.embed(x), []
        for enc, down in zip(self.enc, self.down):
            fea = _run_blocks(enc, fea)
            skips.append(fea)
            fea = down(fea)
        fea = _run_blocks(self.mid, fea)
        for up, fuse, dec, skip in zip(self.up, self.fuse, self.dec, reversed(skips)):
            fea = _run_blocks(dec, fuse(torch.cat([up(fea), skip], dim=1)))
        return _head(_head(self.mapping(fea) + _head(x, self.out_channels, 1), H, -2), W, -1)


class HSTPrior(HalfShuffleTransformer):
    """A stage network from DAUHST's blocks (the Refiner's ``prior="hst"``): the half-shuffle transformer above
    with ``depth`` scales of one block each, heads of ``width`` channels (2^s heads at scale s), 8×8 windows,
    across-window position tables for a 256² frame (other frames resize them over the window grid), and its
    last mapping started at 0.01× its default initialisation, so that out ≈ x[:, :C_out] at step 0.
    (B, C_in, H, W) -> (B, C_out, H, W) at any H, W."""

    def __init__(self, in_channels: int, out_channels: int, width: int = 28, depth: int = 3):
        check_positive_int("HSTPrior width", width)
        check_positive_int("HSTPrior depth", depth)
        side = 8 * 2 ** (depth - 1) * max(1, 256 // (8 * 2 ** (depth - 1)))
        super().__init__(in_channels, out_channels, dim=width, blocks=[1] * depth, window=8, frame=(side, side))
        with torch.no_grad():
            self.mapping.weight.mul_(0.01)


class StageEstimator(nn.Module):
    """DAUHST's degradation-parameter estimator: 1×1 conv to ``width``, ReLU, 3×3 stride-2 conv, global average,
    1×1, ReLU, 1×1, ReLU, 1×1 to 2K, softplus, + 1e-6: (B, C, H, W) -> (α, β), two (B, K). The pooled stride-2
    conv is computed as the conv of nine tap means (it is linear), the same value without the half-resolution
    feature map."""

    def __init__(self, in_channels: int, stages: int, width: int = 64):
        super().__init__()
        self.stages = stages
        self.inp = nn.Conv2d(in_channels, width, 1)
        self.down = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.mlp = nn.Sequential(nn.Conv2d(width, width, 1), nn.ReLU(inplace=True), nn.Conv2d(width, width, 1),
                                 nn.ReLU(inplace=True), nn.Conv2d(width, 2 * stages, 1), nn.Softplus())

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, w = z.shape[-2:]
        ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        rows = _strip(h, w * self.inp.out_channels * z.element_size())
        # the 3×3 stride-2 conv's mean = the conv of the nine taps' sums / (ho·wo); columns first, in strips of rows
        cols = torch.cat([torch.stack(_tap_sums(F.relu(self.inp(_rows(z, r, r + rows, dim=2)))), dim=-1)
                          for r in range(0, h, rows)], dim=2)  # (B, width, H, 3 column taps)
        taps = torch.stack(_tap_sums(cols.transpose(-1, -2)), dim=-2)  # (B, width, 3 row taps, 3 column taps)
        weight, bias = self.down.weight.to(taps.dtype), self.down.bias.to(taps.dtype)
        pooled = torch.einsum("bikl,oikl->bo", taps, weight) / (ho * wo) + bias
        p = self.mlp(pooled[..., None, None]).flatten(1) + 1e-6
        return p[:, : self.stages], p[:, self.stages:]


# ---------------------------------------------------------------------------------------------- models
@register
class DAUHST(ToolboxModel):
    """DAUHST (the MST toolbox's ``dauhst_{K}stg``, simulation): K stages of a data step with an estimated
    step parameter α_k in the dispersed frame and a half-shuffle transformer fed the estimated noise level β_k
    (module docstring). ``model(op, y) -> x`` (B, C, H, W) from y (B, 1, H, W+Δ); ``return_stages=True`` gives
    [x₀, x₁, …, x_K] (x₀: the fused first estimate), each (B, C, H, W).

    Args:
        bands: C. stages: K. dim: channels of the first scale (= channels per head). blocks: transformer blocks
        per scale. window: attention window. frame: the padded (H, W+Δ) frame the across-window bias tables are
        sized for (the toolbox's: 256×320). resize: how other frames resize them ("grid" or "flat").
        checkpointing: recompute each stage's activations in backward.

    Refuses fractional offsets (it works in the dispersed frame). Any band count, frame, dispersion axis,
    batch of masks; 256² (28 bands, step 2) is the toolbox's frame and gives its output exactly."""

    def __init__(self, bands: int = 28, stages: int = 9, dim: int = 28, blocks: Sequence[int] = (1, 1, 1),
                 window: int = 8, frame: Sequence[int] = (256, 320), resize: str = "grid",
                 checkpointing: bool = False):
        super().__init__()
        self.bands, self.stages = check_positive_int("bands", bands), check_positive_int("stages", stages)
        self.checkpointing = bool(checkpointing)
        self.config = _config(self, dict(locals()))
        self.estimator = StageEstimator(bands, stages)
        self.fuse = nn.Conv2d(2 * bands, bands, 1)
        self.priors = nn.ModuleList(HalfShuffleTransformer(bands + 1, bands, dim, blocks, window, frame, resize)
                                    for _ in range(stages))

    def prior(self, k: int) -> nn.Module:
        """Stage k's transformer: (B, C+1, H, W) (the cube, the noise level β as one more channel) -> (B, C, H, W)."""
        return self.priors[k]

    def limits(self, op) -> None:
        integer_offsets(op, f"this {type(self).__name__}")

    def _initial(self, y: torch.Tensor, phi: torch.Tensor, offs: list[int], n: int) -> torch.Tensor:
        """fuse([y·2/C on each band's n columns, Phi]) in the dispersed frame: (B, C, H, W') (dispersed last).
        The y half is y times a per-column weight (the fuse weights summed over the bands that see the column)."""
        C, wd = self.bands, y.shape[-1]
        cols = torch.arange(wd, device=y.device)
        start = torch.tensor(offs, device=y.device)[:, None]
        support = ((cols >= start) & (cols < start + n)).to(y.dtype)  # (C, W')
        weight = self.fuse.weight.flatten(1).to(y.dtype)
        per_col = (weight[:, :C] @ support) * (2.0 / C)  # (C_out, W')
        return y * per_col[:, None, :] + F.conv2d(phi, weight[:, C:, None, None], self.fuse.bias.to(y.dtype))

    def _stage(self, k: int, op, y: torch.Tensor, z: torch.Tensor, alpha, beta, n: int) -> torch.Tensor:
        """One stage on the rolled-back frame z (B, C, H, W') (dispersed last): data step on the first n columns,
        the prior on [x, β]."""
        scene, spare = z.split([n, z.shape[-1] - n], dim=-1)
        x = torch.cat([dispersed_last(op, op.data_step(undo(op, scene), y, alpha[:, k, None, None, None])), spare], -1)
        noise = beta[:, k, None, None, None].expand(-1, 1, *x.shape[-2:])
        return self.priors[k](torch.cat([x, noise], dim=1)).to(y.dtype)

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x_K (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` [x₀, …, x_K]. ``gt`` is ignored."""
        offs = integer_offsets(op)
        yd = dispersed_last(op, y)
        n = yd.shape[-1] - op.delta
        z = self._initial(yd, dispersed_last(op, shifted_mask(op)).to(y.dtype), offs, n)
        alpha, beta = (p.to(y.dtype) for p in self.estimator(z))
        z = roll_bands(z, offs, -1).to(y.dtype)
        outs = [_head(z, n, -1)]
        for k in range(self.stages):
            if self.checkpointing and torch.is_grad_enabled():
                z = checkpoint(self._stage, k, op, y, z, alpha, beta, n, use_reentrant=False)
            else:
                z = self._stage(k, op, y, z, alpha, beta, n)
            outs.append(_head(z, n, -1))
        outs = [undo(op, o) for o in outs]
        return outs if return_stages else outs[-1]


@register
class DAUHSTReal(ToolboxModel):
    """DAUHST's real-data variant (the MST toolbox's ``real/`` code): x = HST_K(…HST_1(fuse(H))), H = y shifted
    back per band without scaling (y as the toolbox's real code feeds it: the measurement scaled to its training
    range, e.g. peak 0.8), no mask and no data step. Its checkpoints also hold an estimator it never calls
    (``unused_estimator``, kept so that they load strictly). Position tables for a 384×384 frame; other frames
    resize them (``resize``, default "flat": the toolbox's real-data test code). Any geometry (fractional offsets
    too: H is the operator's shift-back). ``return_stages=True`` gives [fuse(H), x₁, …, x_K].
    (B, 1, H, W+Δ) -> (B, C, H, W)."""

    def __init__(self, bands: int = 28, stages: int = 9, dim: int = 28, blocks: Sequence[int] = (1, 1, 1),
                 window: int = 8, frame: Sequence[int] = (384, 384), resize: str = "flat",
                 checkpointing: bool = False):
        super().__init__()
        self.bands, self.stages = check_positive_int("bands", bands), check_positive_int("stages", stages)
        self.checkpointing = bool(checkpointing)
        self.config = _config(self, dict(locals()))
        self.unused_estimator = StageEstimator(bands, stages).requires_grad_(False)  # no gradient: DDP ignores it
        self.fuse = nn.Conv2d(bands, bands, 1)
        self.priors = nn.ModuleList(HalfShuffleTransformer(bands, bands, dim, blocks, window, frame, resize)
                                    for _ in range(stages))

    def prior(self, k: int) -> nn.Module:
        """Stage k's transformer: (B, C, H, W) -> (B, C, H, W)."""
        return self.priors[k]

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x_K (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` [x₀, …, x_K]. ``gt`` is ignored."""
        x = self.fuse(dispersed_last(op, shift_back(op, y, scale=False))).to(y.dtype)
        outs = [x]
        for k in range(self.stages):
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(self.priors[k], x, use_reentrant=False).to(y.dtype)
            else:
                x = self.priors[k](x).to(y.dtype)
            outs.append(x)
        outs = [undo(op, o) for o in outs]
        return outs if return_stages else outs[-1]


# ---------------------------------------------------------------------------------------------- toolbox names
_RENAME = [(r"^para_estimator\.fution\.", "estimator.inp."), (r"^para_estimator\.down_sample\.", "estimator.down."),
           (r"^para_estimator\.mlp\.", "estimator.mlp."), (r"^fution\.", "fuse."), (r"^denoisers\.", "priors."),
           (r"\.embedding\.", ".embed."),
           (r"\.encoder_layers\.(\d+)\.0\.blocks\.(\d+)\.", r".enc.\1.\2."),
           (r"\.encoder_layers\.(\d+)\.1\.", r".down.\1."),
           (r"\.bottleneck\.blocks\.(\d+)\.", r".mid.\1."),
           (r"\.decoder_layers\.(\d+)\.0\.", r".up.\1."),
           (r"\.decoder_layers\.(\d+)\.1\.", r".fuse.\1."),
           (r"\.decoder_layers\.(\d+)\.2\.blocks\.(\d+)\.", r".dec.\1.\2."),
           (r"\.0\.norm\.(weight|bias)$", r".norm1.\1"), (r"\.1\.norm\.(weight|bias)$", r".norm2.\1"),
           (r"\.0\.fn\.to_q\.", ".attn.q."), (r"\.0\.fn\.to_kv\.", ".attn.kv."), (r"\.0\.fn\.to_out\.", ".attn.proj."),
           (r"\.0\.fn\.pos_emb1$", ".attn.local_bias"), (r"\.0\.fn\.pos_emb2$", ".attn.shuffle_bias"),
           (r"\.0\.fn\.pos_emb$", ".attn.bias"),
           (r"\.1\.fn\.net\.0\.", ".ffn.expand."), (r"\.1\.fn\.net\.2\.", ".ffn.dw."),
           (r"\.1\.fn\.net\.4\.", ".ffn.project.")]
_RENAME = [(re.compile(p), r) for p, r in _RENAME]


def toolbox_key(key: str) -> str:
    """The cassi name of a key of the toolbox's DAUHST state dict."""
    for pattern, repl in _RENAME:
        key = pattern.sub(repl, key)
    return key


def _real_key(key: str) -> str:
    return re.sub(r"^estimator\.", "unused_estimator.", toolbox_key(key))


for _k in (2, 3, 5, 9):
    register_method(f"dauhst_{_k}stg", "DAUHST", rename=toolbox_key, stages=_k)
    register_method(f"dauhst_{_k}stg_real", "DAUHSTReal", rename=_real_key, stages=_k)
