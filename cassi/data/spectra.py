"""Measured spectra for generated scenes: reflectances, illuminants, and a lookup from RGB to spectra.

* :func:`reflectances`: measured reflectance spectra of the chosen sources (colour-science's sets always; earthlib
  and psychtoolbox once fetched, :mod:`cassi.data.sources`) at a camera's band centres, (N, C) in [0, 1]. A spectrum
  is kept when its measured range covers the bands (up to ``reach`` nm beyond its ends, held flat).
* :func:`random_illuminant`: a light source at the band centres, (C,), mean 1: black bodies, CIE daylight,
  or one of colour-science's measured illuminants and lamps.
* :class:`RGBToSpectrum`: linear sRGB (…, 3) → spectra (…, C): the average of the nearest measured spectra (each
  scaled to the colour), corrected by smooth functions so that the spectrum's sRGB under D65 equals the input
  exactly; a lookup on a 17³ grid of colours, built per scene from a random part of the library (so that the same
  colour gets a different spectrum in another scene).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from cassi.data.sources import source_dir

__all__ = ["REFLECTANCE_SOURCES", "Spectra", "reflectances", "random_illuminant", "RGBToSpectrum"]

REFLECTANCE_SOURCES = ("colour", "earthlib", "psychtoolbox")
_GRID = np.arange(380.0, 781.0, 5.0)  # the visible grid on which colours (sRGB under D65) are computed


@dataclass(frozen=True)
class Spectra:
    """(N, C) float64 spectra at ``wavelengths`` (nm), with each one's ``names`` and ``sources``."""
    values: torch.Tensor
    wavelengths: tuple[float, ...]
    names: tuple[str, ...]
    sources: tuple[str, ...]

    def __len__(self) -> int:
        return self.values.shape[0]


# ---------------------------------------------------------------------------------------------- loading sources
def _colour_sets() -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    """colour-science's reflectance sets as [(wavelengths (L,), values (N, L), names)]."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import colour
        from colour.characterisation import SDS_COLOURCHECKERS, read_training_data_rawtoaces_v1
        from colour.quality.cfi2017 import load_TCS_CIE2017
        from colour.quality.datasets import SDS_TCS, SDS_VS
    out = []
    sets = {f"colourchecker/{k}": SDS_COLOURCHECKERS[k] for k in ("BabelColor Average", "ColorChecker N Ohta",
                                                                   "ISO 17321-1", "PMC")}
    sets.update({f"tcs/{k}": v for k, v in SDS_TCS.items()})
    sets.update({f"cqs/{k}": v for k, v in SDS_VS.items()})
    for set_name, sds in sets.items():
        for name, sd in sds.items():
            out.append((np.asarray(sd.wavelengths, float), np.asarray(sd.values, float)[None], [f"{set_name}/{name}"]))
    for set_name, msds in (("cie2017", load_TCS_CIE2017(colour.SpectralShape(380, 780, 5))),
                           ("rawtoaces190", read_training_data_rawtoaces_v1())):
        out.append((np.asarray(msds.wavelengths, float), np.asarray(msds.values, float).T,
                    [f"{set_name}/{n}" for n in msds.labels]))
    return out


def _earthlib(root) -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    """earthlib's ENVI spectral library (float32, one spectrum per line, wavelengths in micrometres)."""
    d = source_dir("earthlib", root)
    header = (d / "spectra.sli.hdr").read_text()
    fields = {}
    for key in ("samples", "lines", "data type", "byte order", "wavelength units"):
        line = next(ln for ln in header.splitlines() if ln.split("=")[0].strip() == key)
        fields[key] = line.split("=", 1)[1].strip()
    if fields["data type"] != "4":
        raise ValueError(f"{d / 'spectra.sli.hdr'}: data type {fields['data type']}, expected 4 (float32)")
    wl_text = header.split("wavelength =", 1)[1].split("{", 1)[1].split("}", 1)[0]
    wl = np.array([float(v) for v in wl_text.split(",")])
    wl = wl * 1000.0 if fields["wavelength units"].lower().startswith("micro") else wl
    dtype = "<f4" if fields["byte order"] == "0" else ">f4"
    values = np.fromfile(d / "spectra.sli", dtype=dtype).astype(float)
    values = values.reshape(int(fields["lines"]), int(fields["samples"]))
    names = header.split("spectra names =", 1)[1].split("{", 1)[1].split("}", 1)[0].split(",")
    return [(wl, values, [f"earthlib/{n.strip()}" for n in names])]


