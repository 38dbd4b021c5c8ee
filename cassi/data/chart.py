"""Spectral test charts built from measured reflectances, and random chart-like training scenes.

**The test chart** (:func:`color_chart`, :class:`ColorChart`): the 24 patches of the X-Rite (Macbeth)
ColorChecker Classic with the reflectances measured by N. Ohta (1997) ("ColorChecker N Ohta" in
``colour.SDS_COLOURCHECKERS``: 380–780 nm every 5 nm, as published by the Munsell Color Science Laboratory,
RIT), which the ``colour-science`` package (a dependency, BSD-3-Clause) ships; linearly interpolated at the
band centres. Lit by CIE illuminant D65 (``colour.SDS_ILLUMINANTS["D65"]``, normalised to 1 at its maximum
over the bands). Nothing is downloaded: the data come from the installed package. Layout at 256² (other
sizes scale it):

* a table of light wood (a mixture of the "light skin" and "orange yellow" reflectances) with meandering
  darker grain ("dark skin") about 9 px apart, running along w, and fibres along it, filling the frame;
* on it the ColorChecker's black card ("black 2" reflectance, with a fine paper grain), 248 × 168 px,
  holding the 4 × 6 patches in their usual order (dark skin … black), 32 px squares 8 px apart: sharp spectral
  edges on a dark frame;
* a fine grain on every patch (±3 %) and light falling off smoothly from the top left (about 1.0 to 0.75 at
  the bottom right, plus a mild vignette): shading shared by all bands.

Pixel (h, w) of patch k is ``spectra[k] · I(h, w)`` with ``spectra[k]`` = reflectance_k × D65 × gain (gain:
the white patch peaks at 0.9) and I the shading × texture (≈ 1 on average over a patch): its spectrum is
the patch's reflectance × illuminant up to a scalar. The label map ``regions`` marks patch k with k (1…24)
and everything else with 0, so a reconstruction can be averaged over each patch and compared with it.

**Random charts** (:func:`random_chart`, :class:`RandomCharts`): chart-like training and validation scenes
that are never the test chart: random grids (2–6 × 2–8 cells, random size, gap, placement, sometimes
rotated, half of them on a card) of patches on a random surface (a dark card, a grain of two reflectances at
any angle and period 4–20 px, or a plain one), plus up to two Siemens stars, bar groups or discs; each patch's
reflectance is a random convex mixture of 1–3 of the 24 measured spectra times a smooth random
perturbation and gain (or, one time in seven, a generated smooth spectrum as in ``cassi.data.synthetic``);
random textures and shading; lit by a black body of 3000–9000 K or a CIE daylight of 4000–10000 K; the
brightest pixel at 0.6–1.0. All randomness comes from a local ``torch.Generator``.
"""
from __future__ import annotations

import math
from functools import lru_cache
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cassi._checks import check_int
from cassi.io.spectral import band_wavelengths

__all__ = ["CHECKER", "PATCH_NAMES", "checker_reflectances", "illuminant_spectrum", "color_chart", "random_chart",
           "ColorChart", "RandomCharts"]

CHECKER = "ColorChecker N Ohta"  #: the colour-science data set of the 24 measured reflectances
#: The 24 patches in chart order (rows of six, top left first), as colour-science names them.
PATCH_NAMES = ("dark skin", "light skin", "blue sky", "foliage", "blue flower", "bluish green", "orange",
               "purplish blue", "moderate red", "purple", "yellow green", "orange yellow", "blue", "green", "red",
               "yellow", "magenta", "cyan", "white 9.5 (.05 D)", "neutral 8 (.23 D)", "neutral 6.5 (.44 D)",
               "neutral 5 (.70 D)", "neutral 3.5 (1.05 D)", "black 2 (1.5 D)")
WHITE_PEAK = 0.9   # the test chart's white patch peaks at this value (unit shading)
_F64 = torch.float64


def _wl(wavelengths) -> torch.Tensor:
    """(C,) float64 nm from a list/tensor or a band-set name ('tsa', 'cave')."""
    if wavelengths is None:
        raise ValueError("a chart is made from spectra: it needs wavelengths (nm per band, 'tsa' or 'cave'), not null")
    wl = torch.as_tensor(band_wavelengths(wavelengths), dtype=_F64)
    if wl.ndim != 1 or wl.numel() < 1 or not bool(torch.isfinite(wl).all() and (wl > 0).all()):
        raise ValueError(f"wavelengths must be a non-empty 1-D sequence of positive finite nm, got {wavelengths!r}")
    return wl


