"""HDNet (Hu et al. 2022, "HDNet: High-resolution Dual-domain Learning for Spectral Compressive Imaging") as the
MST toolbox has it (method ``hdnet``; config ``model=hdnet``), weight-compatible, and its frequency-domain
training loss (FDL).

The network sees H = y·2/C shifted back per band (the toolbox's input ``H``; no mask) and is a plain residual
CNN at full resolution: a 3×3 head to 64 channels, 16 residual blocks, the spatial-spectral attention (SDL),
the efficient feature fusion (EFF: 4 groups of 16 channels, each reweighted by a softmax over all pixels), 15
residual blocks, a 3×3 conv, a long skip, and a 3×3 tail to C bands. 2.37 M parameters at 28 bands.

The toolbox's real-data variant (``real=True``, method ``hdnet_real``) fuses the unscaled shifted-back y with
one more 3×3 conv (C → C, no bias) before the head.

:class:`FDL` is the focal frequency loss the toolbox trains HDNet with (its ``model_generator`` returns it
beside the model); :class:`HDNetLoss` is the whole training loss, RMSE + 0.7·FDL (weight 0.7 inside), in the
form of ``module.loss`` (conf/schedule/toolbox_hdnet.yaml). Imports torch only.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi.models.losses import ReconstructionLoss
from cassi._checks import check_positive_int
from cassi.models.unrolled import _config
from cassi.models.zoo.toolbox import ToolboxModel, register_method, shift_back
from cassi.registry import register

__all__ = ["HDNet", "FDL", "HDNetLoss"]


def _conv(cin: int, cout: int, k: int = 3, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2, bias=bias)


class _Residual(nn.Module):
    """x + conv(ReLU(conv(x))), 3×3, same width. (B, F, H, W) -> (B, F, H, W)."""

    def __init__(self, feats: int):
        super().__init__()
        self.conv1, self.conv2 = _conv(feats, feats), _conv(feats, feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x), inplace=True)).add_(x)


class _SDL(nn.Module):
    """Spatial-spectral attention: x·σ(W_up W_v Σ_p softmax_p(w_q·x)_p x_p)
    + x·σ(softmax_p((W_g x̄)ᵀ W_θ x_p)), x̄ the spatial mean, softmax over the pixels p, all maps 1×1
    convolutions without bias. (B, F, H, W) -> (B, F, H, W).

    Evaluated as written above but reordered by linearity (each 1×1 map applied to a pooled vector instead
    of to the whole image): the same sums, two fewer full-size convolutions."""

    def __init__(self, feats: int):
        super().__init__()
        inner = feats // 2
        self.q_spatial = nn.Conv2d(feats, 1, 1, bias=False)
        self.v_spatial = nn.Conv2d(feats, inner, 1, bias=False)
        self.up = nn.Conv2d(inner, feats, 1, bias=False)
        self.q_spectral = nn.Conv2d(feats, inner, 1, bias=False)
        self.v_spectral = nn.Conv2d(feats, inner, 1, bias=False)
        for conv in (self.q_spatial, self.v_spatial, self.q_spectral, self.v_spectral):  # the authors' init
            nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, f, h, w = x.shape
        flat = x.reshape(b, f, h * w)
        # spatial branch: a channel gate from the softmax-pooled features
        attn = torch.softmax(torch.einsum("of,bfp->bp", self.q_spatial.weight[:, :, 0, 0], flat), dim=-1)
        pooled = torch.einsum("bfp,bp->bf", flat, attn)                       # (B, F)
        ctx = pooled @ self.v_spatial.weight[:, :, 0, 0].t()                   # (B, F/2)
        gate = torch.sigmoid(ctx @ self.up.weight[:, :, 0, 0].t())             # (B, F)
        # spectral branch: a pixel gate from the mean feature's projection
        mean = flat.mean(dim=-1)                                               # (B, F)
        g = mean @ self.q_spectral.weight[:, :, 0, 0].t()                      # (B, F/2)
        k = g @ self.v_spectral.weight[:, :, 0, 0]                             # (B, F)
        pix = torch.sigmoid(torch.softmax(torch.einsum("bf,bfp->bp", k, flat), dim=-1))
        return x * gate[:, :, None, None] + x * pix.view(b, 1, h, w)


class _DSC(nn.Module):
    """One EFF group: a = softmax over pixels of ReLU(BN(1×1 conv to 1 channel of
    maxpool3×3(ReLU(BN(depthwise 1×1 conv(x)))))); out = x·(1 + a). (B, G, H, W) -> (B, G, H, W)."""

    def __init__(self, feats: int):
        super().__init__()
        self.depthwise = nn.Conv2d(feats, feats, 1, groups=feats)
        self.bn_depthwise = nn.BatchNorm2d(feats, momentum=0.9)
        self.point = nn.Conv2d(feats, 1, 1)
        self.bn_point = nn.BatchNorm2d(1, momentum=0.9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.bn_depthwise(self.depthwise(x)))
        a = F.relu(self.bn_point(self.point(F.max_pool2d(a, 3, stride=1, padding=1))))
        b, _, h, w = a.shape
        a = torch.softmax(a.reshape(b, 1, h * w), dim=-1).view(b, 1, h, w)
        return x * (1 + a)


class _EFF(nn.Module):
    """Efficient feature fusion: the channels in ``splits`` equal groups, each through :class:`_DSC`."""

    def __init__(self, feats: int, splits: int = 4):
        super().__init__()
        if feats % splits:
            raise ValueError(f"EFF needs features ({feats}) divisible by its splits ({splits})")
        self.groups = nn.ModuleList(_DSC(feats // splits) for _ in range(splits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.chunk(len(self.groups), dim=1)
        return torch.cat([m(p) for m, p in zip(self.groups, parts)], dim=1)


@register
class HDNet(ToolboxModel):
    """HDNet as the MST toolbox has it (method ``hdnet``; ``real=True``: method ``hdnet_real``).

    x = tail(r + body(r)), r = head(H), H = y·2/C shifted back per band (the mask is not an input);
    body = 16 residual blocks, SDL attention, EFF, 15 residual blocks, 3×3 conv (``feats`` = 64 channels).
    ``real``: H is y shifted back without the 2/C and passed through a 3×3 conv C → C first (the toolbox's
    real-data model; its data feed y·2/C·1.2 there). (B, 1, H, W+Δ) -> (B, C, H, W).

    Beyond the toolbox: any band count and frame size, fractional offsets and dispersion along h (H is the
    operator's shift-back, any geometry), batches of masks (unused), bf16 autocast, ``checkpointing``
    (recompute each residual block in backward). Refuses only another band count than ``bands``.
    """

    def __init__(self, bands: int = 28, feats: int = 64, blocks: tuple[int, int] = (16, 15), real: bool = False,
                 checkpointing: bool = False):
        super().__init__()
        self.config = _config(self, dict(locals()))
        for name, v in (("bands", bands), ("feats", feats)):
            check_positive_int(name, v)
        blocks = tuple(int(b) for b in blocks)
        if len(blocks) != 2 or min(blocks) < 0:
            raise ValueError(f"blocks must be two counts >= 0 (before and after the attention), got {blocks!r}")
        if feats % 8:
            raise ValueError(f"feats must be a multiple of 8 (SDL halves it, EFF splits it in 4), got {feats}")
        self.bands, self.real, self.checkpointing = bands, bool(real), bool(checkpointing)
        self.fuse_input = _conv(bands, bands, bias=False) if self.real else None
        self.head = _conv(bands, feats)
        self.before = nn.ModuleList(_Residual(feats) for _ in range(blocks[0]))
        self.sdl = _SDL(feats)
        self.eff = _EFF(feats, 4)
        self.after = nn.ModuleList(_Residual(feats) for _ in range(blocks[1]))
        self.body_out = _conv(feats, feats)
        self.tail = _conv(feats, bands)

    def _block(self, m: nn.Module, t: torch.Tensor) -> torch.Tensor:
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(m, t, use_reentrant=False)
        return m(t)

    def net(self, h: torch.Tensor) -> torch.Tensor:
        """The network on its input cube (B, C, H, W) -> (B, C, H, W)."""
        if h.device.type == "cpu":  # oneDNN's convolutions: faster in NHWC (docs/zoo/hdnet.md, "Figures")
            h = h.contiguous(memory_format=torch.channels_last)
        if self.fuse_input is not None:
            h = self.fuse_input(h)
        r = self.head(h)
        t = r
        for m in (*self.before, self.sdl, self.eff, *self.after):
            t = self._block(m, t)
        return self.tail(self.body_out(t) + r).contiguous()

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, H, W) from y (B, 1, H, W+Δ); ``gt`` is accepted and ignored."""
        h = shift_back(op, y, scale=not self.real)
        return self.net(h).to(y.dtype)


# ---------------------------------------------------------------------------------------------- loss
class FDL(nn.Module):
    """Focal frequency loss (Jiang et al. 2021), as HDNet is trained with: on p×p patches (``patch_factor``)
    of pred and target (B, C, H, W), F = orthonormal 2-D DFT; d = F(pred) − F(target);
    loss = ``loss_weight``·mean(w ⊙ |d|²), w = |d|^α (log(1 + ·) when ``log_matrix``) scaled to max 1 over
    the batch (``batch_matrix``) or per patch, detached. ``ave_spectrum``: spectra averaged over the batch
    first. H and W must be multiples of ``patch_factor``. Returns a scalar (float32)."""

    def __init__(self, loss_weight: float = 1.0, alpha: float = 1.0, patch_factor: int = 1,
                 ave_spectrum: bool = False, log_matrix: bool = False, batch_matrix: bool = False):
        super().__init__()
        self.loss_weight, self.alpha, self.patch_factor = float(loss_weight), float(alpha), int(patch_factor)
        self.ave_spectrum, self.log_matrix, self.batch_matrix = bool(ave_spectrum), bool(log_matrix), bool(batch_matrix)

    def _spectrum(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch_factor
        b, c, h, w = x.shape
        if h % p or w % p:
            raise ValueError(f"FDL patch_factor {p} must divide the frame {h}×{w}")
        # (B, p·p patches in row-major order, C, h/p, w/p)
        patches = x.reshape(b, c, p, h // p, p, w // p).permute(0, 2, 4, 1, 3, 5).reshape(b, p * p, c, h // p, w // p)
        return torch.fft.fft2(patches.float(), norm="ortho")

    def forward(self, pred: torch.Tensor, target: torch.Tensor, matrix: torch.Tensor | None = None) -> torch.Tensor:
        fp, ft = self._spectrum(pred), self._spectrum(target)
        if self.ave_spectrum:
            fp, ft = fp.mean(0, keepdim=True), ft.mean(0, keepdim=True)
        dist = (fp - ft).abs().square()                                  # |d|²
        if matrix is not None:
            weight = matrix.detach()
        else:
            with torch.no_grad():
                weight = dist.sqrt() ** self.alpha
                if self.log_matrix:
                    weight = torch.log1p(weight)
                if self.batch_matrix:
                    weight = weight / weight.max()
                else:
                    weight = weight / weight.amax(dim=(-2, -1), keepdim=True)
                weight = torch.nan_to_num(weight, nan=0.0).clamp_(0.0, 1.0)
        return (weight * dist).mean() * self.loss_weight

    def extra_repr(self) -> str:
        return (f"loss_weight={self.loss_weight}, alpha={self.alpha}, patch_factor={self.patch_factor}, "
                f"ave_spectrum={self.ave_spectrum}, log_matrix={self.log_matrix}, batch_matrix={self.batch_matrix}")


class HDNetLoss(nn.Module):
    """HDNet's training loss: ``ReconstructionLoss(kind, ...)`` + ``fdl``·FDL(``fdl_weight``, α, patches, ...)
    (toolbox: RMSE + 0.7·FDL with loss_weight 0.7, α 2, 4×4 patches, batch-averaged spectrum, log weights,
    batch-wide scaling). Takes ``module.loss``'s keys (kind, ssim, eps, relative, gradient) as well.
    (B, C, H, W), (B, C, H, W) -> scalar."""

    def __init__(self, kind: str = "rmse", ssim: float = 0.0, eps: float = 1e-3, relative: bool = False,
                 gradient: float = 0.0, fdl: float = 0.7, fdl_weight: float = 0.7, alpha: float = 2.0,
                 patch_factor: int = 4, ave_spectrum: bool = True, log_matrix: bool = True,
                 batch_matrix: bool = True):
        super().__init__()
        self.pixel = ReconstructionLoss(kind, ssim=ssim, eps=eps, relative=relative, gradient=gradient)
        self.fdl_scale = float(fdl)
        self.fdl = FDL(fdl_weight, alpha, patch_factor, ave_spectrum, log_matrix, batch_matrix)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.pixel(pred, target)
        return loss + self.fdl_scale * self.fdl(pred, target).to(loss.dtype) if self.fdl_scale else loss

    def extra_repr(self) -> str:
        return f"fdl={self.fdl_scale}"


# ---------------------------------------------------------------------------------------------- weights
_DSC_KEYS = {"conv_dws": "depthwise", "bn_dws": "bn_depthwise", "conv_point": "point", "bn_point": "bn_point"}
_SDL_KEYS = {"conv_q_right": "q_spatial", "conv_v_right": "v_spatial", "conv_up": "up",
             "conv_q_left": "q_spectral", "conv_v_left": "v_spectral"}


def _rename(key: str, first: int = 16, second: int = 15) -> str:
    """A toolbox HDNet key -> this module's (``body.3.body.2.weight`` -> ``before.3.conv2.weight``, ...)."""
    key = re.sub(r"^fution\.", "fuse_input.", key)
    key = re.sub(r"^head\.0\.", "head.", key)
    key = re.sub(r"^tail\.0\.", "tail.", key)
    m = re.fullmatch(r"body\.(\d+)\.(.+)", key)
    if m is None:
        return key
    i, rest = int(m.group(1)), m.group(2)
    conv = {"body.0": "conv1", "body.2": "conv2"}
    if i < first or first + 2 <= i < first + 2 + second:
        where = f"before.{i}" if i < first else f"after.{i - first - 2}"
        part, _, leaf = rest.rpartition(".")
        return f"{where}.{conv.get(part, part)}.{leaf}"
    if i == first:
        part, _, leaf = rest.partition(".")
        return f"sdl.{_SDL_KEYS.get(part, part)}.{leaf}"
    if i == first + 1:
        s = re.fullmatch(r"subspaces\.(\d+)\.(\w+)\.(.+)", rest)
        return f"eff.groups.{s.group(1)}.{_DSC_KEYS.get(s.group(2), s.group(2))}.{s.group(3)}" if s else key
    return f"body_out.{rest}"


register_method("hdnet", "HDNet", rename=_rename)
register_method("hdnet_real", "HDNet", rename=_rename, real=True)