def _psychtoolbox(root) -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    """psychtoolbox's sur_*.mat files: (L, N) reflectances with S = [start, step, count] (Koivisto: ×1/4096)."""
    from scipy.io import loadmat

    d, out = source_dir("psychtoolbox", root), []
    for name in ("nickerson", "vrhel", "koivisto", "krinov", "macbeth"):
        m = loadmat(d / f"sur_{name}.mat")
        start, step, count = (int(v) for v in np.asarray(m[f"S_{name}"]).ravel())
        values = np.asarray(m[f"sur_{name}"], float).T
        values = values / 4096.0 if m[f"sur_{name}"].dtype.kind in "ui" else values
        out.append((start + step * np.arange(count, dtype=float), values,
                    [f"psychtoolbox/{name}/{i}" for i in range(values.shape[0])]))
    return out


def _resample(wl: np.ndarray, values: np.ndarray, target: np.ndarray, reach: float) -> np.ndarray:
    """Rows of ``values`` (N, L) at ``target`` (linear; held flat up to ``reach`` nm beyond the ends, NaN
    beyond), the NaN entries of a row held from its nearest measured neighbours."""
    out = np.full((values.shape[0], len(target)), np.nan)
    for i, row in enumerate(values):
        ok = np.isfinite(row)
        if ok.sum() < 2:
            continue
        w, v = wl[ok], row[ok]
        inside = (target >= w[0] - reach) & (target <= w[-1] + reach)
        out[i, inside] = np.interp(target[inside], w, v)
    return out


@functools.lru_cache(maxsize=8)
def _load(source: str, root: str | None) -> tuple:
    loader = {"colour": lambda r: _colour_sets(), "earthlib": _earthlib, "psychtoolbox": _psychtoolbox}[source]
    return tuple(loader(root))


def reflectances(wavelengths, sources=REFLECTANCE_SOURCES, root: str | os.PathLike | None = None,
                 reach: float = 10.0) -> Spectra:
    """Measured reflectances (N, C) at ``wavelengths`` (nm) from ``sources`` (names of
    :data:`REFLECTANCE_SOURCES`), clipped to [0, 1]; spectra whose range misses a band by more than ``reach`` nm,
    or that are not finite there, are left out. Raises ``ContentMissing`` (naming the fetch command) for an
    unfetched source and ValueError when no spectrum covers the bands."""
    target = np.asarray([float(w) for w in wavelengths])
    unknown = [s for s in sources if s not in REFLECTANCE_SOURCES]
    if unknown:
        raise ValueError(f"unknown reflectance sources {unknown}; known: {', '.join(REFLECTANCE_SOURCES)}")
    rows, names, origin = [], [], []
    for source in sources:
        for wl, values, labels in _load(source, None if root is None or source == "colour" else str(root)):
            r = _resample(wl, values, target, reach)
            keep = np.isfinite(r).all(1)
            rows.append(np.clip(r[keep], 0.0, 1.0))
            names += [n for n, k in zip(labels, keep) if k]
            origin += [source] * int(keep.sum())
    if not names:
        raise ValueError(f"no spectrum of {list(sources)} covers {target.min():g}-{target.max():g} nm")
    return Spectra(torch.from_numpy(np.concatenate(rows)), tuple(float(w) for w in target), tuple(names),
                   tuple(origin))


