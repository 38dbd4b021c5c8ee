"""Image-quality metrics for cubes (B, C, H, W) in [0, 1], one value per sample.

PSNR/SSIM/SAM come from torchmetrics. ``psnr_table`` reproduces the convention of
the published CASSI tables (TSA-Net, MST, DAUHST, ...): both cubes scaled by 256
and rounded to integers, PSNR with peak 255 per band, averaged over bands.
"""
from __future__ import annotations

import torch
from torchmetrics.functional.image import (peak_signal_noise_ratio, spectral_angle_mapper,
                                           structural_similarity_index_measure)


def _check(pred: torch.Tensor, target: torch.Tensor) -> None:
    if pred.shape != target.shape or pred.ndim != 4:
        raise ValueError(f"pred and target must both be (B, C, H, W), got {tuple(pred.shape)} and {tuple(target.shape)}")


def psnr(pred, target, data_range: float = 1.0) -> torch.Tensor:
    """10·log10(range² / MSE) over each whole cube: (B,) dB."""
    _check(pred, target)
    return peak_signal_noise_ratio(pred, target, data_range=data_range, reduction="none", dim=(1, 2, 3))


def psnr_table(pred, target) -> torch.Tensor:
    """Mean over bands of 10·log10(255² / MSE_c) on round(256·x): (B,) dB, as in published tables."""
    _check(pred, target)
    p, t = (pred.double() * 256).round(), (target.double() * 256).round()
    mse = ((p - t) ** 2).mean(dim=(2, 3))  # (B, C)
    return (10 * torch.log10(255.0**2 / mse)).mean(dim=1).to(pred.dtype)


def ssim(pred, target, data_range: float = 1.0) -> torch.Tensor:
    """Mean SSIM (11×11 Gaussian window, σ 1.5) over bands and pixels: (B,)."""
    _check(pred, target)
    return structural_similarity_index_measure(pred, target, data_range=data_range, reduction="none")


def sam(pred, target) -> torch.Tensor:
    """Mean spectral angle in degrees between pred and target spectra: (B,)."""
    _check(pred, target)
    angles = spectral_angle_mapper(pred.clamp_min(0) + 1e-12, target.clamp_min(0) + 1e-12, reduction="none")
    return torch.rad2deg(angles.flatten(1).mean(dim=1))


def all_metrics(pred, target) -> dict[str, torch.Tensor]:
    """{'psnr', 'psnr_table', 'ssim', 'sam'}: each (B,)."""
    pred = pred.clamp(0, 1)
    return {"psnr": psnr(pred, target), "psnr_table": psnr_table(pred, target),
            "ssim": ssim(pred, target), "sam": sam(pred, target)}
