"""GAP-Net and ADMM-Net as the MST toolbox has them (methods ``gap_net``, ``admm_net``), weight-compatible.

Both unroll 9 stages of a data step and a U-Net (4.27 M parameters at 28 bands) on the *dispersed frame*: a
cube of width W+Δ in which band c sits at columns d_c … d_c+W−1. The toolbox rolls every band back by d_c
before each U-Net and forward again after it, so each U-Net sees a (B, C, H, W+Δ) cube whose first W columns
are the aligned cube and whose last Δ columns hold what the rolls wrapped around (never touched by the data
step); its output is the first W columns of the re-dispersed last stage, i.e. band c displaced by d_c with the
wrapped-around columns in its first d_c columns (the trained weights learn that layout).

Here the state stays rolled back (u, (B, C, H, W+Δ)): the rolls cancel between stages and only the output is
gathered once. In that frame the toolbox's step x + Aᵀ((y − A x) ⊘ Φ_s) is exactly ``op.data_step`` on the
first W columns (Phi_c is 0 outside band c's W columns), with the last Δ columns kept; ADMM-Net's
(Φ_s + γ_k) step is ``op.data_step(·, y, rho=γ_k)`` (exact while Φ + γ_k > 0 wherever Φ > 0; else the
toolbox's weights 1/(Φ + γ_k) are applied as they are, through A and Aᵀ).

cassi's own :class:`cassi.models.GAPNet` / :class:`cassi.models.ADMMNet` (config ``model=gapnet`` /
``model=admmnet``) work on the aligned cube only (any geometry, fractional offsets included) and are not
weight-compatible; these classes (``model=toolbox_gap_net`` / ``model=toolbox_admm_net``) are. Imports torch only.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi._checks import check_positive_int
from cassi.models.unrolled import _config
from cassi.models.zoo.toolbox import ToolboxModel, dispersed_last, integer_offsets, register_method, undo
from cassi.registry import register

__all__ = ["StageUNet", "ToolboxGAPNet", "ToolboxADMMNet"]

MULTIPLE = 8  # the U-Net pads its input (reflecting) to a multiple of this on both axes


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))


class StageUNet(nn.Module):
    """The toolbox's stage prior: out = x + tanh(U(x)), U a 3-scale U-Net (two 3×3 conv + ReLU per scale,
    widths ``width``·(1, 2, 4), 2×2 max-pool down, 2×2 transposed conv + ReLU up, skip concatenation, 1×1 conv
    out), on x reflect-padded to a multiple of 8 and cropped back. (B, C, H, W) -> (B, C, H, W) (channels-last
    memory on CPU)."""

    def __init__(self, channels: int, width: int = 32):
        super().__init__()
        w = (width, 2 * width, 4 * width)
        self.enc = nn.ModuleList([_double_conv(channels, w[0]), _double_conv(w[0], w[1]), _double_conv(w[1], w[2])])
        self.up = nn.ModuleList([nn.ConvTranspose2d(w[1], w[0], 2, stride=2),
                                 nn.ConvTranspose2d(w[2], w[1], 2, stride=2)])
        self.dec = nn.ModuleList([_double_conv(2 * w[0], w[0]), _double_conv(2 * w[1], w[1])])
        self.out = nn.Conv2d(w[0], channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ph, pw = -h % MULTIPLE, -w % MULTIPLE
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph), mode="reflect")
        # oneDNN's convolutions, pools and transposed convs: faster in NHWC (docs/zoo/gapnet.md, "Figures")
        if x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        s0 = self.enc[0](x)
        s1 = self.enc[1](F.max_pool2d(s0, 2))
        t = self.enc[2](F.max_pool2d(s1, 2))
        t = self.dec[1](torch.cat([F.relu(self.up[1](t), inplace=True), s1], dim=1))
        t = self.dec[0](torch.cat([F.relu(self.up[0](t), inplace=True), s0], dim=1))
        if t.is_contiguous(memory_format=torch.channels_last):  # the 1×1 conv as one GEMM over pixels
            t = F.linear(t.permute(0, 2, 3, 1), self.out.weight.flatten(1), self.out.bias).permute(0, 3, 1, 2)
        else:
            t = self.out(t)
        out = torch.tanh(t) + x
        return out[..., :h, :w] if ph or pw else out


class _Dispersed(ToolboxModel):
    """Shared by both: the stage loop on the rolled-back dispersed frame (module docstring)."""

    def __init__(self, bands: int, stages: int, width: int, checkpointing: bool):
        super().__init__()
        for name, v in (("bands", bands), ("stages", stages), ("width", width)):
            check_positive_int(name, v)
        self.bands, self.stages, self.checkpointing = bands, stages, bool(checkpointing)
        self.unets = nn.ModuleList(StageUNet(bands, width) for _ in range(stages))

    def limits(self, op) -> None:
        integer_offsets(op, type(self).__name__)
        rows, width = dispersed_last(op, op.mask).shape[-2:]
        if min(rows, width + op.delta) < MULTIPLE:
            raise ValueError(f"{type(self).__name__} needs a dispersed frame of at least {MULTIPLE}×{MULTIPLE} "
                             f"pixels (its U-Nets reflect-pad to multiples of {MULTIPLE}), got "
                             f"{rows}×{width + op.delta}")

    # ---------------------------------------------------------------- the frame
    @staticmethod
    def _step(op, u: torch.Tensor, y: torch.Tensor, rho=0.0) -> torch.Tensor:
        """The toolbox's data step on the rolled-back frame u (B, C, H', W+Δ) (dispersed axis last): the
        first W columns through ``op.data_step``, the last Δ kept."""
        width = u.shape[-1] - op.delta
        x = op.data_step(undo(op, u[..., :width]), y, rho)
        return torch.cat([dispersed_last(op, x), u[..., width:]], dim=-1)

    def _output(self, op, u: torch.Tensor) -> torch.Tensor:
        """The toolbox's output: band c rolled forward by d_c, first W columns (B, C, H, W)."""
        offs = integer_offsets(op, type(self).__name__)
        full, width = u.shape[-1], u.shape[-1] - op.delta
        idx = (torch.arange(width, device=u.device)[None, :] - torch.tensor(offs, device=u.device)[:, None]) % full
        out = torch.gather(u, -1, idx[None, :, None, :].expand(*u.shape[:-1], width))
        return undo(op, out).contiguous()

    def _start(self, op, y: torch.Tensor) -> torch.Tensor:
        """Aᵀy on the rolled-back frame: [Aᵀy | 0] (B, C, H', W+Δ)."""
        a = dispersed_last(op, op.adjoint(y))
        return F.pad(a, (0, op.delta))

    def _prior(self, k: int, u: torch.Tensor) -> torch.Tensor:
        return self.unets[k](u).to(u.dtype)

    def _run(self, k: int, fn, *args):
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)