def _sample(sd_wavelengths, values, wl: torch.Tensor) -> torch.Tensor:
    """A tabulated spectrum linearly interpolated at wl (held constant beyond its ends)."""
    return torch.from_numpy(np.interp(wl.numpy(), np.asarray(sd_wavelengths, np.float64),
                                      np.asarray(values, np.float64)))


@lru_cache(maxsize=8)
def _reflectances(wl: tuple[float, ...]) -> torch.Tensor:
    import colour

    sds = colour.SDS_COLOURCHECKERS[CHECKER]
    return torch.stack([_sample(sds[n].wavelengths, sds[n].values, torch.tensor(wl, dtype=_F64))
                        for n in PATCH_NAMES])


def checker_reflectances(wavelengths="tsa") -> torch.Tensor:
    """(24, C) float64: the ColorChecker's measured reflectances (Ohta 1997, via colour-science) at the band
    centres, in chart order (:data:`PATCH_NAMES`)."""
    return _reflectances(tuple(_wl(wavelengths).tolist())).clone()


def _blackbody(wl: torch.Tensor, kelvin: float) -> torch.Tensor:
    c2 = 1.438777e7  # h c / k in nm K
    return wl.pow(-5) / torch.expm1(c2 / (wl * kelvin))


def illuminant_spectrum(illuminant="D65", wavelengths="tsa") -> torch.Tensor:
    """(C,) float64 relative spectral power at the band centres, normalised to 1 at its maximum over them.

    ``illuminant``: a name of ``colour.SDS_ILLUMINANTS`` ("D65", "A", "F2", …), a number (a black body of
    that many kelvin) or ("D", cct): the CIE daylight of that correlated colour temperature."""
    wl = _wl(wavelengths)
    if isinstance(illuminant, (int, float)) and not isinstance(illuminant, bool):
        spd = _blackbody(wl, float(illuminant))
    elif isinstance(illuminant, (tuple, list)) and len(illuminant) == 2 and illuminant[0] == "D":
        import colour

        sd = colour.sd_CIE_illuminant_D_series(colour.temperature.CCT_to_xy_CIE_D(float(illuminant[1])))
        spd = _sample(sd.wavelengths, sd.values, wl)
    elif isinstance(illuminant, str):
        import colour

        if illuminant not in colour.SDS_ILLUMINANTS:
            raise ValueError(f"unknown illuminant {illuminant!r}: a name of colour.SDS_ILLUMINANTS (e.g. 'D65'), "
                             f"a black-body temperature in K or ('D', cct)")
        sd = colour.SDS_ILLUMINANTS[illuminant]
        spd = _sample(sd.wavelengths, sd.values, wl)
    else:
        raise ValueError(f"illuminant must be a name, a temperature in K or ('D', cct), got {illuminant!r}")
    return spd / spd.max()


# ----------------------------------------------------------------------------- drawing

