"""MST and MST++ (Cai et al., CVPR 2022 / CVPRW 2022) as the MST toolbox has them, weight-compatible: toolbox
methods ``mst_s`` / ``mst_m`` / ``mst_l`` (:class:`MST`), ``mst_plus_plus`` (:class:`MSTPlusPlus`), and the
real-data variants of ``real/train_code`` (``mst_s_real`` … , :class:`MSTReal`, ``mst_plus_plus_real``,
:class:`MSTPlusPlusReal`).

Both are U-shaped transformers whose attention is *spectral*: in each head the d channels are the tokens and
the H·W pixels their features (MS-MSA). With X (N=HW, c) a level's features and W_q, W_k, W_v, W_p (c×c):

    A_h = softmax_j(r_h · k̂_i·q̂_j),  k̂_i = k_i/‖k_i‖ over pixels (q̂ alike),  out = (A v) W_pᵀ + b + pos(v)

Computed here without forming q, k, (A v) or the normalised copies (exact up to float rounding):
k_i·q_j = (W_k S W_qᵀ)_ij and ‖k_i‖² = (W_k S W_kᵀ)_ii with S = XᵀX (c×c, one pass over X, float32, taken
about the channel means so that no digits cancel: S = X_cᵀX_c + N μμᵀ), and
the attention folds into the projection, M = W_p·blockdiag(A_h), so the pixel-sized work is S, V = X W_vᵀ and
one product V Mᵀ (three c×c×N products instead of the reference's six). Every tensor is kept channels-last
(B, H, W, C), so 1×1 convolutions are plain matrix products and the depthwise 3×3 ones run on oneDNN's fast
channels-last path.

MST's mask guidance (per block) turns Phi, the mask placed at each band's offset (B, C, H, W+Δ), into a
gate on v: conv1×1 → (· ⊙ (1 + σ(dw5×5(conv1×1 ·)))), then channel i is read from columns s_i … s_i+W−1.
At level l (channels dim·2^l, width W/2^l) the toolbox takes s_i = ⌊2·i/4^l⌋ (its ``256 // row`` makes the
level from the frame height, so it holds at 256² only); here level l is known and s_i = ⌊d(i/2^l)/2^l⌋ with
d the per-band offsets interpolated linearly (extrapolated past the last band), clamped to the mask's width:
exactly the toolbox's at its geometry (step 2, 28 bands, 256²), and the same rule for any integer offsets,
band count and frame size.

Imports torch only.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi._checks import check_positive_int
from cassi.models.blocks import near_zero, padded
from cassi.models.unrolled import _config
from cassi.models.zoo.toolbox import (ToolboxModel, dispersed_last, integer_offsets, register_method, shift_back,
                                      undo)
from cassi.registry import register

__all__ = ["MST", "MSTReal", "MSTPlusPlus", "MSTPlusPlusReal", "SpectralUNet", "level_shifts"]

_CL = torch.channels_last
_CHUNK_BYTES = 8 << 20  # without autograd, feed-forwards run in bands of rows whose 4c-wide intermediate is about this


# ---------------------------------------------------------------------------------------------- layout helpers
def _nchw(t: torch.Tensor) -> torch.Tensor:
    """(B, H, W, C) contiguous -> the same memory as a channels-last (B, C, H, W) view."""
    return t.permute(0, 3, 1, 2)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H, W, C), contiguous (free when ``t`` is channels-last)."""
    return t.contiguous(memory_format=_CL).permute(0, 2, 3, 1)


def _conv(t: torch.Tensor, weight, bias=None, stride=1, padding=0, groups=1) -> torch.Tensor:
    """A convolution of (B, H, W, C) features: (B, H, W, C) -> (B, H', W', C')."""
    return _nhwc(F.conv2d(_nchw(t), weight, bias, stride, padding, 1, groups))