@register
class ToolboxGAPNet(_Dispersed):
    """GAP-Net as the MST toolbox has it (method ``gap_net``; config ``model=toolbox_gap_net``), weight-compatible.

    On the rolled-back dispersed frame u (B, C, H, W+Δ), from u = [Aᵀy | 0]:
    u ← U-Net_k([z + Aᵀ((y − A z) ⊘ Φ) | tail]) with z the first W columns of u, k = 1 … ``stages``;
    output: band c of u rolled forward by d_c, first W columns. (B, 1, H, W+Δ) -> (B, C, H, W).

    Differs from cassi's :class:`cassi.models.GAPNet` (``model=gapnet``): that one denoises the aligned
    (B, C, H, W) cube from A⁺y, with a learned step size and no tanh, and handles fractional offsets; this one
    keeps the toolbox's dispersed frame (the U-Nets see W+Δ columns) and loads its trained weights.

    Beyond the toolbox: any band count, frame size, integer offsets in any order (d_c replaces 2c), dispersion
    along h (the transposed problem), a batch of masks, bf16 autocast, ``checkpointing`` (recompute each stage
    in backward). Refuses fractional offsets (the dispersed frame needs whole-pixel rolls) and frames under
    8×8 (ValueError, one line).
    """

    def __init__(self, bands: int = 28, stages: int = 9, width: int = 32, checkpointing: bool = False):
        super().__init__(bands, stages, width, checkpointing)
        self.config = _config(self, dict(locals()))

    def _stage(self, k: int, op, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self._prior(k, self._step(op, u, y))

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, H, W) from y (B, 1, H, W+Δ); ``gt`` is accepted and ignored."""
        u = self._start(op, y)
        for k in range(self.stages):
            u = self._run(k, lambda t, k=k: self._stage(k, op, y, t), u)
        return self._output(op, u)


@register
class ToolboxADMMNet(_Dispersed):
    """ADMM-Net as the MST toolbox has it (method ``admm_net``; config ``model=toolbox_admm_net``), weight-compatible.

    On the rolled-back dispersed frame, from θ = [Aᵀy | 0], b = 0, for k = 1 … ``stages``:
    x = [v + Aᵀ((y − A v) ⊘ (Φ + γ_k)) | tail] with v = θ + b (the step on its first W columns),
    θ = U-Net_k(x − b), b ← b − (x − θ); output: band c of θ rolled forward by d_c, first W columns.
    γ_k are learned scalars (from 0, unconstrained, as in the toolbox). (B, 1, H, W+Δ) -> (B, C, H, W).

    Differs from cassi's :class:`cassi.models.ADMMNet` (``model=admmnet``): that one works on the aligned
    cube from A⁺y with ρ_k = softplus(θ_k) ≥ 0 and no tanh, and handles fractional offsets; this one keeps the
    toolbox's dispersed frame and loads its trained weights. Where Φ + γ_k ≤ 0 at a pixel with Φ > 0 (a
    negative learned γ_k) the toolbox's weight 1/(Φ + γ_k) is applied as it is (no fused step then).

    Beyond the toolbox, and refused: as :class:`ToolboxGAPNet`.
    """

    def __init__(self, bands: int = 28, stages: int = 9, width: int = 32, checkpointing: bool = False):
        super().__init__(bands, stages, width, checkpointing)
        self.config = _config(self, dict(locals()))
        self.gammas = nn.ParameterList(nn.Parameter(torch.zeros(1)) for _ in range(stages))

    def _stage(self, k: int, op, y: torch.Tensor, theta: torch.Tensor, b: torch.Tensor, floor):
        v, g = theta + b, self.gammas[k]
        if floor is None or float(g.detach()) > -floor:  # Φ + γ_k > 0 wherever Φ > 0: the fused step is exact
            x = self._step(op, v, y, g)
        else:  # the toolbox's weights 1/(Φ_s + γ_k), negative at some pixels: through A and Aᵀ as they are
            w = 1 / (torch.where(op.phi > 0, op.phi, torch.ones_like(op.phi)) + g)
            width = v.shape[-1] - op.delta
            z = undo(op, v[..., :width])
            x = torch.cat([dispersed_last(op, z + op.adjoint((y - op(z)) * w)), v[..., width:]], dim=-1)
        theta = self._prior(k, x - b)
        return theta, b - (x - theta)

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, H, W) from y (B, 1, H, W+Δ); ``gt`` is accepted and ignored."""
        theta = self._start(op, y)
        b = torch.zeros_like(theta)
        floor = None  # the smallest positive Φ, read only when some γ_k < 0
        if any(float(g.detach()) < 0 for g in self.gammas):
            floor = float(op.phi[op.phi > 0].min())
        for k in range(self.stages):
            theta, b = self._run(k, lambda t, c, k=k: self._stage(k, op, y, t, c, floor), theta, b)
        return self._output(op, theta)