def _grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates (row, col) in px, float64 (H, W) each."""
    return torch.meshgrid(torch.arange(h, dtype=_F64) + 0.5, torch.arange(w, dtype=_F64) + 0.5, indexing="ij")


def _noise(g: torch.Generator, h: int, w: int, sigma: float = 0.0, stretch: tuple[float, float] = (1.0, 1.0)):
    """(H, W) float64 N(0, 1) noise, optionally blurred by a Gaussian of ``sigma`` px (times ``stretch`` per
    axis: fibres), renormalised to unit standard deviation."""
    n = torch.randn((1, 1, h, w), generator=g, dtype=_F64)
    for axis, s in enumerate((sigma * stretch[0], sigma * stretch[1])):
        if s > 0:
            r = max(1, math.ceil(3 * s))
            k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=_F64) / s) ** 2)
            k = (k / k.sum()).reshape((1, 1, -1, 1) if axis == 0 else (1, 1, 1, -1))
            pad = (0, 0, r, r) if axis == 0 else (r, r, 0, 0)
            n = F.conv2d(F.pad(n, pad, mode="replicate" if min(h, w) <= r else "reflect"), k)
    n = n[0, 0]
    return n / n.std().clamp_min(1e-12) if n.numel() > 1 else n * 0


def _smooth_field(g: torch.Generator, h: int, w: int, grid: int) -> torch.Tensor:
    coarse = torch.randn((1, 1, grid, grid), generator=g, dtype=_F64)
    return F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=True)[0, 0]


def _star(yy, xx, cy, cx, radius, spokes: int, phase: float = 0.0):
    """(inside, which): pixels within ``radius`` of (cy, cx) and which of the two alternating spoke colours
    they take (0/1)."""
    inside = (yy - cy) ** 2 + (xx - cx) ** 2 < radius ** 2
    angle = torch.atan2(yy - cy, xx - cx) + phase
    which = torch.floor(angle / (2 * math.pi) * 2 * spokes).long() % 2
    return inside, which


def _bars(coord, start, period: float):
    """0/1 along ``coord``: bars of half a period each, from ``start``."""
    return torch.floor((coord - start) / (period / 2)).long() % 2


class _Canvas:
    """A scene as a material index per pixel (into a list of spectra), an intensity per pixel and a
    patch label map."""

    def __init__(self, h: int, w: int, background: torch.Tensor):
        self.h, self.w = h, w
        self.spectra = [background]
        self.grains: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # material -> (second spectrum, weight map)
        self.material = torch.zeros((h, w), dtype=torch.long)
        self.regions = torch.zeros((h, w), dtype=torch.long)
        self.texture = torch.zeros((h, w), dtype=_F64)  # relative intensity texture (added to 1)

    def add(self, spectrum: torch.Tensor, second: torch.Tensor | None = None,
            weight: torch.Tensor | None = None) -> int:
        """A material: one spectrum, or (with ``second`` and an (H, W) ``weight`` in [0, 1]) a grain of two,
        spectrum · weight + second · (1 − weight) per pixel."""
        self.spectra.append(spectrum)
        if second is not None:
            self.grains[len(self.spectra) - 1] = (second, weight)
        return len(self.spectra) - 1

    def paint(self, where: torch.Tensor, material: int | torch.Tensor, texture: torch.Tensor | None = None,
              region: int | None = None) -> None:
        self.material[where] = material if isinstance(material, int) else material[where]
        self.texture[where] = 0.0 if texture is None else texture[where]
        self.regions[where] = region or 0

    def render(self, light: torch.Tensor, shading: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, H, W) radiance = spectrum × light × shading × (1 + texture), and the (M, C) radiance table."""
        table = torch.stack(self.spectra) * light  # (M, C)
        intensity = (shading * (1 + self.texture)).clamp_min(0)
        cube = table.t()[:, self.material.reshape(-1)].reshape(-1, self.h, self.w)
        for m, (second, weight) in self.grains.items():
            sel = self.material == m
            if bool(sel.any()):
                wt = weight[sel]
                cube[:, sel] = table[m][:, None] * wt + (second * light)[:, None] * (1 - wt)
        return cube * intensity, table


def _grain(g: torch.Generator, yy: torch.Tensor, xx: torch.Tensor, period: float, angle: float, warp: float,
           sharpness: float = 4.0) -> torch.Tensor:
    """(H, W) weight in [0, 1]: bands of ``period`` px across the direction ``angle`` (0: lines along w, i.e. the
    bands vary down the frame), meandering by ``warp`` periods (a smooth random field), edges softened by
    ``sharpness`` (wood grain, brushed or woven surfaces)."""
    h, w = yy.shape
    t = yy * math.cos(angle) + xx * math.sin(angle)
    t = t + warp * period * _smooth_field(g, h, w, 4)
    return torch.sigmoid(sharpness * torch.sin(2 * math.pi * t / period))


# ----------------------------------------------------------------------------- the test chart

