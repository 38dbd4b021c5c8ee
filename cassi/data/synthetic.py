"""Synthetic hyperspectral scenes that behave like real ones.

A scene is a piecewise-smooth image of a few materials under one illuminant:

* **layout**: Voronoi cells with softly warped (but sharp) borders, plus a
  few discs painted on top; every region carries one material;
* **materials**: smooth reflectance spectra in [0.02, 0.95], each a constant
  plus one to three broad Gaussian bumps (σ 25–90 nm) and, for about half of
  them, a sigmoid edge (like the red edge of leaves, skin or red paint); each
  region scales and slightly tilts its material's spectrum;
* **intensity**: a low-frequency shading field times (1 + a per-region amount
  of fine texture); it is the same for every band, so spectra stay smooth and
  the spectrum of a pixel, normalised to unit norm, is constant per region;
* **illuminant**: a black body of 3500–7500 K, normalised to 1 at its maximum.

The cube is scaled so that its maximum lies in [0.9, 1.0]. All randomness
comes from a local ``torch.Generator``: the global RNG state is never read
or changed.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from cassi._checks import check_int

__all__ = ["default_wavelengths", "synthetic_cube", "synthetic_batch"]

_F64 = torch.float64


def default_wavelengths(bands: int = 28) -> torch.Tensor:
    """(bands,) float64 wavelengths in nm, evenly spread over 450–650 nm."""
    check_int("bands", bands)
    return torch.linspace(450.0, 650.0, bands, dtype=_F64)


def _uniform(g: torch.Generator, lo: float, hi: float, n: int | Sequence[int] = ()) -> torch.Tensor:
    shape = (n,) if isinstance(n, int) else tuple(n)
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=_F64)


def _smooth_field(g: torch.Generator, h: int, w: int, grid: tuple[int, int], mode: str) -> torch.Tensor:
    """(h, w) float32 field: N(0, 1) values on a coarse grid, interpolated up."""
    coarse = torch.randn((1, 1, *grid), generator=g)
    kw = {} if mode == "nearest" else {"align_corners": True}
    return F.interpolate(coarse, size=(h, w), mode=mode, **kw)[0, 0]


def _spectra(g: torch.Generator, wl: torch.Tensor, n: int) -> torch.Tensor:
    """(n, C) smooth reflectance spectra in [0.03, 0.95] at wavelengths wl (nm)."""
    lo_nm, hi_nm = min(380.0, float(wl.min())), max(750.0, float(wl.max()))
    grid = torch.cat([torch.linspace(lo_nm, hi_nm, 256, dtype=_F64), wl])  # dense grid, then wl
    out = []
    for _ in range(n):
        k = int(torch.randint(1, 4, (1,), generator=g))
        mu, sig, amp = _uniform(g, 380, 720, k), _uniform(g, 25, 90, k), _uniform(g, -1, 1, k)
        raw = (amp[:, None] * torch.exp(-0.5 * ((grid[None] - mu[:, None]) / sig[:, None]) ** 2)).sum(0)
        if float(torch.rand((), generator=g)) < 0.5:  # sigmoid edge: leaf / skin / red paint
            edge, width, b = _uniform(g, 480, 700), _uniform(g, 10, 30), _uniform(g, -1.5, 1.5)
            raw = raw + b * torch.sigmoid((grid - edge) / width)
        dense = raw[:256]
        lo = float(_uniform(g, 0.03, 0.5))
        hi = lo + float(_uniform(g, 0.15, 0.95 - lo))
        span = float(dense.max() - dense.min())
        unit = (raw[256:] - dense.min()) / span if span > 1e-12 else torch.full_like(wl, 0.5)
        out.append(lo + (hi - lo) * unit)
    return torch.stack(out)


def _blackbody(wl_nm: torch.Tensor, temperature: float) -> torch.Tensor:
    """Planck's law at wl_nm for a temperature in K, normalised to max 1."""
    c2 = 1.438777e7  # h c / k in nm K
    rad = wl_nm.pow(-5) / torch.expm1(c2 / (wl_nm * temperature))
    return rad / rad.max()