# ---------------------------------------------------------------------------------------------- weights
def _unet_key(key: str) -> str:
    """A toolbox U-Net key (``unet3.dconv_down1.d_conv.0.weight``) -> this module's (``unets.2.enc.0.0.weight``)."""
    m = re.fullmatch(r"unet(\d+)\.(.+)", key)
    if m is None:
        return key
    k, rest = int(m.group(1)) - 1, m.group(2)
    rest = re.sub(r"^dconv_down(\d)\.d_conv\.", lambda n: f"enc.{int(n.group(1)) - 1}.", rest)
    rest = re.sub(r"^dconv_up(\d)\.d_conv\.", lambda n: f"dec.{int(n.group(1)) - 1}.", rest)
    rest = re.sub(r"^upsample(\d)\.0\.", lambda n: f"up.{int(n.group(1)) - 1}.", rest)
    rest = re.sub(r"^conv_last\.", "out.", rest)
    return f"unets.{k}.{rest}"


def _admm_key(key: str) -> str:
    m = re.fullmatch(r"gamma(\d+)", key)
    return f"gammas.{int(m.group(1)) - 1}" if m else _unet_key(key)


register_method("gap_net", "ToolboxGAPNet", rename=_unet_key)
register_method("admm_net", "ToolboxADMMNet", rename=_admm_key)
