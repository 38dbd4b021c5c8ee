"""Standard band sets and resampling of cubes between them."""
from __future__ import annotations

from typing import Sequence, TypeVar

import torch

from cassi.io.arrays import Cube

#: The 28 wavelengths (nm) of the TSA-Net / MST simulation and real benchmark.
TSA_WAVELENGTHS: tuple[float, ...] = (
    453.3, 457.6, 462.1, 466.8, 471.6, 476.5, 481.6, 486.9, 492.4, 498.0, 503.9, 509.9, 516.2, 522.7,
    529.5, 536.5, 543.8, 551.4, 558.6, 567.5, 575.3, 584.3, 594.4, 604.2, 614.4, 625.1, 636.3, 648.1)
#: CAVE's 31 bands, 400:10:700 nm.
CAVE_WAVELENGTHS: tuple[float, ...] = tuple(float(w) for w in range(400, 701, 10))

#: The named band sets, by the name a config or a file's meta gives.
BAND_SETS: dict[str, tuple[float, ...]] = {"tsa": TSA_WAVELENGTHS, "cave": CAVE_WAVELENGTHS}

T = TypeVar("T", Cube, torch.Tensor)


def band_wavelengths(value, bands: int | None = None, owner: str = "the data has") -> list[float] | None:
    """None, a named band set ('tsa', 'cave') or a sequence of nm, as a list of floats; with ``bands``,
    ValueError unless there is one wavelength per band (``owner`` names what has the bands)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.lower() not in BAND_SETS:
            raise ValueError(f"unknown band set {value!r}: use one of {sorted(BAND_SETS)} or a list of nm")
        value = BAND_SETS[value.lower()]
    value = [float(v) for v in value]
    if bands is not None and len(value) != bands:
        raise ValueError(f"wavelengths has {len(value)} values but {owner} {bands} bands: give {bands} wavelengths "
                         f"(nm; 'tsa' has 28, 'cave' 31) or wavelengths=null")
    return value


def resample_bands(x: T, src_wavelengths: Sequence[float] | None, dst_wavelengths: Sequence[float]) -> T:
    """Linearly interpolate (C,H,W), (B,C,H,W) or a Cube along the band axis from `src` to `dst` wavelengths.

    `src` must increase strictly; targets outside [src[0], src[-1]] raise
    ValueError (no extrapolation). Targets equal to a source wavelength copy that
    band exactly. For a Cube, `src_wavelengths=None` means cube.wavelengths; the
    result is a Cube with `dst` wavelengths and meta['bands'] updated (per-band
    `offsets` dropped).
    """
    if isinstance(x, Cube):
        src = x.wavelengths if src_wavelengths is None else src_wavelengths
        if src is None:
            raise ValueError("resample_bands: the cube has no wavelengths; pass src_wavelengths")
        meta = {k: v for k, v in x.meta.items() if k != "offsets"}
        meta["bands"] = len(dst_wavelengths)
        return Cube(resample_bands(x.data, src, dst_wavelengths), list(dst_wavelengths), meta)
    if src_wavelengths is None:
        raise ValueError("resample_bands: src_wavelengths is required for a tensor")
    src = torch.as_tensor(src_wavelengths, dtype=torch.float64)
    dst = torch.as_tensor(dst_wavelengths, dtype=torch.float64)
    if x.ndim < 3 or x.shape[-3] != len(src):
        raise ValueError(f"resample_bands: expected (C,H,W) or (B,C,H,W) with C={len(src)}, got {tuple(x.shape)}")
    if len(src) > 1 and not bool((src[1:] > src[:-1]).all()):
        raise ValueError("resample_bands: src_wavelengths must increase strictly")
    outside = dst[(dst < src[0] - 1e-9) | (dst > src[-1] + 1e-9)]
    if len(outside):
        raise ValueError(f"resample_bands: target wavelengths {outside.tolist()} nm fall outside the source "
                         f"range [{src[0].item():g}, {src[-1].item():g}] nm (no extrapolation)")
    lo = (torch.searchsorted(src, dst, right=True) - 1).clamp(0, max(len(src) - 2, 0))
    hi = (lo + 1).clamp(max=len(src) - 1)
    span = (src[hi] - src[lo]).clamp(min=1e-12)
    weight = ((dst - src[lo]) / span).clamp(0, 1).to(x.dtype)[:, None, None]
    # lerp is exact at both ends (weight 0 -> start, weight 1 -> end)
    return torch.lerp(x.index_select(-3, lo.to(x.device)), x.index_select(-3, hi.to(x.device)), weight.to(x.device))
