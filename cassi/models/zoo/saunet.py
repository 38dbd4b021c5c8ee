"""SAUNet (Wang, Wang, Liu, Zheng, Wang, ACM MM 2023: "A Simple Adaptive Unfolding Network for Hyperspectral Image
Reconstruction"), weight-compatible with the authors' released checkpoints ``{K}stg_model_epoch_*.pth`` (GitHub
hustvl/SAUNet, weights in the releases of hustvl/Storage, MIT licence): methods ``saunet_1stg``, ``saunet_2stg``,
``saunet_3stg``, ``saunet_5stg``, ``saunet_9stg``, ``saunet_13stg``, converted with
``python scripts/convert_checkpoint.py source=saunet method=saunet_3stg weights=3stg_model_epoch_281.pth
out=saunet_3stg.ckpt`` (a plain state dict, ``module.`` prefixes accepted).

SAUNet works on the whole dispersed canvas (B, C, H, W+Δ), not on the scene frame. From the operator it takes the
mask placed at each band's offset Φ⃗ (1|B, C, H, W+Δ) and Φ_s = Σ_c Φ⃗_c² (zeros set to 1); the raw y (B, 1, H,
W+Δ) is scaled by 2/C and kept on each band's footprint (columns d_c … d_c+W−1, zero elsewhere): y₀. Then (the
unfolding of the paper; R_{±d} rolls band c by ±d_c columns with wrap-around, as the authors' ``torch.roll``):

    z = fuse([y₀, Φ⃗]);  (α_1…α_K, β_1…β_K) = estimator(z)      per-sample scalars, pooled over the canvas
    b = 0
    stage k:  v = z + b
              x = v + Φ⃗ ⊙ ((y − Σ_c Φ⃗_c ⊙ v_c) ⊘ (α_k + Φ_s))     the data step, on the canvas
              z = prior_k([R_{−d}(x − b), β_k])                  on the whole back-rolled canvas
              (k < K)  z = R_{+d}(z);  b = b − γ_k (x − z)
    x̂ = z[..., :W]

The prior (the authors' CMFormer) mirror-pads its (C+1)-channel canvas to a multiple of 16 (256×310 -> 256×320
at the authors' geometry), then a 3×3 conv to ``dim``, a two-level U-Net of "CAB" blocks (``blocks`` = (1, 1, 3):
per encoder level, the bottleneck last; 4×4 stride-2 convs down, 2×2 transposed convs up, 1×1 fusion with the
skip), a 3×3 conv to C plus the padded input's first C channels, cropped back. A CAB on (B, d, H, W), with n(·)
a LayerNorm over channels (ε 1e-6):

    x = x + proj(dw_7×7(GELU(a(n(x)))) ⊙ v(n(x)));  x = x + out(GELU(dw_3×3(GELU(in(n(x))))))   (in: d -> 4d)

each residual branch under stochastic depth (``drop`` in the encoder and decoder, ``drop_bottleneck`` in the
bottleneck; linearly from 0 over a level's blocks when it has several) while training. The estimator (the
authors' HyPaNet): 1×1 to 64, ReLU, 3×3 stride 2, global mean over the canvas, 1×1, ReLU, 1×1, ReLU, 1×1 to 2K,
softplus, + 1e-6.

Beyond the authors' code (28 bands, step 2, square frames: it crops the result to as many columns as the frame
has rows; single reflection, so frames and canvases of at least 9 pixels or multiples of 16): any band count,
any frame size (a pad wider than the canvas reflects again), any integer offsets (uneven too; the canvas is W+Δ
wide) and dispersion along h (the transposed problem), non-square frames (cropped to W), batches of masks, bf16
autocast, activation checkpointing per stage. Not supported: fractional offsets (the canvas and its rolls live
on the integer grid): refused with one line. (B, 1, H, W+Δ) -> (B, C, H, W).
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
from cassi.models.zoo.dauhst import _reflect_pad
from cassi.models.zoo.toolbox import (ToolboxModel, dispersed_last, integer_offsets, phi_s, register_method,
                                      roll_bands, shifted_mask, undo)
from cassi.registry import register

__all__ = ["SAUNet", "authors_key", "DROP_RATES"]

#: the authors' stochastic-depth rates (encoder/decoder, bottleneck) per stage count (their ``param_setting``)
DROP_RATES = {1: (0.0, 0.0), 2: (0.1, 0.1), 3: (0.1, 0.2), 5: (0.1, 0.2), 9: (0.0, 0.3), 13: (0.1, 0.2)}


def _drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: x zeroed per sample with probability p, else scaled by 1/(1−p) (identity in eval)."""
    if p <= 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - p)
    return x * keep.div_(1.0 - p)