# ---------------------------------------------------------------------------------------------- illuminants
@functools.lru_cache(maxsize=8)
def _measured_illuminants(wavelengths: tuple[float, ...]) -> torch.Tensor:
    """colour-science's illuminants and light sources that cover the bands, (M, C), each of mean 1."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import colour
    target, rows = np.asarray(wavelengths), []
    for table in (colour.SDS_ILLUMINANTS, colour.SDS_LIGHT_SOURCES):
        for sd in table.values():
            wl, v = np.asarray(sd.wavelengths, float), np.asarray(sd.values, float)
            if wl[0] <= target.min() and wl[-1] >= target.max():
                row = np.interp(target, wl, v)
                if np.isfinite(row).all() and row.min() >= 0 and row.mean() > 0:
                    rows.append(row / row.mean())
    return torch.tensor(np.array(rows))


def _planck(wl_nm: torch.Tensor, kelvin: float) -> torch.Tensor:
    lam = wl_nm * 1e-9
    return 1.0 / (lam ** 5 * (torch.exp(torch.as_tensor(1.4388e-2 / (lam * kelvin), dtype=torch.float64)) - 1))


def random_illuminant(wavelengths, g: torch.Generator) -> torch.Tensor:
    """(C,) float64 light at ``wavelengths``, mean 1: with probability 0.35 a black body of 2500–10000 K, 0.35 CIE
    daylight of 4000–20000 K, else one of colour-science's measured illuminants and lamps (fluorescent, LED, …)."""
    wl = torch.as_tensor([float(w) for w in wavelengths], dtype=torch.float64)
    u, v = torch.rand(2, generator=g, dtype=torch.float64).tolist()
    if u < 0.35:
        light = _planck(wl, 2500 + 7500 * v)
    elif u < 0.7:
        light = _daylight(wl, 4000 + 16000 * v)
    else:
        table = _measured_illuminants(tuple(float(w) for w in wavelengths))
        light = table[int(v * len(table)) % len(table)] if len(table) else _planck(wl, 6500.0)
    return light / light.mean()


def _daylight(wl: torch.Tensor, cct: float) -> torch.Tensor:
    """CIE daylight at correlated colour temperature ``cct`` (colour-science's D series)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import colour
        xy = colour.temperature.CCT_to_xy_CIE_D(cct)
        sd = colour.sd_CIE_illuminant_D_series(xy)
    return torch.from_numpy(np.interp(wl.numpy(), np.asarray(sd.wavelengths, float), np.asarray(sd.values, float)))


# ---------------------------------------------------------------------------------------------- RGB -> spectrum
@functools.lru_cache(maxsize=1)
def _srgb_matrix() -> np.ndarray:
    """(3, L) on ``_GRID``: reflectance → linear sRGB under D65 (white reflectance → (1, 1, 1))."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import colour
    shape = colour.SpectralShape(float(_GRID[0]), float(_GRID[-1]), 5.0)
    cmfs = colour.MSDS_CMFS["CIE 1931 2 Degree Standard Observer"].copy().align(shape).values  # (L, 3)
    d65 = colour.SDS_ILLUMINANTS["D65"].copy().align(shape).values
    xyz = (cmfs * d65[:, None]).T  # (3, L)
    to_rgb = colour.models.RGB_COLOURSPACE_sRGB.matrix_XYZ_to_RGB
    m = to_rgb @ xyz
    return m / (m @ np.ones(len(_GRID)))[:, None]


