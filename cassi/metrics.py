"""Image-quality metrics for cubes (B, C, H, W) in [0, 1], one value per sample.

PSNR/SSIM/SAM come from torchmetrics. ``psnr_table`` and ``ssim_table`` are the published CASSI tables' protocol
(TSA-Net, MST, DAUHST, …: the MST toolbox's ``Cal_quality_assessment.m``): both cubes to 8 bits (``im2uint8``,
round(255·x) of x clipped to [0, 1]), then per band PSNR with peak 255 and SSIM (Wang et al.'s ``ssim_index``: an
11×11 Gaussian window of σ 1.5 over the valid region, L = 255), each averaged over the bands.
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


def _eight_bit(x: torch.Tensor) -> torch.Tensor:
    """Matlab's im2uint8 of x clipped to [0, 1], as float64: round(255·x) (B, C, H, W)."""
    return (x.double().clamp(0, 1) * 255).round()


def psnr_table(pred, target) -> torch.Tensor:
    """Mean over bands of 10·log10(255² / MSE_c) on the 8-bit cubes: (B,) dB, the published tables' PSNR."""
    _check(pred, target)
    mse = ((_eight_bit(pred) - _eight_bit(target)) ** 2).mean(dim=(2, 3))  # (B, C)
    return (10 * torch.log10(255.0**2 / mse)).mean(dim=1).to(pred.dtype)


def ssim_table(pred, target) -> torch.Tensor:
    """Mean over bands of SSIM on the 8-bit cubes (L = 255, 11×11 Gaussian σ 1.5, valid region): (B,), the
    published tables' SSIM."""
    _check(pred, target)
    if min(pred.shape[-2:]) < 11:
        raise ValueError(f"ssim_table needs frames of at least 11×11 (its window), got {tuple(pred.shape[-2:])}")
    # torchmetrics' map covers the reflect-padded border too: the valid region is 5 px in from each side
    _, full = structural_similarity_index_measure(_eight_bit(pred), _eight_bit(target), data_range=255.0,
                                                  reduction="none", return_full_image=True)
    return full[..., 5:-5, 5:-5].mean(dim=(1, 2, 3)).to(pred.dtype)


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
    """{'psnr', 'psnr_table', 'ssim', 'ssim_table', 'sam'}: each (B,); ssim_table NaN on frames under its 11×11
    window. Measured in float32 or above with autocast off, also inside a bf16/fp16 autocast (validation under
    mixed precision), where SSIM's convolutions would otherwise run in half precision."""
    dtype = torch.promote_types(torch.promote_types(pred.dtype, target.dtype), torch.float32)
    with torch.autocast(pred.device.type, enabled=False):
        pred, target = pred.to(dtype).clamp(0, 1), target.to(dtype)
        table = (ssim_table(pred, target) if min(pred.shape[-2:]) >= 11
                 else torch.full(pred.shape[:1], float("nan"), dtype=pred.dtype, device=pred.device))
        return {"psnr": psnr(pred, target), "psnr_table": psnr_table(pred, target),
                "ssim": ssim(pred, target), "ssim_table": table, "sam": sam(pred, target)}
