"""Training losses for reconstructions (B, C, H, W) against ground truth (B, C, H, W)."""
from __future__ import annotations

import torch
from torch import nn

from cassi.metrics import ssim as ssim_metric

__all__ = ["ReconstructionLoss"]

KINDS = ("l1", "mse", "rmse", "charbonnier")


class ReconstructionLoss(nn.Module):
    """ℓ(x̂, x) + w_grad·(mean|∂_h(x̂ − x)| + mean|∂_w(x̂ − x)|) + w_ssim·(1 − SSIM(x̂, x)), ℓ one of

    l1: mean|x̂ − x|;  mse: mean(x̂ − x)²;  rmse: sqrt(mse) (the MST toolbox's loss);
    charbonnier: mean sqrt((x̂ − x)² + ε²).  Returns a scalar.

    ``relative``: ℓ is taken on x̂ and x divided per sample by 2·mean(x) (B, 1, 1, 1), so that a dark patch
    weighs as much as a bright one (mean PSNR over scenes rewards exactly that). The SSIM term is always
    taken as the metric is (:func:`cassi.metrics.ssim`: the cubes as given, data range 1; x̂ not
    clamped), where a dark patch weighs less.
    """

    def __init__(self, kind: str = "l1", ssim: float = 0.0, eps: float = 1e-3, relative: bool = False,
                 gradient: float = 0.0):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"loss kind must be one of {KINDS}, got {kind!r}")
        if ssim < 0 or gradient < 0:
            raise ValueError(f"ssim and gradient weights must be >= 0, got {ssim!r}, {gradient!r}")
        self.kind, self.ssim, self.eps, self.relative = kind, float(ssim), float(eps), bool(relative)
        self.gradient = float(gradient)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.shape != target.shape:
            raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
        d = pred - target
        if self.relative:
            d = d / (2 * target.detach().mean(dim=tuple(range(1, target.ndim)), keepdim=True)).clamp_min(1e-4)
        if self.kind == "l1":
            loss = d.abs().mean()
        elif self.kind == "charbonnier":
            loss = (d.square() + self.eps**2).sqrt().mean()
        else:
            loss = d.square().mean()
            loss = loss.sqrt() if self.kind == "rmse" else loss
        if self.gradient:  # the error's edges: ∂ along each spatial axis, on ℓ's scale
            loss = loss + self.gradient * (d.diff(dim=-2).abs().mean() + d.diff(dim=-1).abs().mean())
        if self.ssim:
            loss = loss + self.ssim * (1 - ssim_metric(pred.float(), target.float()).mean())
        return loss

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, ssim={self.ssim}" + (f", gradient={self.gradient}" if self.gradient else "")
                + (", relative=True" if self.relative else ""))