def color_chart(height: int = 256, width: int = 256, wavelengths="tsa", illuminant="D65",
                dtype: torch.dtype = torch.float32) -> dict:
    """The spectral test chart (see the module docstring); deterministic.

    Returns {"x": (C, H, W) ``dtype`` in [0, 1], "regions": (H, W) int64 (patch k = k for k in 1…24, 0 elsewhere;
    patches too small to draw at this size are absent), "spectra": (24, C) float64 each patch's reflectance ×
    illuminant × gain (its radiance under unit shading), "names": the 24 patch names}."""
    check_int("height", height)
    check_int("width", width)
    wl = _wl(wavelengths)
    refl = checker_reflectances(wl)
    light = illuminant_spectrum(illuminant, wl)
    gain = WHITE_PEAK / float((refl[PATCH_NAMES.index("white 9.5 (.05 D)")] * light).max())
    h, w = height, width
    sy, sx = h / 256, w / 256
    g = torch.Generator().manual_seed(20251)  # the chart's fixed grain
    yy, xx = _grid(h, w)
    idx = {n: i for i, n in enumerate(PATCH_NAMES)}
    # the table: light wood ("light skin" and "orange yellow") with darker grain ("dark skin"), fibres along it
    early = 0.55 * refl[idx["light skin"]] + 0.45 * refl[idx["orange yellow"]]
    canvas = _Canvas(h, w, early)
    wood = canvas.add(early, refl[idx["dark skin"]],
                      _grain(g, yy / sy, xx / sx, period=9.0, angle=0.0, warp=0.5, sharpness=2.0))
    canvas.paint(torch.ones_like(canvas.material, dtype=torch.bool), wood,
                 0.06 * _noise(g, h, w, sigma=1.0, stretch=(0.3, 3.0)))
    # the card: the ColorChecker's black frame, with a fine paper grain
    card = canvas.add(refl[idx["black 2 (1.5 D)"]] * 0.9)
    inside = (yy >= round(44 * sy)) & (yy < round(212 * sy)) & (xx >= round(4 * sx)) & (xx < round(252 * sx))
    canvas.paint(inside, card, 0.10 * _noise(g, h, w, sigma=0.6))
    # the 24 patches in chart order, 32 px squares 8 px apart, with a fine grain
    grain = 0.03 * _noise(g, h, w, sigma=0.5)
    for k in range(24):
        r, c = divmod(k, 6)
        y0, y1 = round((52 + 40 * r) * sy), round((84 + 40 * r) * sy)
        x0, x1 = round((12 + 40 * c) * sx), round((44 + 40 * c) * sx)
        if y1 > y0 and x1 > x0:
            canvas.paint((yy >= y0) & (yy < y1) & (xx >= x0) & (xx < x1), canvas.add(refl[k]), grain, region=k + 1)
    # light falling off from the top left, and a mild vignette
    u, v = xx / w, yy / h
    shading = 1.0 - 0.12 * (u + v) - 0.1 * ((u - 0.5) ** 2 + (v - 0.5) ** 2)
    cube, _ = canvas.render(light * gain, shading)
    return {"x": cube.clamp(0, 1).to(dtype), "regions": canvas.regions, "spectra": refl * light * gain,
            "names": list(PATCH_NAMES)}


# ----------------------------------------------------------------------------- random charts

def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=g, dtype=_F64))