def _gelu(t: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, in place where no gradient is recorded."""
    if torch.is_grad_enabled() and t.requires_grad:
        return F.gelu(t)
    return torch.ops.aten.gelu_(t)


def _linear(t: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """A 1×1 convolution (weight (C', C[, 1, 1])) of (..., C) features."""
    return F.linear(t, weight.reshape(weight.shape[0], -1), bias)


class _Depthwise(torch.autograd.Function):
    """A depthwise k×k convolution (stride 1, 'same' padding) of channels-last x (B, C, H, W) whose backward
    computes the weight's gradient as one grouped convolution of the padded input with the output gradient as
    kernel (oneDNN's own depthwise weight gradient is several times slower for 5×5), and the input's gradient
    as the convolution with the flipped kernel."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.conv2d(x, weight, bias, 1, weight.shape[-1] // 2, 1, x.shape[1])

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        c, k = x.shape[1], weight.shape[-1]
        p = k // 2
        g = g.to(x.dtype)  # (bf16 under autocast: the gradients are taken in the inputs' dtype)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = F.conv2d(g, weight.to(x.dtype).flip(-1, -2), None, 1, p, 1, c)
        if ctx.needs_input_grad[1]:
            xp = F.pad(x, (p, p, p, p))
            gw = sum(F.conv2d(xp[i:i + 1], g[i].reshape(c, 1, *g.shape[-2:]), None, 1, 0, 1, c)
                     for i in range(x.shape[0])).view(c, 1, k, k).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            gb = g.sum((0, 2, 3)).to(weight.dtype)
        return gx, gw, gb


def _depthwise(t: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """Depthwise 'same' convolution of (B, H, W, C) features (the fast weight gradient where one is needed)."""
    if torch.is_grad_enabled() and (t.requires_grad or weight.requires_grad):
        return _nhwc(_Depthwise.apply(_nchw(t).contiguous(memory_format=_CL), weight, bias))
    return _conv(t, weight, bias, padding=weight.shape[-1] // 2, groups=t.shape[-1])


# ---------------------------------------------------------------------------------------------- mask guidance
def level_shifts(offsets: Sequence[float], channels: int, level: int) -> list[int]:
    """The column each of ``channels`` channels of level ``level`` reads its mask window from:
    s_i = ⌊d(i/2^l)/2^l⌋, d the per-band offsets linearly interpolated (extrapolated past the last band).
    With offsets 2c this is the toolbox's ⌊2i/4^l⌋."""
    d = [Fraction(o) for o in offsets]
    n, per = len(d), 2 ** level
    out = []
    for i in range(channels):
        t = Fraction(i, per)
        k = 0 if n == 1 else min(math.floor(t), n - 2)
        v = d[k] if n == 1 else d[k] + (t - k) * (d[k + 1] - d[k])
        out.append(math.floor(v / per))
    return out


class _MaskGuide(nn.Module):
    """The mask-guided gate of one attention block: Phi (Bm, H, W', c) -> (Bm, H, W, c), channel i read from
    columns s_i … s_i+W−1 of m ⊙ (1 + σ(dw5×5(conv2(m)))), m = conv1(Phi)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 1)
        self.conv2 = nn.Conv2d(c, c, 1)
        self.depth = nn.Conv2d(c, c, 5, padding=2, groups=c)

    def forward(self, phi: torch.Tensor, index: torch.Tensor, width: int) -> torch.Tensor:
        b, h, _, c = phi.shape
        m = _linear(phi, self.conv1.weight, self.conv1.bias)
        g = _depthwise(_linear(m, self.conv2.weight, self.conv2.bias), self.depth.weight, self.depth.bias)
        g = torch.sigmoid_(g)
        g = torch.addcmul(m, m, g, out=g) if not torch.is_grad_enabled() and m.dtype == g.dtype else \
            torch.addcmul(m, m, g)
        return g.reshape(b * h, -1).index_select(1, index).view(b, h, width, c)  # (2-D: the fast kernel)


def _centred_gram(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ, S_c): the channel means (B, 1, c) and Σ_n (x_n − μ)(x_n − μ)ᵀ (B, c, c) of x (B, N, c). Without
    autograd it runs over chunks of pixels (each chunk about its own mean, combined exactly: Chan et al.)."""
    n = x.shape[1]
    step = max(1, _CHUNK_BYTES // (4 * x.shape[-1] * x.element_size()))
    if (torch.is_grad_enabled() and x.requires_grad) or n <= step:
        mu = x.mean(1, keepdim=True)
        xc = x - mu
        return mu, torch.bmm(xc.transpose(1, 2), xc)
    parts = []
    for i in range(0, n, step):
        t = x[:, i:i + step]
        m = t.mean(1, keepdim=True)
        tc = t - m
        parts.append((t.shape[1], m, torch.bmm(tc.transpose(1, 2), tc)))
    mu = sum(k * m for k, m, _ in parts) / n
    s = sum(g for _, _, g in parts)
    for k, m, _ in parts:
        d = m - mu
        s = torch.baddbmm(s, d.transpose(1, 2), d, alpha=k)
    return mu, s


def _window_index(shifts: Sequence[int], width: int, device) -> torch.Tensor:
    """Flat (w, c) indices into a (W', c) row: (w + s_c)·c + c_index, for w < width."""
    c = len(shifts)
    s = torch.tensor(shifts, device=device)
    w = torch.arange(width, device=device)[:, None]
    return ((w + s[None, :]) * c + torch.arange(c, device=device)[None, :]).reshape(-1)


# ---------------------------------------------------------------------------------------------- blocks
class _SpectralAttention(nn.Module):
    """MS-MSA: x + (A v) W_pᵀ + b + pos(v) on (B, H, W, c), heads of ``dim_head`` channels, v gated by the mask
    guide when there is one (module docstring for the exact reformulation)."""

    def __init__(self, c: int, dim_head: int, guided: bool):
        super().__init__()
        self.heads, self.dim_head = c // dim_head, dim_head
        self.to_q = nn.Linear(c, c, bias=False)
        self.to_k = nn.Linear(c, c, bias=False)
        self.to_v = nn.Linear(c, c, bias=False)
        self.rescale = nn.Parameter(torch.ones(self.heads, 1, 1))
        self.proj = nn.Linear(c, c)
        self.pos1 = nn.Conv2d(c, c, 3, padding=1, bias=False, groups=c)
        self.pos2 = nn.Conv2d(c, c, 3, padding=1, bias=False, groups=c)
        self.guide = _MaskGuide(c) if guided else None

    def mixing(self, x: torch.Tensor) -> torch.Tensor:
        """M = W_p·blockdiag(A_h) (B, c, c) from the features x (B, N, c), in float32 (or float64)."""
        b, _, c = x.shape
        h, d = self.heads, self.dim_head
        with torch.autocast(x.device.type, enabled=False):
            xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
            # S about the channel means μ (S = XᵀX = S_c + N μμᵀ): the quadratic forms below then add two
            # non-negative parts instead of cancelling large ones (features with offsets lose no digits)
            mu, s = _centred_gram(xf)  # (B, 1, c), (B, c, c)
            wq, wk = self.to_q.weight.to(xf.dtype), self.to_k.weight.to(xf.dtype)
            mq, mk = mu @ wq.t(), mu @ wk.t()  # (B, 1, c): the means of q and k
            n = xf.shape[1]
            swq, swk = s @ wq.t(), s @ wk.t()  # (B, c, c)
            qq = (swq.transpose(1, 2) * wq).sum(-1) + n * mq[:, 0] ** 2  # ‖q_j‖² (B, c)
            kk = (swk.transpose(1, 2) * wk).sum(-1) + n * mk[:, 0] ** 2
            g = torch.baddbmm(wk @ swq, mk.transpose(1, 2), mq, alpha=n)  # k_i·q_j (B, c, c)
            g = g.view(b, h, d, h, d).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (B, h, d, d)
            nk = kk.clamp_min(0).sqrt().clamp_min(1e-12).view(b, h, d, 1)
            nq = qq.clamp_min(0).sqrt().clamp_min(1e-12).view(b, h, 1, d)
            a = torch.softmax(g / (nk * nq) * self.rescale.to(xf.dtype), dim=-1)
            return torch.einsum("ohi,bhij->bohj", self.proj.weight.to(xf.dtype).view(c, h, d), a).reshape(b, c, c)

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        b, hh, ww, c = x.shape
        flat = x.reshape(b, hh * ww, c)
        m = self.mixing(flat).to(flat.dtype)
        v = F.linear(flat, self.to_v.weight)  # (B, N, c)
        pos = _conv(_gelu(_conv(v.view(b, hh, ww, c), self.pos1.weight, padding=1, groups=c)), self.pos2.weight,
                    self.proj.bias, padding=1, groups=c)
        if gate is not None:
            gate = gate.reshape(gate.shape[0], hh * ww, c)
            v = v.mul_(gate) if not torch.is_grad_enabled() else v * gate
        dt = pos.dtype  # (under autocast the operands may differ in dtype; in-place products do not cast)
        return pos.view(b, hh * ww, c).baddbmm_(v.to(dt), m.transpose(1, 2).to(dt)).add_(flat).view(b, hh, ww, c)


class _FeedForward(nn.Module):
    """x + conv1×1(gelu(dw3×3(gelu(conv1×1(LayerNorm(x)))))) on (B, H, W, c), 4c inside."""

    def __init__(self, c: int, mult: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.expand = nn.Conv2d(c, c * mult, 1, bias=False)
        self.depth = nn.Conv2d(c * mult, c * mult, 3, padding=1, bias=False, groups=c * mult)
        self.reduce = nn.Conv2d(c * mult, c, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        step = max(1, _CHUNK_BYTES // (w * self.expand.weight.shape[0] * x.element_size()))
        if not torch.is_grad_enabled() and step < h:  # bands of rows: no frame-sized 4c intermediates
            out = torch.empty_like(x)
            for i in range(b):
                for r0 in range(0, h, step):
                    r1 = min(h, r0 + step)
                    za, ze = max(0, r0 - 1), min(h, r1 + 1)
                    self.rows(x[i, za:ze], r0 - za, r1 - za, out[i, r0:r1].view(-1, c))
            return out
        t = _gelu(_linear(F.layer_norm(x, (c,), self.norm.weight, self.norm.bias), self.expand.weight))
        t = _gelu(_conv(t, self.depth.weight, padding=1, groups=t.shape[-1]))
        return torch.addmm(x.reshape(-1, c), t.reshape(-1, t.shape[-1]),
                           self.reduce.weight.reshape(c, -1).t()).view(x.shape)

    def rows(self, z: torch.Tensor, lo: int, hi: int, out: torch.Tensor) -> None:
        """Rows lo … hi−1 of the output from the rows z (R, W, c) that hold them and their neighbours (where the
        frame has them), into ``out`` ((hi−lo)·W, c): the same sums as the whole-frame pass."""
        c = z.shape[-1]
        t = _gelu(_linear(F.layer_norm(z, (c,), self.norm.weight, self.norm.bias), self.expand.weight))
        t = F.conv2d(_nchw(t[None]), self.depth.weight, None, 1, 1, 1, t.shape[-1])
        t = _gelu(_nhwc(t)[0, lo:hi])
        args = (z[lo:hi].reshape(-1, c), t.reshape(-1, t.shape[-1]), self.reduce.weight.reshape(c, -1).t())
        if all(a.dtype == out.dtype for a in args):
            torch.addmm(*args, out=out)
        else:  # mixed dtypes under autocast: the out= form does not cast
            out.copy_(torch.addmm(*args))


class _Block(nn.Module):
    def __init__(self, c: int, dim_head: int, guided: bool):
        super().__init__()
        self.attn = _SpectralAttention(c, dim_head, guided)
        self.ffn = _FeedForward(c)

    def forward(self, x, phi, index, width):
        gate = None if self.attn.guide is None else self.attn.guide(phi, index, width)
        return self.ffn(self.attn(x, gate))


class _Stack(nn.Module):
    """MSAB: ``n`` blocks of (MS-MSA, feed-forward) at one level, (B, H, W, c) -> (B, H, W, c)."""

    def __init__(self, c: int, dim_head: int, n: int, guided: bool):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(c, dim_head, guided) for _ in range(n))

    def forward(self, x, phi=None, index=None, checkpointing: bool = False):
        width = x.shape[2]
        for block in self.blocks:
            if checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, phi, index, width, use_reentrant=False)
            else:
                x = block(x, phi, index, width)
        return x


class _Down(nn.Module):
    def __init__(self, c: int, dim_head: int, n: int, guided: bool):
        super().__init__()
        self.stack = _Stack(c, dim_head, n, guided)
        self.down = nn.Conv2d(c, 2 * c, 4, 2, 1, bias=False)
        self.mask_down = nn.Conv2d(c, 2 * c, 4, 2, 1, bias=False) if guided else None


class _Up(nn.Module):
    def __init__(self, c: int, dim_head: int, n: int, guided: bool):
        super().__init__()
        self.up = nn.ConvTranspose2d(2 * c, c, 2, 2)
        self.fuse = nn.Conv2d(2 * c, c, 1, bias=False)
        self.stack = _Stack(c, dim_head, n, guided)


class _UNet(nn.Module):
    """The MST U-Net: embedding (3×3), ``stage`` levels of (MSAB, 4×4/2 down), a bottleneck MSAB, ``stage``
    levels of (2×2/2 transposed conv up, 1×1 fusion with the skip, MSAB), mapping (3×3), plus the input.
    Channels dim·2^l at level l, heads 2^l of ``dim`` channels. Works on (B, H, W, C) (H, W multiples of
    2^stage); with ``guided`` each attention block gates v with the shifted mask (Phi, downsampled per level
    by its own 4×4/2 convolutions)."""

    def __init__(self, cin: int, dim: int, stage: int, num_blocks: Sequence[int], guided: bool, lrelu: bool):
        super().__init__()
        if len(num_blocks) != stage + 1:
            raise ValueError(f"num_blocks needs stage + 1 = {stage + 1} entries (levels, then bottleneck), "
                             f"got {list(num_blocks)}")
        self.stage, self.guided, self.lrelu = stage, guided, lrelu
        self.embedding = nn.Conv2d(cin, dim, 3, 1, 1, bias=False)
        self.encoder = nn.ModuleList(_Down(dim * 2 ** i, dim, num_blocks[i], guided) for i in range(stage))
        self.bottleneck = _Stack(dim * 2 ** stage, dim, num_blocks[-1], guided)
        self.decoder = nn.ModuleList(_Up(dim * 2 ** (stage - 1 - i), dim, num_blocks[stage - 1 - i], guided)
                                     for i in range(stage))
        self.mapping = nn.Conv2d(dim, cin, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor, phi: torch.Tensor | None = None, indices: Sequence | None = None,
                checkpointing: bool = False) -> torch.Tensor:
        """x (B, H, W, C) -> (B, H, W, C); phi (Bm, H, W', C) and the window indices per level when guided."""
        fea = _conv(x, self.embedding.weight, padding=1)
        if self.lrelu:
            fea = F.leaky_relu(fea, 0.1, inplace=True)
        skips, phis = [], []
        for level, enc in enumerate(self.encoder):
            idx = indices[level] if self.guided else None
            fea = enc.stack(fea, phi, idx, checkpointing)
            skips.append(fea)
            phis.append(phi)
            fea = _conv(fea, enc.down.weight, stride=2, padding=1)
            if self.guided:
                phi = _conv(phi, enc.mask_down.weight, stride=2, padding=1)
        fea = self.bottleneck(fea, phi, indices[self.stage] if self.guided else None, checkpointing)
        for i, dec in enumerate(self.decoder):
            level = self.stage - 1 - i
            fea = _nhwc(F.conv_transpose2d(_nchw(fea), dec.up.weight, dec.up.bias, 2))
            fea = _linear(torch.cat([fea, skips[level]], dim=-1), dec.fuse.weight)
            fea = dec.stack(fea, phis[level], indices[level] if self.guided else None, checkpointing)
        return _conv(fea, self.mapping.weight, padding=1).add_(x)


class SpectralUNet(nn.Module):
    """A stage network from MST's blocks (the Refiner's ``prior="mst"``): out = x[:, :C_out] + P(U(E x)), E a 3×3
    convolution to ``width`` channels, U MST's U-Net without mask guidance (``depth`` − 1 levels of ``blocks``
    MSABs each, and at the bottleneck; spectral-wise attention in heads of ``width`` channels), P a 1×1
    convolution that starts near zero. (B, C_in, H, W) -> (B, C_out, H, W) at any H, W (replicate-padded inside to
    a multiple of 2^(depth−1))."""

    def __init__(self, in_channels: int, out_channels: int, width: int = 32, depth: int = 3, blocks: int = 1):
        super().__init__()
        for name, value in (("width", width), ("depth", depth), ("blocks", blocks)):
            check_positive_int(f"SpectralUNet {name}", value)
        self.out_channels, self.multiple = out_channels, 2 ** (depth - 1)
        self.head = nn.Conv2d(in_channels, width, 3, padding=1)
        self.body = _UNet(width, width, depth - 1, [blocks] * depth, guided=False, lrelu=False)
        self.last = near_zero(nn.Conv2d(width, out_channels, 1))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(_nhwc(self.head(x)))
        return x[:, : self.out_channels] + self.last(_nchw(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded(x, self.multiple, self._forward)


# ---------------------------------------------------------------------------------------------- helpers
def _check_positive(**values) -> None:
    for name, v in values.items():
        check_positive_int(name, v)


def _frame_limits(op, multiple: int, name: str) -> None:
    """ValueError (one line) for a frame smaller than ``multiple`` pixels on a side (the reflecting pad to a
    multiple of it needs one)."""
    h, w = op.mask.shape[-2:]
    if min(h, w) < multiple:
        raise ValueError(f"{name} pads frames by reflection to a multiple of {multiple} pixels and needs at least "
                         f"{multiple}×{multiple}, got {h}×{w}")


def _pad_to(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """(B, C, H, W) reflect-padded at the bottom and right to multiples of ``multiple``."""
    ph, pw = -t.shape[-2] % multiple, -t.shape[-1] % multiple
    return F.pad(t, (0, pw, 0, ph), mode="reflect") if ph or pw else t


def _phi(m: torch.Tensor, offsets: Sequence[int], delta: int, bands: int) -> torch.Tensor:
    """Phi channels-last: band c of the mask m (Bm, 1|C, H, W) at columns d_c … d_c+W−1 of (Bm, H, W+Δ, C)."""
    bm, cm, h, w = m.shape
    wide = w + 2 * delta  # each band's row, zero-padded by Δ on both sides
    rows = F.pad(m, (delta, delta)).permute(0, 2, 1, 3).reshape(bm * h, cm * wide)
    col = torch.arange(w + delta, device=m.device)[:, None] - torch.tensor(offsets, device=m.device)[None, :]
    band = torch.arange(bands, device=m.device)[None, :] if cm > 1 else torch.zeros(1, 1, dtype=torch.long,
                                                                                       device=m.device)
    return rows.index_select(1, (band * wide + col + delta).reshape(-1)).view(bm, h, w + delta, bands)


def _to_nchw(t: torch.Tensor, size) -> torch.Tensor:
    """(B, H', W', C) -> its first size = (H, W) rows and columns as a contiguous (B, C, H, W) (per sample one
    2-D transpose: the blocked kernel)."""
    b, h, w, c = t.shape
    if (h, w) != tuple(size):
        return t.permute(0, 3, 1, 2)[..., :size[0], :size[1]].contiguous()
    out = t.new_empty((b, c, h, w))
    for i in range(b):
        out[i].view(c, h * w).copy_(t[i].view(h * w, c).t())
    return out


def _param_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


# ---------------------------------------------------------------------------------------------- models
@register
class MST(ToolboxModel):
    """MST (toolbox ``mst_s`` / ``mst_m`` / ``mst_l``: stage 2, num_blocks (2, 2, 2) / (2, 4, 4) / (4, 7, 5)):
    x = U-Net(H, Phi), H = y·2/C shifted back (B, C, H, W), Phi the mask placed at each band's offset
    (B|1, C, H, W+Δ) gating every spectral attention (module docstring). (B, 1, H, W+Δ) -> (B, C, H, W).

    Beyond the toolbox: any band count (``dim`` is the band count: the first level sees Phi's C bands as
    its channels), any frame size (padded by reflection to a multiple of 2^stage and cropped; the mask
    windows follow each level's width, not the toolbox's 256² rule), any integer offsets, dispersion along h
    (the transposed problem), one mask per sample (each sample gated by its own; the toolbox gates the
    whole batch with the first sample's), bf16 autocast (the attention's c×c statistics stay float32),
    ``checkpointing`` (activations recomputed per block in backward).
    Refuses fractional offsets (Phi lives on the dispersed frame's integer columns).
    """

    def __init__(self, bands: int = 28, dim: int | None = None, stage: int = 2,
                 num_blocks: Sequence[int] = (2, 2, 2), checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        dim = bands if dim is None else dim
        _check_positive(bands=bands, dim=dim, stage=stage)
        if dim != bands:
            raise ValueError(f"MST's mask guidance sees Phi's {bands} bands as the first level's channels: "
                             f"dim must equal bands ({bands}), got dim={dim}")
        self.bands, self.stage, self.checkpointing = bands, stage, bool(checkpointing)
        self.net = _UNet(bands, dim, stage, list(num_blocks), guided=True, lrelu=True)
        self._index_cache: dict = {}

    def limits(self, op) -> None:
        integer_offsets(op, "MST (its mask guidance uses Phi, the shifted mask)")
        _frame_limits(op, 2 ** self.stage, "MST")

    def _indices(self, offsets: list[int], widths: list[int], mask_widths: list[int], device) -> list:
        key = (tuple(offsets), tuple(widths), tuple(mask_widths), str(device))
        if key not in self._index_cache:
            out = []
            for level, (w, wm) in enumerate(zip(widths, mask_widths)):
                shifts = level_shifts(offsets, self.bands * 2 ** level, level)
                shifts = [min(max(s, 0), wm - w) for s in shifts]
                out.append(_window_index(shifts, w, device))
            self._index_cache = {key: out}
        return self._index_cache[key]

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, H, W) from y (B, 1, H, W+Δ) (or (B, 1, H+Δ, W) for axis h)."""
        offsets = integer_offsets(op)
        dtype = _param_dtype(self)
        h = dispersed_last(op, shift_back(op, y)).to(dtype)  # (B, C, H, W)
        m = dispersed_last(op, op.mask).to(dtype)  # (Bm, 1|C, H, W)
        size = h.shape[-2:]
        h, m = _pad_to(h, 2 ** self.stage), _pad_to(m, 2 ** self.stage)
        hp, wp = h.shape[-2:]
        phi = _phi(m, offsets, op.delta, self.bands)
        widths, mask_widths = [wp], [wp + op.delta]
        for _ in range(self.stage):
            widths.append(widths[-1] // 2)
            mask_widths.append(mask_widths[-1] // 2)
        idx = self._indices(offsets, widths, mask_widths, h.device)
        out = _to_nchw(self.net(_nhwc(h), phi, idx, self.checkpointing), size)
        return undo(op, out).to(y.dtype)


@register
class MSTReal(ToolboxModel):
    """MST of the toolbox's real-data code (``real/train_code``; ``mst_s_real`` / ``mst_m_real`` /
    ``mst_l_real``): no mask input and no mask guidance; x₀ = conv3×3(y shifted back per band, unscaled), then
    the MST U-Net (with x₀ as its residual). y is taken as given, as the toolbox's real code feeds it (the
    measurement scaled to its training range: it trains on y·2.4/28 and tests on y·0.8/max y); with ``peak``
    each measurement is first scaled to that maximum (0.8: its test code). (B, 1, H, W+Δ) -> (B, C, H, W).

    Any band count, frame size (reflect-padded to a multiple of 2^stage), offsets (fractional too: the shift
    back interpolates), dispersion along h (the transposed problem), batches of masks (unused), bf16
    autocast, ``checkpointing``."""

    def __init__(self, bands: int = 28, dim: int = 28, stage: int = 2, num_blocks: Sequence[int] = (2, 2, 2),
                 peak: float | None = None, checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        _check_positive(bands=bands, dim=dim, stage=stage)
        if peak is not None and not peak > 0:
            raise ValueError(f"peak must be > 0 or None, got {peak!r}")
        self.bands, self.stage, self.peak, self.checkpointing = bands, stage, peak, bool(checkpointing)
        self.fusion = nn.Conv2d(bands, bands, 3, 1, 1, bias=False)
        self.net = _UNet(bands, dim, stage, list(num_blocks), guided=False, lrelu=True)

    def limits(self, op) -> None:
        _frame_limits(op, 2 ** self.stage, "MST")

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        h = _real_input(op, y, self.peak, _param_dtype(self))
        size = h.shape[-2:]
        h = _pad_to(h, 2 ** self.stage)
        x0 = _conv(_nhwc(h), self.fusion.weight, padding=1)
        return undo(op, _to_nchw(self.net(x0, checkpointing=self.checkpointing), size)).to(y.dtype)


def _real_input(op, y: torch.Tensor, peak: float | None, dtype) -> torch.Tensor:
    """The real-data models' input: y (scaled to maximum ``peak`` per sample when set) shifted back, unscaled,
    with the dispersed axis last."""
    if peak is not None:
        y = y * (peak / y.detach().amax(dim=(1, 2, 3), keepdim=True).clamp_min(torch.finfo(y.dtype).tiny))
    return dispersed_last(op, shift_back(op, y, scale=False)).to(dtype)


class _PlusPlus(ToolboxModel):
    """Shared by MST++ and its real-data variant: x₀ = fusion(input) (C channels), reflect-padded to a multiple
    of 8; x = conv_out(MST_1 ∘ … ∘ MST_K(conv_in x₀)) + conv_in x₀, cropped back."""

    def _build(self, bands: int, fuse_in: int, dim: int | None, stages: int, checkpointing: bool) -> None:
        dim = bands if dim is None else dim
        _check_positive(bands=bands, dim=dim, stages=stages)
        if dim != bands:
            raise ValueError(f"MST++ adds conv_in's {dim} channels to conv_out's {bands} bands: dim must equal "
                             f"bands ({bands}), got dim={dim}")
        self.bands, self.stages, self.checkpointing = bands, stages, bool(checkpointing)
        self.fusion = nn.Conv2d(fuse_in, bands, 1)
        self.conv_in = nn.Conv2d(bands, dim, 3, padding=1, bias=False)
        self.body = nn.ModuleList(_UNet(dim, dim, 2, [1, 1, 1], guided=False, lrelu=False) for _ in range(stages))
        self.conv_out = nn.Conv2d(dim, bands, 3, padding=1, bias=False)

    def limits(self, op) -> None:
        _frame_limits(op, 8, "MST++")

    def _run(self, x0: torch.Tensor) -> torch.Tensor:
        """x0 (B, H, W, C) after the fusion -> (B, C, H, W)."""
        size = x0.shape[1:3]
        x0 = _pad_to(x0.permute(0, 3, 1, 2), 8)
        x = _conv(_nhwc(x0), self.conv_in.weight, padding=1)
        t = x
        for net in self.body:
            t = net(t, checkpointing=self.checkpointing)
        return _to_nchw(_conv(t, self.conv_out.weight, padding=1).add_(x), size)


@register
class MSTPlusPlus(_PlusPlus):
    """MST++ (toolbox ``mst_plus_plus``: 3 MSTs of stage 2, one block per level, no mask guidance):
    x₀ = conv1×1([H, Mask]) (H = y·2/C shifted back, Mask the mask per band: the mask's only use), then
    ``stages`` MST U-Nets between conv_in and conv_out with a residual. (B, 1, H, W+Δ) -> (B, C, H, W).

    Any band count, frame size ≥ 8×8 (reflect-padded to a multiple of 8, as the toolbox does), offsets
    (fractional too), dispersion along h (the transposed problem), one mask per sample, bf16 autocast,
    ``checkpointing``."""

    def __init__(self, bands: int = 28, dim: int | None = None, stages: int = 3, checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        self._build(bands, 2 * bands, dim, stages, checkpointing)

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        dtype = _param_dtype(self)
        h = _nhwc(dispersed_last(op, shift_back(op, y)).to(dtype))
        m = dispersed_last(op, op.mask).to(dtype)
        c = self.bands
        w = self.fusion.weight.reshape(c, 2 * c)
        wm = w[:, c:] if m.shape[1] > 1 else w[:, c:].sum(1, keepdim=True)  # a 2-D mask: one channel suffices
        x0 = torch.addmm(self.fusion.bias, h.reshape(-1, c), w[:, :c].t()).view(h.shape)
        x0 = x0 + F.linear(_nhwc(m), wm)  # broadcasts a shared mask over the batch
        return undo(op, self._run(x0)).to(y.dtype)


@register
class MSTPlusPlusReal(_PlusPlus):
    """MST++ of the toolbox's real-data code (``mst_plus_plus_real``): x₀ = conv1×1(y shifted back, unscaled),
    no mask input; y as in :class:`MSTReal` (as given, or scaled to maximum ``peak``). (B, 1, H, W+Δ) ->
    (B, C, H, W). Any geometry (fractional offsets too), frame ≥ 8×8."""

    def __init__(self, bands: int = 28, dim: int | None = None, stages: int = 3, peak: float | None = None,
                 checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        if peak is not None and not peak > 0:
            raise ValueError(f"peak must be > 0 or None, got {peak!r}")
        self.peak = peak
        self._build(bands, bands, dim, stages, checkpointing)

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        h = _nhwc(_real_input(op, y, self.peak, _param_dtype(self)))
        x0 = _linear(h, self.fusion.weight, self.fusion.bias)
        return undo(op, self._run(x0)).to(y.dtype)


# ---------------------------------------------------------------------------------------------- toolbox names
_UNET_KEYS = [
    (r"encoder_layers\.(\d+)\.0\.", r"encoder.\1.stack."),
    (r"encoder_layers\.(\d+)\.1\.", r"encoder.\1.down."),
    (r"encoder_layers\.(\d+)\.2\.", r"encoder.\1.mask_down."),
    (r"decoder_layers\.(\d+)\.0\.", r"decoder.\1.up."),
    (r"decoder_layers\.(\d+)\.1\.", r"decoder.\1.fuse."),
    (r"decoder_layers\.(\d+)\.2\.", r"decoder.\1.stack."),
    (r"blocks\.(\d+)\.0\.", r"blocks.\1.attn."),
    (r"blocks\.(\d+)\.1\.norm\.", r"blocks.\1.ffn.norm."),
    (r"blocks\.(\d+)\.1\.fn\.net\.0\.", r"blocks.\1.ffn.expand."),
    (r"blocks\.(\d+)\.1\.fn\.net\.2\.", r"blocks.\1.ffn.depth."),
    (r"blocks\.(\d+)\.1\.fn\.net\.4\.", r"blocks.\1.ffn.reduce."),
    (r"\.pos_emb\.0\.", ".pos1."),
    (r"\.pos_emb\.2\.", ".pos2."),
    (r"\.mm\.depth_conv\.", ".guide.depth."),
    (r"\.mm\.", ".guide."),
]


def _unet_key(key: str) -> str:
    for pattern, repl in _UNET_KEYS:
        key = re.sub(pattern, repl, key)
    return key


def _mst_key(key: str) -> str:
    """A toolbox MST key -> this module's (the U-Net under ``net.``, the real variant's ``fution`` input conv)."""
    return "fusion." + key[len("fution."):] if key.startswith("fution.") else "net." + _unet_key(key)


def _plus_key(key: str) -> str:
    """A toolbox MST++ key -> this module's."""
    return "fusion." + key[len("fution."):] if key.startswith("fution.") else _unet_key(key)


for _name, _blocks in (("mst_s", (2, 2, 2)), ("mst_m", (2, 4, 4)), ("mst_l", (4, 7, 5))):
    register_method(_name, "MST", rename=_mst_key, bands=28, stage=2, num_blocks=list(_blocks))
    register_method(f"{_name}_real", "MSTReal", rename=_mst_key, bands=28, dim=28, stage=2,
                    num_blocks=list(_blocks))
register_method("mst_plus_plus", "MSTPlusPlus", rename=_plus_key, bands=28, stages=3)
register_method("mst_plus_plus_real", "MSTPlusPlusReal", rename=_plus_key, bands=28, stages=3)