class RGBToSpectrum:
    """Linear sRGB → reflectance spectra at ``wavelengths`` from a measured library (see the module docstring).

    ``library``: the names of :data:`REFLECTANCE_SOURCES` to draw from; ``fraction`` of it is drawn per lookup
    (:meth:`table`), and each grid colour takes the weighted mean of its ``k`` nearest spectra (nearest after each is
    scaled to the colour by least squares). ``__call__(rgb (…, 3), table)`` → (…, C), clipped to [0, 1].
    """

    def __init__(self, wavelengths, library=("colour",), root=None, k: int = 6, fraction: float = 0.5,
                 nodes: int = 17):
        self.wavelengths = tuple(float(w) for w in wavelengths)
        vis = reflectances(_GRID, library, root, reach=200.0)  # the colour needs the whole visible range
        cam = reflectances(self.wavelengths, library, root)
        common = sorted(set(vis.names) & set(cam.names))
        vi, ci = {n: i for i, n in enumerate(vis.names)}, {n: i for i, n in enumerate(cam.names)}
        self.vis = vis.values[[vi[n] for n in common]].numpy()  # (N, L)
        self.cam = cam.values[[ci[n] for n in common]].numpy()  # (N, C)
        self.m = _srgb_matrix()
        self.rgb = self.vis @ self.m.T  # (N, 3)
        # smooth spectra that move the colour: m @ basis = I (the minimum-norm solution on the visible grid)
        basis = self.m.T @ np.linalg.inv(self.m @ self.m.T)  # (L, 3)
        self.basis_cam = np.stack([np.interp(self.wavelengths, _GRID, basis[:, j]) for j in range(3)], 1)  # (C, 3)
        self.k, self.fraction, self.nodes = int(k), float(fraction), int(nodes)

    def table(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A lookup from a random ``fraction`` of the library: (C, n, n, n) spectra at the camera's bands and
        (3, n, n, n) their colours, on an n³ grid of linear sRGB in [0, 1] (index order b, g, r)."""
        n_lib = len(self.rgb)
        pick = torch.randperm(n_lib, generator=g)[:max(self.k, int(self.fraction * n_lib))].numpy()
        rgb, cam = self.rgb[pick].astype(np.float32), self.cam[pick].astype(np.float32)
        axis = np.linspace(0.0, 1.0, self.nodes)
        b, gg, r = np.meshgrid(axis, axis, axis, indexing="ij")
        target = np.stack([r.ravel(), gg.ravel(), b.ravel()], 1).astype(np.float32)  # (n³, 3)
        scale = (target @ rgb.T) / np.maximum((rgb * rgb).sum(1), 1e-12)  # (n³, N) least-squares scale
        scale = np.clip(scale, 0.0, 1.0 / np.maximum(cam.max(1), 1e-6))  # the scaled spectrum stays <= 1
        err = ((target * target).sum(1)[:, None] - 2 * scale * (target @ rgb.T)
               + scale * scale * (rgb * rgb).sum(1)[None])  # (n³, N): |t − s·rgb|²
        near = np.argpartition(err, self.k - 1, axis=1)[:, :self.k]
        w = 1.0 / (np.take_along_axis(err, near, 1) + 1e-4)
        w /= w.sum(1, keepdims=True)
        s = np.take_along_axis(scale, near, 1)
        spectra = np.einsum("nk,nk,nkc->nc", w, s, cam[near])  # (n³, C)
        colours = np.einsum("nk,nk,nkj->nj", w, s, rgb[near])  # (n³, 3)
        shape = (self.nodes,) * 3
        return (torch.from_numpy(spectra.T.reshape(-1, *shape)).float(),
                torch.from_numpy(colours.T.reshape(3, *shape)).float())

    def __call__(self, rgb: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(H, W, 3) linear sRGB in [0, 1] → (C, H, W) spectra whose colour under D65 is ``rgb`` (before clipping)."""
        spectra, colours = table
        grid = (rgb.float().clamp(0, 1) * 2 - 1)[None, None]  # (1, 1, H, W, 3): x = r, y = g, z = b
        both = torch.cat([spectra, colours])[None]  # (1, C + 3, n, n, n)
        out = F.grid_sample(both, grid, mode="bilinear", align_corners=True)[0, :, 0]  # (C + 3, H, W)
        s, c = out[:-3], out[-3:]
        fix = torch.einsum("cj,jhw->chw", torch.from_numpy(self.basis_cam).float(), rgb.permute(2, 0, 1).float() - c)
        return (s + fix).clamp(0, 1)