def _random_reflectance(g: torch.Generator, wl: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """A reflectance near the measured family: a random convex mixture of 1–3 of ``basis`` times a smooth random
    perturbation and gain; one time in seven a generated smooth spectrum (cassi.data.synthetic)."""
    if float(torch.rand((), generator=g)) < 1 / 7:
        from cassi.data.synthetic import _spectra

        return _spectra(g, wl, 1)[0]
    k = int(torch.randint(1, 4, (), generator=g))
    pick = torch.randperm(basis.shape[0], generator=g)[:k]
    weights = -torch.log(torch.rand(k, generator=g, dtype=_F64).clamp_min(1e-12))  # Dirichlet(1, …, 1)
    r = (weights / weights.sum()) @ basis[pick]
    bump = torch.zeros_like(wl)
    for _ in range(int(torch.randint(0, 3, (), generator=g))):
        mu, sig, amp = _uniform(g, 420, 680), _uniform(g, 15, 80), _uniform(g, -0.5, 0.5)
        bump = bump + amp * torch.exp(-0.5 * ((wl - mu) / sig) ** 2)
    tilt = _uniform(g, -0.3, 0.3) * (wl - 550) / 100
    return (r * torch.exp(bump + tilt) * _uniform(g, 0.5, 1.4)).clamp(0.005, 1.0)


def _random_light(g: torch.Generator, wl: torch.Tensor) -> torch.Tensor:
    if float(torch.rand((), generator=g)) < 0.5:
        return illuminant_spectrum(_uniform(g, 3000, 9000), wl)
    return illuminant_spectrum(("D", _uniform(g, 4000, 10000)), wl)


def random_chart(height: int = 256, width: int = 256, wavelengths="tsa", seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> dict:
    """A random chart-like scene (see the module docstring); the same seed gives the same scene.

    Returns {"x": (C, H, W) ``dtype`` in [0, 1] (max in [0.6, 1.0]), "regions": (H, W) int64 (grid patches 1…K,
    0 elsewhere)}."""
    check_int("height", height)
    check_int("width", width)
    check_int("seed", seed, minimum=0)
    wl = _wl(wavelengths)
    basis = checker_reflectances(wl)
    g = torch.Generator().manual_seed(seed)
    h, w = height, width
    yy, xx = _grid(h, w)
    side = min(h, w)

    def texture() -> torch.Tensor:
        kind = float(torch.rand((), generator=g))
        amp = _uniform(g, 0.0, 0.08)
        if kind < 0.6:  # grain
            return amp * _noise(g, h, w, sigma=_uniform(g, 0.0, 1.2))
        if kind < 0.8:  # fibres or a weave, along or across
            along = float(torch.rand((), generator=g)) < 0.5
            return 2 * amp * _noise(g, h, w, sigma=_uniform(g, 0.5, 1.5), stretch=(0.3, 3.0) if along else (3.0, 0.3))
        period = _uniform(g, 2.0, 8.0)  # a fine printed pattern: stripes or a checker
        a, b = _bars(xx, _uniform(g, 0, period), period), _bars(yy, _uniform(g, 0, period), period)
        pat = {0: a, 1: b, 2: a ^ b}[int(torch.randint(0, 3, (), generator=g))].to(_F64)
        return _uniform(g, 0.05, 0.4) * (pat - 0.5)

    def dark() -> torch.Tensor:
        return basis[PATCH_NAMES.index("black 2 (1.5 D)")] * _uniform(g, 0.5, 2.5)

    def surface() -> int:  # a dark card, a grain of two reflectances (wood, brushed, woven) or a plain one
        kind = float(torch.rand((), generator=g))
        if kind < 0.35:
            return canvas.add(dark())
        if kind < 0.7:
            weight = _grain(g, yy, xx, period=_uniform(g, 4, 20), angle=_uniform(g, 0, math.pi),
                            warp=_uniform(g, 0, 1), sharpness=_uniform(g, 1, 6))
            return canvas.add(_random_reflectance(g, wl, basis), _random_reflectance(g, wl, basis), weight)
        return canvas.add(_random_reflectance(g, wl, basis))

    canvas = _Canvas(h, w, dark())
    everywhere = torch.ones((h, w), dtype=torch.bool)
    canvas.paint(everywhere, surface(), texture())

    # the grid of patches, in a random box, sometimes rotated about its centre, sometimes on a card
    rows, cols = int(torch.randint(2, 7, (), generator=g)), int(torch.randint(2, 9, (), generator=g))
    bh, bw = _uniform(g, 0.5, 1.0) * h, _uniform(g, 0.5, 1.0) * w
    top, left = _uniform(g, 0, h - bh), _uniform(g, 0, w - bw)
    angle = _uniform(g, -0.2, 0.2) if float(torch.rand((), generator=g)) < 0.3 else 0.0
    cy, cx = top + bh / 2, left + bw / 2
    ry = cy + (yy - cy) * math.cos(angle) - (xx - cx) * math.sin(angle)
    rx = cx + (yy - cy) * math.sin(angle) + (xx - cx) * math.cos(angle)
    if float(torch.rand((), generator=g)) < 0.5:
        canvas.paint((ry >= top) & (ry < top + bh) & (rx >= left) & (rx < left + bw), surface(), texture())
    gap = _uniform(g, 0.08, 0.35)
    ph, pw = bh / rows, bw / cols
    label = 0
    for r in range(rows):
        for c in range(cols):
            y0, x0 = top + r * ph + gap * ph / 2, left + c * pw + gap * pw / 2
            where = (ry >= y0) & (ry < y0 + ph * (1 - gap)) & (rx >= x0) & (rx < x0 + pw * (1 - gap))
            if bool(where.any()):
                label += 1
                canvas.paint(where, canvas.add(_random_reflectance(g, wl, basis)), texture(), region=label)

    # extras painted over it: Siemens stars, bar groups, discs
    for _ in range(int(torch.randint(0, 3, (), generator=g))):
        kind = int(torch.randint(0, 3, (), generator=g))
        a, b = canvas.add(_random_reflectance(g, wl, basis)), canvas.add(_random_reflectance(g, wl, basis))
        oy, ox = _uniform(g, 0, h), _uniform(g, 0, w)
        if kind == 0:
            inside, which = _star(yy, xx, oy, ox, _uniform(g, 0.08, 0.25) * side,
                                  int(torch.randint(6, 25, (), generator=g)), _uniform(g, 0, math.pi))
            canvas.paint(inside, torch.where(which == 0, a, b), texture())
        elif kind == 1:
            bh2, bw2 = _uniform(g, 0.06, 0.3) * h, _uniform(g, 0.06, 0.4) * w
            box = (yy >= oy) & (yy < oy + bh2) & (xx >= ox) & (xx < ox + bw2)
            period = _uniform(g, 2.0, 12.0)
            bars = _bars(xx, ox, period) if float(torch.rand((), generator=g)) < 0.5 else _bars(yy, oy, period)
            canvas.paint(box, torch.where(bars == 0, a, b), texture())
        else:
            canvas.paint((yy - oy) ** 2 + (xx - ox) ** 2 < (_uniform(g, 0.03, 0.15) * side) ** 2, a, texture())

    u, v = xx / w - 0.5, yy / h - 0.5
    shading = (1 + _uniform(g, 0, 0.2) * _smooth_field(g, h, w, 4) + _uniform(g, -0.3, 0.3) * u
               + _uniform(g, -0.3, 0.3) * v - _uniform(g, 0, 0.3) * (u ** 2 + v ** 2)).clamp(0.3, 1.5)
    cube, _ = canvas.render(_random_light(g, wl), shading)
    peak = _uniform(g, 0.6, 1.0)
    cube = cube * (peak / cube.max().clamp_min(1e-12))
    return {"x": cube.clamp(0, 1).to(dtype), "regions": canvas.regions}


# ----------------------------------------------------------------------------- datasets

class ColorChart(Dataset):
    """The spectral test chart (:func:`color_chart`) as a one-scene dataset, for ``data.test`` / ``data.predict``.

    Item: {"x": (C, H, W) float32, "name", "regions": (H, W) int64 (patch k = k, 0 elsewhere)}; attributes
    ``wavelengths`` (nm), ``region_names`` (the 24 patch names), ``spectra`` ((24, C) reflectance × illuminant ×
    gain), ``seeds`` (empty: it is no random scene, so it overlaps no generated split)."""

    def __init__(self, height: int = 256, width: int = 256, wavelengths="tsa", illuminant="D65",
                 name: str | None = None):
        self.height, self.width, self.illuminant = height, width, illuminant
        self.wavelengths = _wl(wavelengths).tolist()
        self.name = name or f"colorchecker_{str(illuminant).lower()}"
        self.region_names = list(PATCH_NAMES)
        self.seeds = range(0)
        self._item: dict | None = None

    @property
    def spectra(self) -> torch.Tensor:
        return self._chart()["spectra"]

    def _chart(self) -> dict:
        if self._item is None:
            self._item = color_chart(self.height, self.width, self.wavelengths, self.illuminant)
        return self._item

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict:
        if not -1 <= index < 1:
            raise IndexError(index)
        chart = self._chart()
        return {"x": chart["x"].clone(), "name": self.name, "regions": chart["regions"].clone()}


class RandomCharts(Dataset):
    """``n`` random chart-like scenes (:func:`random_chart`), generated lazily: sample i is seed ``seed + i``,
    named ``chart_<seed+i>``; ``seeds`` is that range (splits are checked for overlap).

    Item: {"x": (C, H, W) float32, "name", "regions": (H, W) int64}."""

    def __init__(self, n: int, height: int = 256, width: int = 256, wavelengths="tsa", seed: int = 0):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        self.n, self.height, self.width, self.seed = n, height, width, seed
        self.wavelengths = _wl(wavelengths).tolist()
        self.seeds = range(seed, seed + n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        s = self.seeds[index]
        chart = random_chart(self.height, self.width, self.wavelengths, seed=s)
        return {"x": chart["x"], "name": f"chart_{s}", "regions": chart["regions"]}