class _ChannelNorm(nn.Module):
    """LayerNorm over the channels of (B, d, H, W): (x − mean) / √(var + ε) · w + b, per pixel."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


class _Block(nn.Module):
    """The prior's block (the authors' CAB) on (B, dim, H, W): a convolutional modulation, then a depthwise
    feed-forward, each pre-normalised and residual (module docstring). -> (B, dim, H, W)."""

    def __init__(self, dim: int, kernel: int = 7, ffn_kernel: int = 3, ratio: float = 4, drop: float = 0.0):
        super().__init__()
        hidden = int(round(dim * ratio))
        self.drop = float(drop)
        self.norm1 = _ChannelNorm(dim)
        self.mod_in = nn.Conv2d(dim, dim, 1)
        self.mod_dw = nn.Conv2d(dim, dim, kernel, padding=(kernel - 1) // 2, groups=dim)
        self.value = nn.Conv2d(dim, dim, 1)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.norm2 = _ChannelNorm(dim)
        self.ffn_in = nn.Conv2d(dim, hidden, 1, bias=False)
        self.ffn_dw = nn.Conv2d(hidden, hidden, ffn_kernel, padding=(ffn_kernel - 1) // 2, groups=hidden, bias=False)
        self.ffn_out = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm1(x)
        m = self.proj(self.mod_dw(F.gelu(self.mod_in(n))) * self.value(n))
        x = x + _drop_path(m, self.drop, self.training)
        h = self.ffn_out(F.gelu(self.ffn_dw(F.gelu(self.ffn_in(self.norm2(x))))))
        return x + _drop_path(h, self.drop, self.training)


def _rates(p: float, n: int) -> list[float]:
    """The stochastic-depth rate of each of n blocks of a level: p for one block, else 0 … p (the authors')."""
    return [float(p)] if n == 1 else torch.linspace(0, p, n).tolist()


class _Prior(nn.Module):
    """SAUNet's prior (the authors' CMFormer): (B, C+1, H, W') -> (B, C, H, W'), the U-Net of the module
    docstring on the canvas mirror-padded to a multiple of 16 (cropped back)."""

    multiple = 16  # the authors' padding (more than the U-Net's two levels need: it changes the border's values)

    def __init__(self, bands: int, dim: int, blocks: Sequence[int], kernel: int, ffn_kernel: int, ratio: float,
                 drop: float, drop_bottleneck: float):
        super().__init__()
        self.bands = bands
        levels = len(blocks) - 1

        def level(d, n, p):
            return nn.Sequential(*(_Block(d, kernel, ffn_kernel, ratio, r) for r in _rates(p, n)))

        self.embed = nn.Conv2d(bands + 1, dim, 3, 1, 1, bias=False)
        self.encoders, self.downs = nn.ModuleList(), nn.ModuleList()
        d = dim
        for i in range(levels):
            self.encoders.append(level(d, blocks[i], drop))
            self.downs.append(nn.Conv2d(d, 2 * d, 4, 2, 1, bias=False))
            d *= 2
        self.mid = level(d, blocks[-1], drop_bottleneck)
        self.ups, self.fuses, self.decoders = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for i in range(levels):
            self.ups.append(nn.ConvTranspose2d(d, d // 2, 2, 2))
            self.fuses.append(nn.Conv2d(d, d // 2, 1, bias=False))
            self.decoders.append(level(d // 2, blocks[levels - 1 - i], drop))
            d //= 2
        self.out = nn.Conv2d(dim, bands, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = x.shape[-2:]
        x = _reflect_pad(x, -H % self.multiple, -W % self.multiple)
        if x.device.type == "cpu":  # oneDNN's convolutions and the channel norm: faster in NHWC
            x = x.contiguous(memory_format=torch.channels_last)
        f, skips = self.embed(x), []
        for enc, down in zip(self.encoders, self.downs):
            f = enc(f)
            skips.append(f)
            f = down(f)
        f = self.mid(f)
        for up, fuse, dec, skip in zip(self.ups, self.fuses, self.decoders, reversed(skips)):
            f = dec(fuse(torch.cat([up(f), skip], dim=1)))
        return (self.out(f) + x[:, :self.bands])[..., :H, :W]


class _Estimator(nn.Module):
    """The per-sample stage parameters (the authors' HyPaNet): (B, C, H, W') -> (B, n, 1, 1), all > 0."""

    def __init__(self, bands: int, n: int, width: int = 64):
        super().__init__()
        self.inp = nn.Conv2d(bands, width, 1)
        self.down = nn.Conv2d(width, width, 3, 2, 1)
        self.mlp = nn.Sequential(nn.Conv2d(width, width, 1), nn.ReLU(inplace=True), nn.Conv2d(width, width, 1),
                                 nn.ReLU(inplace=True), nn.Conv2d(width, n, 1), nn.Softplus())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.mlp(F.adaptive_avg_pool2d(self.down(F.relu(self.inp(z))), 1)) + 1e-6


@register
class SAUNet(ToolboxModel):
    """SAUNet (the authors' ``SAUNet``; methods ``saunet_{1,2,3,5,9,13}stg``): K stages of a data step on the
    dispersed canvas and a U-Net prior on the back-rolled canvas (module docstring). ``model(op, y) -> x``
    (B, C, H, W) from the raw y (B, 1, H, W+Δ); ``return_stages=True`` gives every stage's prior output cropped to
    the frame (the last is x).

    Args:
        bands: C. stages: K. dim: the prior's first-level width (28). blocks: CABs per encoder level and in the
        bottleneck ((1, 1, 3)). kernel: the modulation's depthwise kernel (7). ffn_kernel: the feed-forward's
        depthwise kernel (3). ffn_ratio: its expansion (4). drop, drop_bottleneck: stochastic-depth rates
        (the published methods: :data:`DROP_RATES`). estimator_width: the estimator's channels (64).
        checkpointing: recompute each stage's activations in backward.

    Any band count, frame, integer offsets, dispersion axis, batch of masks; refuses fractional offsets."""

    def __init__(self, bands: int = 28, stages: int = 3, dim: int = 28, blocks: Sequence[int] = (1, 1, 3),
                 kernel: int = 7, ffn_kernel: int = 3, ffn_ratio: float = 4, drop: float = 0.0,
                 drop_bottleneck: float = 0.0, estimator_width: int = 64, checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        self.bands, self.stages = check_positive_int("bands", bands), check_positive_int("stages", stages)
        for name, v in (("dim", dim), ("kernel", kernel), ("ffn_kernel", ffn_kernel),
                        ("estimator_width", estimator_width)):
            check_positive_int(name, v)
        blocks = [check_positive_int("blocks", b) for b in blocks]
        if not blocks:
            raise ValueError("blocks needs at least one entry (the bottleneck's)")
        self.checkpointing = bool(checkpointing)
        self.fuse = nn.Conv2d(2 * bands, bands, 1)
        self.estimator = _Estimator(bands, 2 * stages, estimator_width)
        self.relax = nn.ParameterList(nn.Parameter(torch.tensor(0.0)) for _ in range(stages - 1))
        self.priors = nn.ModuleList(_Prior(bands, dim, blocks, kernel, ffn_kernel, ffn_ratio, drop, drop_bottleneck)
                                    for _ in range(stages))

    def limits(self, op) -> None:
        integer_offsets(op, f"this {type(self).__name__}")

    def _stage(self, k: int, z, b, y, phi, phis, alpha, beta, offs):
        """Stage k on the canvas: (z, b) -> (the prior's back-rolled output, the next z, the next b); b None: 0."""
        v = z if b is None else z + b
        x = v + torch.div(y - (v * phi).sum(dim=1, keepdim=True), alpha + phis) * phi
        back = roll_bands(x if b is None else x - b, offs, -1)
        out = self.priors[k](torch.cat([back, beta.expand(back.shape[0], 1, *back.shape[2:])], dim=1))
        if k == self.stages - 1:
            return out, None, None
        z = roll_bands(out, offs, 1)
        step = self.relax[k] * (x - z)
        return out, z, -step if b is None else b - step

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` the K stages' outputs. ``gt`` is
        ignored."""
        offs, C, K = integer_offsets(op), self.bands, self.stages
        yd = dispersed_last(op, y)
        B, wide = yd.shape[0], yd.shape[-1]
        n = wide - op.delta
        phi = dispersed_last(op, shifted_mask(op)).to(y.dtype)  # (1|B, C, H, W')
        phis = dispersed_last(op, phi_s(op)).to(y.dtype)  # (1|B, 1, H, W')
        cols = torch.arange(wide, device=y.device)
        start = torch.tensor(offs, device=y.device)[:, None]
        footprint = ((cols >= start) & (cols < start + n)).to(y.dtype)[None, :, None, :]  # (1, C, 1, W')
        y0 = yd / C * 2 * footprint
        z = self.fuse(torch.cat([y0, phi.expand(B, -1, -1, -1)], dim=1))
        params = self.estimator(z)  # (B, 2K, 1, 1): α_1…α_K, β_1…β_K
        b, outs = None, []
        for k in range(K):
            args = (k, z, b, yd, phi, phis, params[:, k:k + 1], params[:, K + k:K + k + 1], offs)
            if self.checkpointing and torch.is_grad_enabled():
                out, z, b = checkpoint(self._stage, *args, use_reentrant=False)
            else:
                out, z, b = self._stage(*args)
            outs.append(undo(op, out[..., :n].to(y.dtype)))
        return outs if return_stages else outs[-1]


# ---------------------------------------------------------------------------------------------- the authors' names
_BLOCK = {"attn.norm": "norm1", "attn.a.0": "mod_in", "attn.a.2": "mod_dw", "attn.v": "value", "attn.proj": "proj",
          "dwffn.norm": "norm2", "dwffn.fn.fc.0": "ffn_in", "dwffn.fn.dwconv.0": "ffn_dw", "dwffn.fn.ffn": "ffn_out"}
_PRIOR = [(r"embedding\.0\.(.+)", "embed.{0}"),
          (r"encoder_layers\.(\d+)\.0\.blocks\.(\d+)\.(.+)", "encoders.{0}.{1}.{2}"),
          (r"encoder_layers\.(\d+)\.1\.(.+)", "downs.{0}.{1}"),
          (r"bottleneck\.blocks\.(\d+)\.(.+)", "mid.{0}.{1}"),
          (r"decoder_layers\.(\d+)\.0\.(.+)", "ups.{0}.{1}"),
          (r"decoder_layers\.(\d+)\.1\.(.+)", "fuses.{0}.{1}"),
          (r"decoder_layers\.(\d+)\.2\.blocks\.(\d+)\.(.+)", "decoders.{0}.{1}.{2}"),
          (r"mapping\.0\.(.+)", "out.{0}")]
_TOP = [(r"para_estimator\.fution\.(.+)", "estimator.inp.{0}"),
        (r"para_estimator\.down_sample\.(.+)", "estimator.down.{0}"),
        (r"para_estimator\.mlp\.(.+)", "estimator.mlp.{0}"),
        (r"fution\.(.+)", "fuse.{0}"),
        (r"gamma\.(\d+)", "relax.{0}")]


def _block_key(rest: str) -> str:
    for old, new in _BLOCK.items():
        if rest.startswith(old + "."):
            return new + rest[len(old):]
    return rest


def authors_key(key: str) -> str:
    """The cassi name of a key of the authors' SAUNet state dict (``denoisers.{k}``: stage k's prior;
    ``para_estimator``: the estimator; ``fution``: the first fusion; ``gamma.{k}``: γ); keys it does not know
    are returned as they are (and then reported by the loader)."""
    m = re.fullmatch(r"denoisers\.(\d+)\.(.+)", key)
    if m:
        for pattern, target in _PRIOR:
            p = re.fullmatch(pattern, m.group(2))
            if p:
                parts = list(p.groups())
                if "blocks" in pattern:
                    parts[-1] = _block_key(parts[-1])
                return f"priors.{m.group(1)}." + target.format(*parts)
        return key
    for pattern, target in _TOP:
        p = re.fullmatch(pattern, key)
        if p:
            return target.format(*p.groups())
    return key


for _k, (_drop, _mid) in DROP_RATES.items():
    register_method(f"saunet_{_k}stg", "SAUNet", rename=authors_key, source="saunet", stages=_k, drop=_drop,
                    drop_bottleneck=_mid)
