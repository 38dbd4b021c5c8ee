"""SSR (Zhang, Zeng, Chen, Yu, Zhao, CVPR 2024: "Improving Spectral Snapshot Reconstruction with Spectral-Spatial
Rectification"), weight-compatible with the authors' published checkpoints ``model_S.pkl`` / ``model_M.pkl`` /
``model_L.pkl`` (GitHub ZhangJC-2k/SSR, MIT licence): methods ``ssr_s``, ``ssr_m``, ``ssr_l`` (3, 6 and 9 stages,
the stage counts of the authors' Test_pretrain.py; width 28 throughout), converted with
``python scripts/convert_checkpoint.py source=ssr method=ssr_l weights=model_L.pkl out=ssr_l.ckpt``.

SSR works in the scene frame (B, C, H, W). From the operator it takes the 3-D mask Φ (unshifted, one map per
band), the mask placed at each band's offset Φ⃗ (B, C, H, W+Δ) and Φ_s = Σ_c Φ⃗_c² (zeros set to 1). The raw
measurement y is normalised inside for the first estimate only (y·2/C cut back under every band: f₀); the data
step uses the raw y. With K stages ("/" per sample):

    f = fuse([f₀, Φ])                                         a 1×1 conv of the stacked pair (no interleaving)
    stage k:  ρ = step_k(f)                                   a per-sample step (B, 1, 1, 1), no positivity
              z = f + ρ · Aᵀ((y − A f) ⊘ Φ_s)                 the data step (Aᵀ: cut back per band, × Φ)
              f = refine_k(prior_k(z, Φ))

and returns f after every stage (the last is the result; ``return_stages=True`` gives all K).

The prior (the authors' SSRU) is a three-scale U-Net, widths d, 2d, 4d (d = ``dim``), whose input is
embed(z) ⊙ (1 + embed_mask(Φ)) (two 3×3 convs), with one block per scale on the way down, at the bottom and on
the way up (4×4 stride-2 convs down; 2×2 transposed convs up, each followed by a 1×1 fusion with the skip), and
a 3×3 conv back to C plus z. A block (SSRB) is x + depthwise 5×5(x), then an attention unit and a rectification
unit:

- attention unit: x + W_o Σ_j softmax_j(q_i·k_j / √d) v_j over the *channels* i, j of each spatial window (the
  tokens are channels, their features the window's pixels; q, k, v one 1×1 conv of LN x), then
  x + FFN(GN x) (1×1 to 4×, GELU, depthwise 3×3, GELU, 1×1 back);
- rectification unit (ARB; also each stage's ``refine``, on C channels): x + W_o((dw11×11 W_a x̂) ⊙ W_v x̂) with
  x̂ = LN x, then x + W_o(σ(dw3×3 f) ⊙ GELU(conv3×3(f → 1))) with f = W(GN x).

LN normalises over the channels of each pixel, GN (GroupNorm with one group per channel) over the pixels of
each channel. The windows follow the authors' split: a side of s pixels is cut into s // window equal windows
(8 pixels wide where s is a multiple of 8). The frame is mirror-padded to a multiple of 2·window (the authors'
16), or of 4·window where the bottleneck's side would then not split into equal windows (where the authors' code
fails); so the prior equals the authors' wherever their code runs, and runs at any frame.

Beyond the authors' code (which fixes 28 bands, step 2, and the width it crops to): any band count (``bands``),
any width (``dim``), any frame size, any integer offsets (uneven too) and dispersion along h (the transposed
problem), batches of masks, bf16 autocast, activation checkpointing per stage. Not supported: fractional offsets
(Φ⃗ and the data step live on the dispersed frame's integer grid): refused with one line.
(B, 1, H, W+Δ) -> (B, C, H, W).
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi._checks import check_positive_int
from cassi.models.unrolled import _config
from cassi.models.zoo.dauhst import _reflect_pad
from cassi.models.zoo.dpu import _cut_back, _place, _swap_prefix, _trunc_normal
from cassi.models.zoo.toolbox import (ToolboxModel, dispersed_last, integer_offsets, mask3d, phi_s, register_method,
                                      shifted_mask, undo)
from cassi.registry import register

__all__ = ["SSR", "authors_key", "prior_side"]


# ---------------------------------------------------------------------------------------------- helpers
def prior_side(n: int, window: int = 8) -> int:
    """The side (≥ n) the prior runs at: n rounded up to a multiple of 2·window (the authors' padding), or of
    4·window where the bottleneck's side (a quarter) would not split into equal windows of about ``window``."""
    side = -(-n // (2 * window)) * 2 * window
    q = side // 4
    if q // window == 0 or q % (q // window):
        side = -(-n // (4 * window)) * 4 * window
    return side


def _channel_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the channels of each pixel: (B, c, H, W) -> (B, c, H, W)."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _init_convs(module: nn.Module, bias: bool = True) -> None:
    """The authors' initialisation of their attention and rectification convs: weights N(0, 0.02²) truncated at
    ±2, biases 0 (``bias``)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            _trunc_normal(m.weight, 0.02)
            if bias and m.bias is not None:
                nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------------------- blocks
class _WindowChannelAttention(nn.Module):
    """Attention between the channels of each window (the authors' WSSA): (B, c, H, W) -> (B, c, H, W), each side
    s cut into s // window equal windows; per window, out_i = Σ_j softmax_j(q_i·k_j·scale) v_j with q_i, k_j, v_j
    the window's pixels of channel i / j of one 1×1 conv (no bias), then a 1×1 conv."""

    def __init__(self, dim: int, window: int, scale: float):
        super().__init__()
        self.window, self.scale = window, scale
        self.qkv = nn.Conv2d(dim, 3 * dim, 1, bias=False)
        self.proj = nn.Conv2d(dim, dim, 1)
        _init_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, c, H, W = x.shape
        nh, nw = H // self.window, W // self.window
        if not nh or not nw or H % nh or W % nw:
            raise ValueError(f"a {H}×{W} map does not split into equal windows of about {self.window}")
        wh, ww = H // nh, W // nw
        t = self.qkv(x).reshape(B, 3, c, nh, wh, nw, ww).permute(1, 0, 3, 5, 2, 4, 6)
        q, k, v = t.reshape(3, B, nh * nw, c, wh * ww).unbind(0)
        attn = torch.matmul(q * self.scale, k.transpose(-2, -1)).softmax(dim=-1)
        out = torch.matmul(attn, v).reshape(B, nh, nw, c, wh, ww).permute(0, 3, 1, 4, 2, 5).reshape(B, c, H, W)
        return self.proj(out)


class _ConvFFN(nn.Module):
    """(B, c, H, W) -> (B, c, H, W): 1×1 to ``mult``·c, GELU, depthwise 3×3, GELU, 1×1 back (no biases)."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.expand = nn.Conv2d(dim, dim * mult, 1, bias=False)
        self.dw = nn.Conv2d(dim * mult, dim * mult, 3, 1, 1, groups=dim * mult, bias=False)
        self.project = nn.Conv2d(dim * mult, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(F.gelu(self.dw(F.gelu(self.expand(x)))))


class _Modulation(nn.Module):
    """(B, c, H, W) -> (B, c, H, W): W_o((dw11×11 W_a x) ⊙ W_v x) (the authors' CMB; 1×1 convs, W_o with bias)."""

    def __init__(self, dim: int):
        super().__init__()
        self.a = nn.Conv2d(dim, dim, 1, bias=False)
        self.a_dw = nn.Conv2d(dim, dim, 11, 1, 5, groups=dim, bias=False)
        self.v = nn.Conv2d(dim, dim, 1, bias=False)
        self.proj = nn.Conv2d(dim, dim, 1)
        _init_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.a_dw(self.a(x)) * self.v(x))


class _SpatialGate(nn.Module):
    """(B, c, H, W) -> (B, c, H, W): f = W x; W_o(σ(dw3×3 f) ⊙ GELU(conv3×3 f → 1 channel)) (their SAB)."""

    def __init__(self, dim: int):
        super().__init__()
        self.inp = nn.Conv2d(dim, dim, 1, bias=False)
        self.score = nn.Conv2d(dim, 1, 3, 1, 1, bias=False)
        self.dw = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim, bias=False)
        self.proj = nn.Conv2d(dim, dim, 1)
        _init_convs(self, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.inp(x)
        return self.proj(torch.sigmoid(self.dw(f)) * F.gelu(self.score(f)))


class _Rectify(nn.Module):
    """The rectification unit (the authors' ARB): x + modulation(LN x), then x + gate(GN x). (B, c, H, W)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mod = _Modulation(dim)
        self.norm2 = nn.GroupNorm(dim, dim)
        self.gate = _SpatialGate(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mod(_channel_norm(self.norm1, x)) + x
        return self.gate(self.norm2(x)) + x


class _Block(nn.Module):
    """The prior's block (the authors' SSRB) on (B, c, H, W): x + depthwise 5×5(x); x + attention(LN x);
    x + FFN(GN x); the rectification unit."""

    def __init__(self, dim: int, window: int, scale: float):
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _WindowChannelAttention(dim, window, scale)
        self.norm2 = nn.GroupNorm(dim, dim)
        self.ffn = _ConvFFN(dim)
        self.rect = _Rectify(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pos(x) + x
        x = self.attn(_channel_norm(self.norm1, x)) + x
        x = self.ffn(self.norm2(x)) + x
        return self.rect(x)


class _Prior(nn.Module):
    """SSR's image prior (the authors' SSRU): z (B, C, H, W) and the mask Φ (1|B, C, H, W) -> (B, C, H, W); both
    mirror-padded to :func:`prior_side` (module docstring)."""

    def __init__(self, bands: int, dim: int, window: int):
        super().__init__()
        self.window = window
        d1, d2, d3 = dim, 2 * dim, 4 * dim
        scale = dim ** -0.5
        self.embed = nn.Conv2d(bands, d1, 3, 1, 1, bias=False)
        self.embed_mask = nn.Conv2d(bands, d1, 3, 1, 1, bias=False)
        self.enc1 = _Block(d1, window, scale)
        self.down1 = nn.Conv2d(d1, d2, 4, 2, 1, bias=False)
        self.enc2 = _Block(d2, window, scale)
        self.down2 = nn.Conv2d(d2, d3, 4, 2, 1, bias=False)
        self.mid = _Block(d3, window, scale)
        self.up2 = nn.ConvTranspose2d(d3, d2, 2, 2)
        self.fuse2 = nn.Conv2d(d3, d2, 1, bias=False)
        self.dec2 = _Block(d2, window, scale)
        self.up1 = nn.ConvTranspose2d(d2, d1, 2, 2)
        self.fuse1 = nn.Conv2d(d2, d1, 1, bias=False)
        self.dec1 = _Block(d1, window, scale)
        self.mapping = nn.Conv2d(d1, bands, 3, 1, 1, bias=False)

    def forward(self, z: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        H, W = z.shape[-2:]
        ph, pw = prior_side(H, self.window) - H, prior_side(W, self.window) - W
        z, phi = _reflect_pad(z, ph, pw), _reflect_pad(phi, ph, pw)
        x1 = self.enc1(self.embed(z) * (1 + self.embed_mask(phi)))
        x2 = self.enc2(self.down1(x1))
        x = self.mid(self.down2(x2))
        x = self.dec2(self.fuse2(torch.cat([self.up2(x), x2], dim=1)))
        x = self.dec1(self.fuse1(torch.cat([self.up1(x), x1], dim=1)))
        return (self.mapping(x) + z)[..., :H, :W]


class _StepSize(nn.Module):
    """ρ per sample (the authors' Para_Estimator): 1×1 to ``width``, ReLU, global mean, 1×1, ReLU, 1×1, ReLU,
    1×1 to 1 (no bias), + a learned offset. (B, C, H, W) -> (B, 1, 1, 1)."""

    def __init__(self, bands: int, width: int = 32):
        super().__init__()
        self.inp = nn.Conv2d(bands, width, 1)
        self.offset = nn.Parameter(torch.ones(1))
        self.mlp = nn.Sequential(nn.Conv2d(width, width, 1), nn.ReLU(inplace=True), nn.Conv2d(width, width, 1),
                                 nn.ReLU(inplace=True), nn.Conv2d(width, 1, 1, bias=False))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.mlp(F.adaptive_avg_pool2d(F.relu(self.inp(f)), 1)) + self.offset


class _Stage(nn.Module):
    """One stage's modules (the authors' ``rhos[k]``, ``net_stage[2k]``, ``net_stage[2k+1]``); :meth:`SSR._stage`
    runs them."""

    def __init__(self, bands: int, dim: int, window: int):
        super().__init__()
        self.step = _StepSize(bands)
        self.prior = _Prior(bands, dim, window)
        self.refine = _Rectify(bands)


@register
class SSR(ToolboxModel):
    """SSR (the authors' ``Net``; methods ``ssr_s``, ``ssr_m``, ``ssr_l``: 3, 6, 9 stages): K stages of step
    estimation, data step, U-shaped prior and rectification (module docstring). ``model(op, y) -> x`` (B, C, H, W)
    from the raw y (B, 1, H, W+Δ); ``return_stages=True`` gives the K stage outputs (the authors' list; the last
    is x).

    Args:
        bands: C. stages: K. dim: the prior's first-scale width (the authors': 28; the attention scales its scores
        by 1/√dim at every scale, as theirs does). window: attention window (8). checkpointing: recompute each
        stage's activations in backward.

    Any band count, frame, integer offsets, dispersion axis, batch of masks; refuses fractional offsets."""

    def __init__(self, bands: int = 28, stages: int = 9, dim: int = 28, window: int = 8,
                 checkpointing: bool = False):
        super().__init__()
        self.bands, self.stages = check_positive_int("bands", bands), check_positive_int("stages", stages)
        check_positive_int("dim", dim)
        check_positive_int("window", window)
        self.checkpointing = bool(checkpointing)
        self.config = _config(self, dict(locals()))
        self.fuse = nn.Conv2d(2 * bands, bands, 1)
        self.layers = nn.ModuleList(_Stage(bands, dim, window) for _ in range(stages))

    def limits(self, op) -> None:
        integer_offsets(op, f"this {type(self).__name__}")

    def _stage(self, k: int, f, y, phi, shifted, phis, offs, delta):
        """Stage k: f -> the next f (module docstring)."""
        s = self.layers[k]
        rho = s.step(f)
        af = (shifted * _place(f, offs, delta)).sum(dim=1, keepdim=True)
        z = f + rho * (_cut_back(torch.div(y - af, phis), offs, f.shape[-1]) * phi)
        return s.refine(s.prior(z, phi)).to(y.dtype)

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` the K stage outputs. ``gt`` is ignored."""
        offs, C = integer_offsets(op), self.bands
        yd = dispersed_last(op, y)
        n = yd.shape[-1] - op.delta
        phi = dispersed_last(op, mask3d(op)).to(y.dtype)  # (1|B, C, H, W)
        shifted = dispersed_last(op, shifted_mask(op)).to(y.dtype)  # (1|B, C, H, W')
        phis = dispersed_last(op, phi_s(op)).to(y.dtype)  # (1|B, 1, H, W')
        f0 = _cut_back(yd / C * 2, offs, n)
        f = self.fuse(torch.cat([f0, phi.expand(f0.shape[0], -1, -1, -1)], dim=1))
        outs = []
        for k in range(self.stages):
            args = (k, f, yd, phi, shifted, phis, offs, op.delta)
            if self.checkpointing and torch.is_grad_enabled():
                f = checkpoint(self._stage, *args, use_reentrant=False)
            else:
                f = self._stage(*args)
            outs.append(undo(op, f))
        return outs if return_stages else outs[-1]


# ---------------------------------------------------------------------------------------------- the authors' names
_RECTIFY = {"CMB.norm": "norm1", "CMB.fn.to_a.0": "mod.a", "CMB.fn.to_a.1": "mod.a_dw", "CMB.fn.to_v": "mod.v",
            "CMB.fn.to_out": "mod.proj", "SAB.norm": "norm2", "SAB.fn.conv": "gate.inp",
            "SAB.fn.Estimator.0": "gate.score", "SAB.fn.SW.0": "gate.dw", "SAB.fn.out": "gate.proj"}
_BLOCK = {"pos": "pos", "SARB.WSSA.norm": "norm1", "SARB.WSSA.fn.to_qkv": "attn.qkv",
          "SARB.WSSA.fn.to_out": "attn.proj", "SARB.FFN.norm": "norm2", "SARB.FFN.fn.net.0": "ffn.expand",
          "SARB.FFN.fn.net.2": "ffn.dw", "SARB.FFN.fn.net.4": "ffn.project",
          **{f"SRB.{k}": f"rect.{v}" for k, v in _RECTIFY.items()}}
_PRIOR = {"mask_embedding.cnn": "embed", "mask_embedding.mask": "embed_mask", "down1": "enc1",
          "downsample1": "down1", "down2": "enc2", "downsample2": "down2", "bottleneck": "mid", "upsample2": "up2",
          "fusion2": "fuse2", "up2": "dec2", "upsample1": "up1", "fusion1": "fuse1", "up1": "dec1", "out": "mapping"}
_BLOCKS = {"enc1", "enc2", "mid", "dec2", "dec1"}
_STEP = {"fusion": "inp", "bias": "offset", "mlp": "mlp"}


def authors_key(key: str) -> str:
    """The cassi name of a key of the authors' SSR state dict (``net_stage.{2k}`` / ``{2k+1}``: stage k's prior
    (SSRU) and its rectification unit (ARB); ``rhos.{k}``: its step; ``initial``: the first fusion); keys it does
    not know are returned as they are (and then reported by the loader)."""
    m = re.fullmatch(r"net_stage\.(\d+)\.(.+)", key)
    if m:
        k, part = divmod(int(m.group(1)), 2)
        rest = m.group(2)
        if part:
            return f"layers.{k}.refine.{_swap_prefix(rest, _RECTIFY)}"
        rest = _swap_prefix(rest, _PRIOR)
        head, _, tail = rest.partition(".")
        if head in _BLOCKS and tail:
            rest = f"{head}.{_swap_prefix(tail, _BLOCK)}"
        return f"layers.{k}.prior.{rest}"
    m = re.fullmatch(r"rhos\.(\d+)\.(.+)", key)
    if m:
        return f"layers.{m.group(1)}.step.{_swap_prefix(m.group(2), _STEP)}"
    return _swap_prefix(key, {"initial": "fuse"})


for _name, _k in (("s", 3), ("m", 6), ("l", 9)):
    register_method(f"ssr_{_name}", "SSR", rename=authors_key, source="ssr", stages=_k)