def synthetic_cube(
    height: int = 256,
    width: int = 256,
    bands: int = 28,
    wavelengths: Sequence[float] | torch.Tensor | None = None,
    seed: int = 0,
    n_materials: int = 6,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A deterministic synthetic hyperspectral scene (see the module docstring).

    Args:
        height, width: spatial size H, W (any ints >= 1).
        bands: number of bands C, used only when ``wavelengths`` is None; the
            bands then sit evenly over 450–650 nm (:func:`default_wavelengths`).
        wavelengths: (C,) band centres in nm (positive, finite); when given,
            C = len(wavelengths) and ``bands`` is ignored.
        seed: the scene; the same seed always gives the same cube.
        n_materials: number of distinct material spectra (every one is used,
            if the image has room for it).
        dtype: floating dtype of the result.

    Returns:
        (C, H, W) tensor of ``dtype`` on the CPU, values in [0, 1], max in
        [0.9, 1.0].
    """
    check_int("height", height)
    check_int("width", width)
    check_int("n_materials", n_materials)
    check_int("seed", seed, minimum=0)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if wavelengths is None:
        wl = default_wavelengths(bands)
    else:
        wl = torch.as_tensor(wavelengths, dtype=_F64).cpu()
        if wl.ndim != 1 or wl.numel() < 1 or not bool(torch.isfinite(wl).all() and (wl > 0).all()):
            raise ValueError(f"wavelengths must be a non-empty 1-D sequence of positive finite nm, got {wavelengths!r}")
    g = torch.Generator().manual_seed(seed)
    h, w = height, width

    # Layout: warped Voronoi cells (materials 0..n-1 all used first), then discs.
    n_cells = int(torch.randint(n_materials + 2, 3 * n_materials + 3, (1,), generator=g))
    cell_mat = torch.cat([torch.randperm(n_materials, generator=g),
                          torch.randint(n_materials, (n_cells - n_materials,), generator=g)])
    n_discs = int(torch.randint(2, 6, (1,), generator=g))
    disc_mat = torch.randint(n_materials, (n_discs,), generator=g)
    scale = float(max(h, w))
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / scale
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / scale
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    wy = yy + 0.04 * _smooth_field(g, h, w, (5, 5), "bicubic")
    wx = xx + 0.04 * _smooth_field(g, h, w, (5, 5), "bicubic")
    centres = torch.rand((n_cells, 2), generator=g) * torch.tensor([h / scale, w / scale])
    d2 = (wy.reshape(-1, 1) - centres[:, 0]) ** 2 + (wx.reshape(-1, 1) - centres[:, 1]) ** 2
    region = d2.argmin(1).reshape(h, w)
    disc = torch.rand((n_discs, 3), generator=g)
    for i in range(n_discs):
        cy, cx, r = disc[i, 0] * h / scale, disc[i, 1] * w / scale, 0.04 + 0.12 * disc[i, 2]
        region[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = n_cells + i
    materials = torch.cat([cell_mat, disc_mat])
    n_regions = materials.numel()

    # Spectra: one per material, scaled and slightly tilted per region, times the illuminant.
    refl = _spectra(g, wl, n_materials)[materials]
    gain = _uniform(g, 0.7, 0.95, n_regions)[:, None]
    tilt = 1 + _uniform(g, -0.05, 0.05, n_regions)[:, None] * ((wl - 550) / 100).clamp(-1, 1)
    refl = (refl * gain * tilt).clamp(0.02, 0.95)
    light = _blackbody(wl, float(_uniform(g, 3500, 7500)))
    radiance = (refl * light).to(torch.float32)  # (regions, C)

    # Intensity, shared by all bands: smooth shading x (1 + per-region texture).
    shading = 0.75 + 0.2 * _smooth_field(g, h, w, (4, 4), "bicubic")
    shading = shading + 0.15 * (_uniform(g, -1, 1) * (yy - yy.mean()) + _uniform(g, -1, 1) * (xx - xx.mean())).float()
    fine = 0.6 * _smooth_field(g, h, w, (max(2, h // 8), max(2, w // 8)), "bilinear")
    fine = fine + 0.5 * torch.randn((h, w), generator=g)
    fine = fine.clamp(-2.5, 2.5) / 2.5
    texture = (0.3 * torch.rand((n_regions,), generator=g) ** 2)[region]
    intensity = (shading * (1 + texture * fine)).clamp(0.1, 1.5)

    cube = radiance.t()[:, region.reshape(-1)].reshape(-1, h, w) * intensity
    peak = 0.9 + 0.1 * float(torch.rand((), generator=g))
    return (cube * (peak / cube.max())).clamp(0, 1).to(dtype)


def synthetic_batch(
    batch: int,
    height: int = 256,
    width: int = 256,
    bands: int = 28,
    wavelengths: Sequence[float] | torch.Tensor | None = None,
    seed: int = 0,
    n_materials: int = 6,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(B, C, H, W) stack of ``batch`` distinct :func:`synthetic_cube` scenes.

    The per-sample seeds are drawn from ``seed`` (deterministic), so batches
    with different seeds do not share scenes. Other arguments as in
    :func:`synthetic_cube`.
    """
    check_int("batch", batch)
    check_int("seed", seed, minimum=0)
    seeds = torch.randint(2**62, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    return torch.stack([synthetic_cube(height, width, bands, wavelengths, s, n_materials, dtype) for s in seeds])
