"""DPU (Zhang, Zeng, Cao, Chen, Yu, Zhao, CVPR 2024: "Dual Prior Unfolding for Snapshot Compressive Imaging"),
weight-compatible with the authors' published checkpoints ``model_5stg.pkl`` / ``model_9stg.pkl`` (GitHub
ZhangJC-2k/DPU, MIT licence): methods ``dpu_5stg`` and ``dpu_9stg``, converted with
``python scripts/convert_checkpoint.py source=dpu method=dpu_9stg weights=model_9stg.pkl out=dpu_9stg.ckpt``.

DPU works in the scene frame (B, C, H, W). From the operator it takes the 3-D mask Φ (unshifted, one map per
band), the mask placed at each band's offset Φ⃗ (B, C, H, W+Δ), Φ_s = Σ_c Φ⃗_c² (zeros set to 1; summed here
as the authors sum it, not taken from the operator), and the "compressed mask" P: Σ_c Φ⃗_c·2/C cut back under
every band. The raw measurement y is normalised inside (y·2/C cut back under every band: f₀). Then, with the dual
variable u₀ = 0 and r₀ = 0 (the ADMM-like unfolding of the paper, "/" per sample):

    f = fuse([f₀, Φ]);  z_prev = f
    stage k:  μ = step_k(f)                                  a per-sample step (B, 1, 1, 1)
              z = image_k(f + u/μ + r, f)                    the image prior (a U-shaped transformer)
              r = degradation_k([z_prev − u/μ − f, f], [Φ, P])
              v = z − r − u/μ
              f = v + Aᵀ((y − A v) ⊘ (μ + Φ_s))              the data step, on the raw y
              f = fusion_k(f, z − r);  z_prev = z;  u = u + μ (f − z + r)

and returns f after every stage (the last is the result; ``return_stages=True`` gives all K). Every two-input
module (image prior, fusion) interleaves the channels of its two inputs (a₀, b₀, a₁, b₁, …) before its first
convolution, and adds a per-band mix of each pair (``pair``, initialised to take a_c).

The image prior is a three-scale U-Net of "FAB" blocks: x + depthwise 5×5(x), then pre-norm window attention and
a grouped MLP. Its attention (8×8 windows, half-window cyclic shift in the shifted blocks) uses one q/k head of
``dim`` channels for all value heads; the scores s = q kᵀ are multiplied by a gate g_q g_kᵀ (g = a linear map
of q or k plus a learned offset), and the softmax is kept only where s·g > θ, a threshold per window predicted
from the scores without their diagonal by two small linear maps (``sim > θ`` as a hard 0/1 mask, with no
renormalisation; the threshold's two maps get no gradient through the comparison, so training leaves them as
initialised, in the authors' code too). Because that mask is discontinuous, every operation up to it follows the
authors' order and precision, the inputs derived from the mask included: the same ops on the same layouts, so
that float32 on the CPU gives their values bit for bit (in any other precision, e.g. bf16 autocast, both compare
in that precision alike).

Beyond the authors' code (which fixes 28 bands, step 2, and a frame that is a multiple of 32 after padding to 16):
any band count (``bands``), any width (``dim``, the q/k and per-head channels), any frame size (the image prior
mirror-pads to a multiple of 4·window, which is the authors' padding wherever their code runs), any integer
offsets (uneven too) and dispersion along h (the transposed problem), batches of masks, bf16 autocast,
activation checkpointing per stage. Not supported: fractional offsets (Φ⃗ and the data step live on the
dispersed frame's integer grid): refused with one line. (B, 1, H, W+Δ) -> (B, C, H, W).
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
from cassi.models.zoo.toolbox import (ToolboxModel, dispersed_last, integer_offsets, mask3d, register_method,
                                      roll_bands, shifted_mask, undo)
from cassi.registry import register

__all__ = ["DPU", "authors_key"]


# ---------------------------------------------------------------------------------------------- helpers
def _interleave(x: torch.Tensor) -> torch.Tensor:
    """[a, b] (B, 2N, H, W) with its halves' channels interleaved: a₀, b₀, a₁, b₁, …"""
    B, n2, H, W = x.shape
    return x.reshape(B, 2, n2 // 2, H, W).permute(0, 2, 1, 3, 4).reshape(B, n2, H, W)


def _cut_back(t: torch.Tensor, offs: list[int], n: int) -> torch.Tensor:
    """Band c of the (1 or C)-channel dispersed-frame map t, columns d_c … d_c + n − 1: (B, 1|C, H, W') ->
    (B, C, H, n) (the authors' roll back and crop)."""
    t = t.expand(t.shape[0], len(offs), *t.shape[2:])
    return roll_bands(t, offs, -1)[..., :n]


def _place(v: torch.Tensor, offs: list[int], delta: int) -> torch.Tensor:
    """Band c of v moved to columns d_c … d_c + W − 1 of a zero frame of width W + Δ (the authors' pad and
    roll): (B, C, H, W) -> (B, C, H, W + Δ)."""
    return roll_bands(F.pad(v, (0, delta)), offs, 1)


def _phi_s(shifted: torch.Tensor) -> torch.Tensor:
    """Φ_s = Σ_c Φ⃗_c² (1 where it is 0) of the placed mask (1|B, C, H, W') -> (1|B, 1, H, W'), summed over the
    bands in the mask's own precision, as the authors' data script sums it. The operator's Φ (summed in float64,
    :func:`~cassi.models.zoo.toolbox.phi_s`) differs from it in the last bit where the mask is not 0/1, and the
    attention's threshold turns such a bit into a visible change (1.4e-4 of the peak at the authors' test frame)."""
    s = shifted.square().sum(dim=1, keepdim=True)
    return torch.where(s == 0, torch.ones_like(s), s)


def _trunc_normal(t: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(t, std=std, a=-2.0, b=2.0)


def _pair_weight(bands: int) -> nn.Parameter:
    """The per-band mix of an interleaved pair (a_c, b_c), (C, 2, 1, 1), initialised to take a_c."""
    return nn.Parameter(torch.cat([torch.ones(bands, 1, 1, 1), torch.zeros(bands, 1, 1, 1)], dim=1))


def _pair_mix(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """w_c0·a_c + w_c1·b_c, (B, C, H, W) twice -> (B, C, H, W): the grouped 1×1 convolution of the interleaved
    pair, bit for bit (a product, then a fused multiply-add, as the convolution's GEMM sums), without its per-group
    loop."""
    w = weight.view(-1, 2, 1, 1)
    return torch.addcmul(a * w[:, 0], b, w[:, 1])


# ---------------------------------------------------------------------------------------------- image prior
class _Attention(nn.Module):
    """Thresholded window attention on normalised tokens (B, H, W, dim), H and W multiples of ``window``; one q/k
    head of ``qk_dim`` channels shared by dim/qk_dim value heads (module docstring). ``shifted``: the windows are
    taken after a cyclic shift by half a window (and the result shifted back)."""

    def __init__(self, dim: int, qk_dim: int, window: int, shifted: bool):
        super().__init__()
        if dim % qk_dim:
            raise ValueError(f"the attention's width {dim} must be a multiple of its head width {qk_dim}")
        self.heads, self.window, self.shifted = dim // qk_dim, window, shifted
        self.qk = nn.Linear(dim, 2 * qk_dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.gate_q = nn.Linear(qk_dim, 1, bias=False)
        self.gate_q_bias = nn.Parameter(torch.ones(1))
        self.gate_k = nn.Linear(qk_dim, 1, bias=False)
        self.gate_k_bias = nn.Parameter(torch.ones(1))
        n = window * window
        self.theta_pool = nn.Linear(n, 1, bias=False)
        self.theta_mlp = nn.Sequential(nn.Linear(n, n, bias=False), nn.LeakyReLU(0.1), nn.Linear(n, 1, bias=False))

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The attention weights (N, 1, L, L) of q, k (N, 1, L, d): softmax(s·g) where s·g > θ, else 0."""
        gq = self.gate_q(q) + self.gate_q_bias
        gk = self.gate_k(k) + self.gate_k_bias
        scores = torch.einsum("nhid,nhjd->nhij", q, k)
        gate = torch.einsum("nhid,nhjd->nhij", gq, gk)
        # θ per window: from the scores with their diagonal zeroed, pooled over keys, then over queries
        off = scores.clone()
        off.diagonal(dim1=-2, dim2=-1).zero_()  # = scores − diag(scores), bit for bit
        theta = self.theta_mlp(self.theta_pool(off).squeeze(-1)).unsqueeze(-1)
        scores = scores * gate
        return scores.softmax(dim=-1) * (scores > theta)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        B, H, W, D = t.shape
        w = self.window
        if self.shifted:
            t = t.roll(shifts=w // 2, dims=1).roll(shifts=w // 2, dims=2)
        x = t.reshape(B, H // w, w, W // w, w, D).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, D)
        N, L = x.shape[:2]
        q, k = self.qk(x).chunk(2, dim=-1)
        v = self.v(x).reshape(N, L, self.heads, -1).permute(0, 2, 1, 3)
        q, k = (a.reshape(N, L, 1, -1).permute(0, 2, 1, 3) for a in (q, k))
        o = torch.einsum("nhij,nhjd->nhid", self.weights(q, k), v)  # one map for every value head
        o = self.proj(o.permute(0, 2, 1, 3).reshape(N, L, D))
        o = o.reshape(B, H // w, W // w, w, w, D).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, D)
        if self.shifted:
            o = o.roll(shifts=-(w // 2), dims=1).roll(shifts=-(w // 2), dims=2)
        return o


class _GroupedMLP(nn.Module):
    """(B, H, W, dim) -> (B, H, W, dim): each channel to ``mult`` channels (1×1, grouped per channel), GELU, a
    1×1 mix within each of the ``mult`` groups of dim channels (the m-th expansion of every channel), GELU, and
    the ``mult`` channels of each channel back to one."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.mult = mult
        self.expand = nn.Conv2d(dim, dim * mult, 1, groups=dim, bias=False)
        self.mix = nn.Conv2d(dim * mult, dim * mult, 1, groups=mult, bias=False)
        self.project = nn.Conv2d(dim * mult, dim, 1, groups=dim, bias=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # The three grouped convolutions bit for bit (the products and fused sums of the convolutions' GEMMs),
        # without PyTorch's per-group loop on the CPU. Each GELU is given the layout the convolution's output
        # had: its kernel, and so its last bit, depends on the layout, and the attention's threshold downstream
        # turns a last bit into a visible change.
        m = self.mult
        B, H, W, D = t.shape
        x = t.contiguous().unsqueeze(-1) * self.expand.weight.view(D, m)  # (B, H, W, D, m): channels last
        x = F.gelu(x.view(B, H, W, D * m).permute(0, 3, 1, 2))            # as the convolution's output
        x = x.permute(0, 2, 3, 1).reshape(B, H * W, D, m).permute(0, 3, 2, 1).contiguous()  # (B, m, D, HW)
        x = F.gelu(torch.matmul(self.mix.weight.view(m, D, D), x))          # the mix within each expansion
        w = self.project.weight.view(D, m, 1)
        out = x[:, 0] * w[:, 0]
        for j in range(1, m):
            out = torch.addcmul(out, x[:, j], w[:, j])
        return out.view(B, D, H, W).permute(0, 2, 3, 1)


class _Block(nn.Module):
    """The image prior's block on (B, dim, H, W): x + depthwise 5×5(x), then x + attention(LN x),
    x + MLP(LN x) (on channels-last tokens). Returns a channels-last view."""

    def __init__(self, dim: int, qk_dim: int, window: int, shifted: bool = False, mult: int = 4):
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim, bias=False)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, qk_dim, window, shifted)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _GroupedMLP(dim, mult)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos(x)
        t = x.permute(0, 2, 3, 1)
        t = self.attn(self.norm1(t)) + t
        t = self.mlp(self.norm2(t)) + t
        return t.permute(0, 3, 1, 2)


class _ImagePrior(nn.Module):
    """DPU's image prior (the authors' IPB): two (B, C, H, W) inputs, interleaved; 3×3 to ``dim``; a block; 4×4
    stride-2 down to 2·dim; a block; down to 4·dim; a block on the first half and a shifted block on the second
    half plus the first's output; 2×2 transposed convs up, 1×1 fusion with the skip, a shifted block per scale;
    3×3 to C plus the per-band mix of the input pair. Mirror-pads to a multiple of 4·window inside.
    -> (B, C, H, W)."""

    def __init__(self, bands: int, dim: int, window: int):
        super().__init__()
        self.multiple = 4 * window
        d1, d2 = dim, 2 * dim
        self.pair = _pair_weight(bands)
        self.embed = nn.Conv2d(2 * bands, d1, 3, 1, 1, bias=False)
        self.enc1 = _Block(d1, dim, window)
        self.down1 = nn.Conv2d(d1, d2, 4, 2, 1, bias=False)
        self.enc2 = _Block(d2, dim, window)
        self.down2 = nn.Conv2d(d2, 2 * d2, 4, 2, 1, bias=False)
        self.mid_local = _Block(d2, dim, window)
        self.mid_shifted = _Block(d2, dim, window, shifted=True)
        self.up2 = nn.ConvTranspose2d(2 * d2, d2, 2, 2)
        self.fuse2 = nn.Conv2d(2 * d2, d2, 1, bias=False)
        self.dec2 = _Block(d2, dim, window, shifted=True)
        self.up1 = nn.ConvTranspose2d(d2, d1, 2, 2)
        self.fuse1 = nn.Conv2d(d2, d1, 1, bias=False)
        self.dec1 = _Block(d1, dim, window, shifted=True)
        self.mapping = nn.Conv2d(d1, bands, 3, 1, 1, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _trunc_normal(m.weight, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        H, W = a.shape[-2:]
        mixed = _pair_mix(a, b, self.pair)
        x = _interleave(_reflect_pad(torch.cat([a, b], dim=1), -H % self.multiple, -W % self.multiple))
        x1 = self.enc1(self.embed(x))
        x2 = self.enc2(self.down1(x1))
        x = self.down2(x2)
        half = x.shape[1] // 2
        local = self.mid_local(x[:, :half])
        x = torch.cat([local, self.mid_shifted(x[:, half:] + local)], dim=1)
        x = self.up2(x)
        x = self.dec2(x2 + self.fuse2(torch.cat([x, x2], dim=1)))
        x = self.up1(x)
        x = self.dec1(x1 + self.fuse1(torch.cat([x, x1], dim=1)))
        return self.mapping(x)[:, :, :H, :W] + mixed


# ---------------------------------------------------------------------------------------------- the other parts
class _DegradationPrior(nn.Module):
    """DPU's degradation prior (the authors' DPB): LN over the 2C channels of x, 1×1 to C, GELU, times a gate
    σ(1×1(LN [Φ, P])) from the masks, 1×1. (B, 2C, H, W), (1|B, 2C, H, W) -> (B, C, H, W)."""

    def __init__(self, bands: int):
        super().__init__()
        self.norm_x = nn.LayerNorm(2 * bands)
        self.norm_mask = nn.LayerNorm(2 * bands)
        self.fuse = nn.Conv2d(2 * bands, bands, 1, bias=False)
        self.gate = nn.Conv2d(2 * bands, bands, 1, bias=False)
        self.out = nn.Conv2d(bands, bands, 1, bias=False)
        for m in (self.fuse, self.gate, self.out):
            _trunc_normal(m.weight, 0.02)

    def forward(self, x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fuse(self.norm_x(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)))
        gate = torch.sigmoid(self.gate(self.norm_mask(masks.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)))
        return self.out(x * gate)


class _Fusion(nn.Module):
    """DPU's fusion block (the authors' FB): its two inputs interleaved; the per-band mix of each pair plus
    1×1 to C, GroupNorm per channel, LeakyReLU(0.1), 1×1, GroupNorm, LeakyReLU. -> (B, C, H, W)."""

    def __init__(self, bands: int):
        super().__init__()
        self.pair = _pair_weight(bands)
        self.conv1 = nn.Conv2d(2 * bands, bands, 1)
        self.norm1 = nn.GroupNorm(bands, bands)
        self.conv2 = nn.Conv2d(bands, bands, 1)
        self.norm2 = nn.GroupNorm(bands, bands)
        for m in (self.conv1, self.conv2, self.norm1, self.norm2):
            nn.init.normal_(m.weight, 0.0, 0.01)
        for m in (self.norm1, self.norm2):
            nn.init.normal_(m.bias, 0.0, 0.01)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = _interleave(torch.cat([a, b], dim=1))
        h = F.leaky_relu(self.norm1(self.conv1(x)), 0.1)
        h = F.leaky_relu(self.norm2(self.conv2(h)), 0.1)
        return _pair_mix(a, b, self.pair) + h


class _StepSize(nn.Module):
    """μ per sample: 1×1 to ``width``, ReLU, global mean, 1×1, ReLU, 1×1, ReLU, 1×1 to 1, softplus, + 1e-6.
    (B, C, H, W) -> (B, 1, 1, 1)."""

    def __init__(self, bands: int, width: int = 32):
        super().__init__()
        self.inp = nn.Conv2d(bands, width, 1)
        self.mlp = nn.Sequential(nn.Conv2d(width, width, 1), nn.ReLU(inplace=True), nn.Conv2d(width, width, 1),
                                 nn.ReLU(inplace=True), nn.Conv2d(width, 1, 1), nn.Softplus())

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.mlp(F.adaptive_avg_pool2d(F.relu(self.inp(f)), 1)) + 1e-6


class _Stage(nn.Module):
    """One stage's modules (the authors' ``mu[k]`` and ``net_stage[3k .. 3k+2]``); :meth:`DPU._stage` runs them."""

    def __init__(self, bands: int, dim: int, window: int):
        super().__init__()
        self.step = _StepSize(bands)
        self.image = _ImagePrior(bands, dim, window)
        self.degradation = _DegradationPrior(bands)
        self.fusion = _Fusion(bands)


@register
class DPU(ToolboxModel):
    """DPU (the authors' ``Net``; methods ``dpu_5stg``, ``dpu_9stg``): K stages of step estimation, image prior,
    degradation prior, data step and fusion (module docstring). ``model(op, y) -> x`` (B, C, H, W) from the raw
    y (B, 1, H, W+Δ); ``return_stages=True`` gives the K stage outputs (the authors' list; the last is x).

    Args:
        bands: C. stages: K. dim: the image prior's first-scale width (= its q/k and per-head width; the
        authors': 28). window: attention window (8; the shifted blocks shift by half of it). checkpointing:
        recompute each stage's activations in backward.

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

    def _stage(self, k: int, f, z_prev, u, r, y, masks, phi, shifted, phis, offs, delta):
        """One stage: (f, z, u, r) -> the next (u, r None before the first stage: zero)."""
        s = self.layers[k]
        mu = s.step(f)
        z = s.image(f if u is None else f + u / mu + r, f)
        d = z_prev - f if u is None else z_prev - u / mu - f
        r = s.degradation(torch.cat([d, f], dim=1), masks)
        v = z - r if u is None else z - r - u / mu
        # the data step on the raw y, as the authors compute it (A v summed over the bands of the placed v)
        av = (shifted * _place(v, offs, delta)).sum(dim=1, keepdim=True)
        f = v + _cut_back(torch.div(y - av, mu + phis), offs, v.shape[-1]) * phi
        f = s.fusion(f, z - r).to(y.dtype)
        step = mu * (f - z + r)
        return f, z, step if u is None else u + step, r

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` the K stage outputs. ``gt`` is ignored."""
        offs, C = integer_offsets(op), self.bands
        yd = dispersed_last(op, y)
        n = yd.shape[-1] - op.delta
        phi = dispersed_last(op, mask3d(op)).to(y.dtype)  # (1|B, C, H, W)
        shifted = dispersed_last(op, shifted_mask(op)).to(y.dtype)  # (1|B, C, H, W')
        phis = _phi_s(shifted)  # (1|B, 1, H, W')
        compressed = _cut_back(shifted.sum(dim=1, keepdim=True) / C * 2, offs, n)
        masks = torch.cat([phi.expand_as(compressed), compressed], dim=1)
        f0 = _cut_back(yd / C * 2, offs, n)
        f = self.fuse(torch.cat([f0, phi.expand(f0.shape[0], -1, -1, -1)], dim=1))
        state, outs = (f, f, None, None), []
        for k in range(self.stages):
            args = (k, *state, yd, masks, phi, shifted, phis, offs, op.delta)
            if self.checkpointing and torch.is_grad_enabled():
                state = checkpoint(self._stage, *args, use_reentrant=False)
            else:
                state = self._stage(*args)
            outs.append(undo(op, state[0]))
        return outs if return_stages else outs[-1]


# ---------------------------------------------------------------------------------------------- the authors' names
_IMAGE = {"shuffle_conv": "pair", "conv_in": "embed", "down1": "enc1", "downsample1": "down1", "down2": "enc2",
          "downsample2": "down2", "bottleneck_local": "mid_local", "bottleneck_swin": "mid_shifted",
          "upsample2": "up2", "fusion2": "fuse2", "up2": "dec2", "upsample1": "up1", "fusion1": "fuse1",
          "up1": "dec1", "conv_out": "mapping"}
_BLOCKS = {"enc1", "enc2", "mid_local", "mid_shifted", "dec2", "dec1"}
_BLOCK = {"pos_emb": "pos", "norm1": "norm1", "norm2": "norm2", "fa.to_qk": "attn.qk", "fa.to_v": "attn.v",
          "fa.to_out": "attn.proj", "fa.cal_atten.pc_proj_q": "attn.gate_q",
          "fa.cal_atten.bias_pc_proj_q": "attn.gate_q_bias", "fa.cal_atten.pc_proj_k": "attn.gate_k",
          "fa.cal_atten.bias_pc_proj_k": "attn.gate_k_bias", "fa.cal_atten.mlp1.0": "attn.theta_pool",
          "fa.cal_atten.mlp2": "attn.theta_mlp", "mpmlp.pwconv1.0": "mlp.expand", "mpmlp.groupconv.0": "mlp.mix",
          "mpmlp.pwconv2": "mlp.project"}
_PARTS = [("image", None), ("degradation", {"norm_n": "norm_x", "norm_mask": "norm_mask", "fusion.0": "fuse",
                                            "weight.0": "gate", "out.0": "out"}),
          ("fusion", {"shuffle_conv": "pair", "out.0": "conv1", "out.1": "norm1", "out.3": "conv2",
                      "out.4": "norm2"})]
_STEP = {"conv.0": "inp", "mlp": "mlp"}


def _swap_prefix(key: str, table: dict[str, str]) -> str:
    """key with its longest dotted prefix found in ``table`` replaced (unchanged when none is)."""
    for old in sorted(table, key=len, reverse=True):
        if key == old or key.startswith(old + "."):
            return table[old] + key[len(old):]
    return key


def authors_key(key: str) -> str:
    """The cassi name of a key of the authors' DPU state dict (``net_stage.{3k}`` / ``{3k+1}`` / ``{3k+2}``:
    stage k's image prior, degradation prior, fusion; ``mu.{k}``: its step; ``conv``: the first fusion); keys it
    does not know are returned as they are (and then reported by the loader)."""
    m = re.fullmatch(r"net_stage\.(\d+)\.(.+)", key)
    if m:
        k, part = divmod(int(m.group(1)), 3)
        name, table = _PARTS[part]
        rest = m.group(2)
        if table is None:
            head, _, tail = rest.partition(".")
            head = _IMAGE.get(head, head)
            rest = f"{head}.{_swap_prefix(tail, _BLOCK) if head in _BLOCKS else tail}" if tail else head
        else:
            rest = _swap_prefix(rest, table)
        return f"layers.{k}.{name}.{rest}"
    m = re.fullmatch(r"mu\.(\d+)\.(.+)", key)
    if m:
        return f"layers.{m.group(1)}.step.{_swap_prefix(m.group(2), _STEP)}"
    return _swap_prefix(key, {"conv": "fuse"})


for _k in (5, 9):
    register_method(f"dpu_{_k}stg", "DPU", rename=authors_key, source="dpu", stages=_k)
