"""Pictures of spectral cubes: sRGB rendered from the spectrum, band mosaics, comparisons, spectra, a report page.

Colour (``to_rgb``): each band c of a (C, H, W) cube is one sample of a spectrum at λ_c nm, integrated against
the CIE 1931 2° colour matching functions of ``colour-science``, XYZ = Σ_c x_c · cmf(λ_c) · Δλ_c (Δλ_c: the
band's width, half the distance between its neighbours). White balance: the cube's own equal-energy white
(a flat spectrum over its bands) is adapted to D65 (Bradford) and scaled to sRGB (1, 1, 1), so a flat spectrum
renders neutral grey whatever the band range. Exposure: ``"auto"`` divides by the 99th percentile of the
luminance (the brightest 1 % clip), a number multiplies (1: a flat spectrum of value 1 renders white). Then
linear sRGB -> clip to [0, 1] -> the sRGB transfer function. A cube without wavelengths, or without a band
in 380–780 nm, gets a labelled false-colour rendering instead: the mean of the first, middle and last third
of its bands as blue, green and red, with the same white balance and exposure.

Figures use matplotlib's Agg canvas (no pyplot state, no display), imported when a picture is made; every
PNG is written atomically. Importing this module loads numpy and torch only.
"""
from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = ["auto_exposure", "is_false_colour", "rendering", "to_rgb", "save_preview", "save_band_mosaic",
           "save_comparison", "save_spectra", "spectrum_points", "report_html", "save_patch_spectra",
           "method_label"]

VISIBLE = (380.0, 780.0)
_CAPTION_PX = 16     # the label strip above a preview
_MIN_PREVIEW_PX = 256  # small previews are enlarged (nearest neighbour) to at least this width


def _cube(x) -> np.ndarray:
    """(C, H, W) float64 numpy array from a tensor or array."""
    a = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
    if a.ndim != 3:
        raise ValueError(f"expected a cube (C, H, W), got shape {a.shape}")
    return a


def is_false_colour(wavelengths: Sequence[float] | None) -> bool:
    """True when the cube cannot be rendered from its spectrum: no wavelengths or none in 380–780 nm."""
    return wavelengths is None or not any(VISIBLE[0] <= w <= VISIBLE[1] for w in wavelengths)


def _thirds(c: int) -> list[range]:
    """Band index ranges of the first, middle and last third (blue, green, red); one band each when c < 3."""
    if c < 3:
        return [range(0, 1), range(c // 2, c // 2 + 1), range(c - 1, c)]
    cuts = [round(i * c / 3) for i in range(4)]
    return [range(cuts[i], cuts[i + 1]) for i in range(3)]


def rendering(wavelengths: Sequence[float] | None, bands: int | None = None) -> str:
    """A one-line description of how ``to_rgb`` renders a cube with these wavelengths."""
    if is_false_colour(wavelengths):
        c = bands if bands is not None else len(wavelengths or [])
        parts = ", ".join(f"{'BGR'[i]} = bands {r.start + 1}–{r.stop}" for i, r in enumerate(_thirds(c))) if c else ""
        why = "no wavelengths" if wavelengths is None else "no band in 380–780 nm"
        return f"FALSE COLOUR ({why}): {parts}"
    return (f"sRGB from the spectrum: CIE 1931 2°, {len(wavelengths)} bands {min(wavelengths):g}–"
            f"{max(wavelengths):g} nm, equal-energy white -> D65")


def _band_matrix(wavelengths: Sequence[float] | None, bands: int) -> np.ndarray:
    """(3, C) matrix from band values to linear sRGB, white-balanced so that a flat spectrum of 1 gives (1, 1, 1)."""
    if is_false_colour(wavelengths):
        m = np.zeros((3, bands))
        for i, r in enumerate(reversed(_thirds(bands))):  # rows R, G, B = last, middle, first third
            m[i, list(r)] = 1 / len(r)
        return m
    import colour

    wl = np.asarray(wavelengths, np.float64)
    if len(wl) != bands:
        raise ValueError(f"{len(wl)} wavelengths for a cube of {bands} bands")
    cmfs = colour.MSDS_CMFS["CIE 1931 2 Degree Standard Observer"]
    lo, hi = cmfs.wavelengths[0], cmfs.wavelengths[-1]
    inside = (wl >= lo) & (wl <= hi)
    cmf = np.zeros((bands, 3))
    cmf[inside] = cmfs[wl[inside]]  # colour-science interpolates its 1 nm table at the band centres
    s = np.sort(wl)  # band widths Δλ: from half-way to the previous band to half-way to the next (one band: 1 nm)
    mids = (s[1:] + s[:-1]) / 2
    edges = np.concatenate([[2 * s[0] - mids[0]], mids, [2 * s[-1] - mids[-1]]]) if bands > 1 else s[[0, 0]] + [-.5, .5]
    width = np.diff(edges)[np.searchsorted(s, wl)]
    to_xyz = (cmf * width[:, None]).T  # (3, C): XYZ = to_xyz @ x
    white = to_xyz.sum(1)
    d65 = colour.xy_to_XYZ(colour.CCS_ILLUMINANTS["CIE 1931 2 Degree Standard Observer"]["D65"])
    adapt = colour.adaptation.matrix_chromatic_adaptation_VonKries(white, d65, transform="Bradford")
    m = colour.RGB_COLOURSPACES["sRGB"].matrix_XYZ_to_RGB @ adapt @ to_xyz
    return m / m.sum(1, keepdims=True)  # exact (1, 1, 1) for a flat spectrum (the sRGB matrix rounds to 1e-4)


def _linear(x: np.ndarray, wavelengths: Sequence[float] | None) -> np.ndarray:
    """(C, H, W) -> (H, W, 3) white-balanced linear sRGB, M x."""
    return np.einsum("kc,chw->hwk", _band_matrix(wavelengths, x.shape[0]), x)


def _auto_gain(linear: np.ndarray) -> float:
    import colour

    luminance = linear @ colour.RGB_COLOURSPACES["sRGB"].matrix_RGB_to_XYZ[1]
    p = float(np.percentile(luminance, 99))
    return 1 / p if p > 0 else 1.0


def auto_exposure(cube, wavelengths: Sequence[float] | None = None) -> float:
    """The gain ``to_rgb(exposure="auto")`` uses: 1 / the 99th percentile of the linear luminance (1 if that is 0)."""
    return _auto_gain(_linear(_cube(cube), wavelengths))


def to_rgb(cube, wavelengths: Sequence[float] | None = None, exposure: float | str = "auto") -> np.ndarray:
    """(C, H, W) cube -> (H, W, 3) float32 sRGB in [0, 1] (see the module docstring for colour, white, exposure).

    rgb = srgb_encode(clip(exposure · M x, 0, 1)), M the (3, C) white-balanced band-to-linear-sRGB matrix.
    """
    import colour

    linear = _linear(_cube(cube), wavelengths)
    gain = _auto_gain(linear) if exposure == "auto" else float(exposure)
    return colour.cctf_encoding(np.clip(linear * gain, 0, 1), function="sRGB").astype(np.float32)


# ----------------------------------------------------------------------------- figures

def _figure(width_px: float, height_px: float, dpi: int = 100):
    from matplotlib.figure import Figure

    return Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)


def _write_png(fig, path, description: str = "") -> Path:
    """Render ``fig`` to PNG bytes, then write them atomically (temporary file + rename)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from cassi.io import write_text_atomic

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, metadata={"Description": description, "Software": "cassi"})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, buf.getvalue())


def _thumbnail(x: np.ndarray, max_px: int) -> np.ndarray:
    """Area-average (C, H, W) down so that the longer side is at most ``max_px``."""
    h, w = x.shape[-2:]
    k = math.ceil(max(h, w) / max_px)
    if k <= 1:
        return x
    t = torch.nn.functional.avg_pool2d(torch.from_numpy(x)[None], k, ceil_mode=True)[0]
    return t.numpy()


def save_preview(path, cube, wavelengths: Sequence[float] | None = None, exposure: float | str = "auto") -> Path:
    """The sRGB (or labelled false-colour) picture of a (C, H, W) cube as a PNG: the image at its own
    resolution (enlarged by an integer factor when narrower than 256 px) under a one-line caption."""
    x = _cube(cube)
    rgb = to_rgb(x, wavelengths, exposure)
    k = max(1, math.ceil(_MIN_PREVIEW_PX / rgb.shape[1]))
    rgb = rgb.repeat(k, 0).repeat(k, 1)
    h, w = rgb.shape[:2]
    fig = _figure(w, h + _CAPTION_PX)
    fig.figimage(rgb, 0, 0, origin="upper")
    label = "FALSE COLOUR (no wavelengths)" if is_false_colour(wavelengths) else \
        f"sRGB, CIE 1931, {min(wavelengths):g}–{max(wavelengths):g} nm"
    fig.text(2 / w, 1 - 2 / (h + _CAPTION_PX), label, va="top", ha="left", fontsize=8,
             color="#b00000" if is_false_colour(wavelengths) else "black")
    gain = auto_exposure(x, wavelengths) if exposure == "auto" else float(exposure)
    return _write_png(fig, path, f"{rendering(wavelengths, x.shape[0])}; exposure ×{gain:.4g}")


def _band_labels(wavelengths: Sequence[float] | None, bands: int) -> list[str]:
    return [f"{w:g} nm" for w in wavelengths] if wavelengths is not None else [f"band {c + 1}" for c in range(bands)]


def save_band_mosaic(path, cube, wavelengths: Sequence[float] | None = None, tile_px: int = 128) -> Path:
    """Every band of a (C, H, W) cube as a grey tile labelled with its wavelength (or index), one shared
    scale (0 to the cube's 99.5th percentile), in a near-square grid."""
    x = _thumbnail(_cube(cube), tile_px)
    c, h, w = x.shape
    cols = math.ceil(math.sqrt(c))
    rows = math.ceil(c / cols)
    vmax = float(np.percentile(x, 99.5)) or 1.0
    tw, th = tile_px, tile_px * h / w + 18
    top = 36  # px for the title above the first row of tile labels
    fig = _figure(cols * tw, rows * th + top)
    fig.suptitle(f"{c} bands, grey scale 0–{vmax:.3g}", fontsize=9, y=1 - 4 / (rows * th + top), va="top")
    for i, label in enumerate(_band_labels(wavelengths, c)):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.imshow(x[i], cmap="gray", vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(label, fontsize=8, pad=2)
        ax.axis("off")
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - top / (rows * th + top), wspace=0.04, hspace=0.2)
    return _write_png(fig, path, f"band mosaic: {', '.join(_band_labels(wavelengths, c))}")


def save_comparison(path, truth, recon, wavelengths: Sequence[float] | None = None, psnr: float | None = None) -> Path:
    """Truth | reconstruction | error side by side: both pictures with the truth's exposure, and the per-pixel
    spectral RMSE sqrt(mean_c (x_c − gt_c)²) as a colour map with its scale; ``psnr`` (dB) goes in a title."""
    gt, x = _cube(truth), _cube(recon)
    if gt.shape != x.shape:
        raise ValueError(f"truth {gt.shape} and reconstruction {x.shape} differ in shape")
    gain = auto_exposure(gt, wavelengths)
    err = np.sqrt(((x - gt) ** 2).mean(0))
    h, w = gt.shape[-2:]
    panel = 220
    fig = _figure(3 * panel + 60, panel * h / w + 50)
    kind = "false colour" if is_false_colour(wavelengths) else "sRGB"
    for i, (img, title) in enumerate([(to_rgb(gt, wavelengths, gain), f"truth ({kind})"),
                                      (to_rgb(x, wavelengths, gain),
                                       "reconstruction" + ("" if psnr is None else f", {psnr:.2f} dB")),
                                      (err, "error: spectral RMSE")]):
        ax = fig.add_subplot(1, 3, i + 1)
        im = ax.imshow(img, cmap="magma" if i == 2 else None, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.axis("off")
        if i == 2:
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.01, right=0.95, bottom=0.02, top=0.88, wspace=0.05)
    return _write_png(fig, path, f"truth | reconstruction | error ({rendering(wavelengths, gt.shape[0])})")


def spectrum_points(height: int, width: int, n: int = 4) -> list[tuple[int, int]]:
    """``n`` (row, col) points spread over the frame: the centres of an n-cell grid (4: the quadrant centres)."""
    rows = max(1, round(math.sqrt(n)))
    cols = math.ceil(n / rows)
    return [(int((r + 0.5) * height / rows), int((c + 0.5) * width / cols))
            for r in range(rows) for c in range(cols)][:n]


def save_spectra(path, cube, wavelengths: Sequence[float] | None = None, truth=None,
                 points: Sequence[tuple[int, int]] | None = None) -> Path:
    """The picture with numbered points and, beside it, the spectrum of each point (dashed: the truth)."""
    x = _cube(cube)
    gt = None if truth is None else _cube(truth)
    c, h, w = x.shape
    points = list(points) if points is not None else spectrum_points(h, w)
    axis = np.asarray(wavelengths, np.float64) if wavelengths is not None else np.arange(1, c + 1)
    fig = _figure(560, 220)
    left = fig.add_axes((0.01, 0.05, 0.36, 0.9))
    left.imshow(to_rgb(x, wavelengths), interpolation="nearest")
    left.axis("off")
    right = fig.add_axes((0.47, 0.2, 0.5, 0.72))
    colours = [f"C{i}" for i in range(len(points))]
    for i, ((r, col), colour_) in enumerate(zip(points, colours)):
        left.plot(col, r, "o", mfc="none", mec=colour_, ms=8, mew=2)
        left.annotate(str(i + 1), (col, r), xytext=(5, 5), textcoords="offset points", color=colour_, fontsize=8,
                      fontweight="bold")
        right.plot(axis, x[:, r, col], "-", color=colour_, lw=1.5, label=f"{i + 1}: ({r}, {col})")
        if gt is not None:
            right.plot(axis, gt[:, r, col], "--", color=colour_, lw=1)
    right.set_xlabel("wavelength (nm)" if wavelengths is not None else "band", fontsize=8)
    right.set_ylabel("value", fontsize=8)
    right.tick_params(labelsize=7)
    right.legend(fontsize=6, loc="best", frameon=False)
    right.set_title("spectra" + (" (dashed: truth)" if gt is not None else ""), fontsize=8)
    return _write_png(fig, path, f"spectra at (row, col) {points}")


def method_label(title: str | None, default: str = "method") -> str:
    """A short label from a reconstructor's repr: its class (past a ``Tiled`` wrapper) and, for a model loaded
    from a file, the file's stem: "Refiner(…, from …/chart_demo.ckpt)" -> "Refiner chart_demo"."""
    import re

    names = [n for n in re.findall(r"([A-Za-z_]\w*)\(", title or "") if n != "Tiled"]
    stem = re.search(r"from \S*?([^/\\\s]+)\.(?:ckpt|pt|pth)\b", title or "")
    return " ".join([names[0] if names else default] + ([stem.group(1)] if stem else []))


def _pixel_angles(x: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """(N,) spectral angle in degrees between the columns of two (C, N) arrays."""
    cos = (x * gt).sum(0) / np.maximum(np.linalg.norm(x, axis=0) * np.linalg.norm(gt, axis=0), 1e-12)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def save_patch_spectra(path, truth, regions, estimates: dict, wavelengths: Sequence[float] | None = None,
                       names: Sequence[str] | None = None, cols: int = 6) -> Path:
    """Each region's spectrum (regions: an (H, W) label map, k > 0 a patch, e.g. the 24 of a colour chart) in a
    grid of small plots (``cols`` per row; 24 patches: 4 × 6), each on its own value scale: the truth's mean over
    the patch dashed black; each estimate of ``estimates`` ({label: cube}, e.g. the learned model and GAP-TV)
    in colour, its mean as a line and the 10–90 % range of its pixels as a band (how much its pixels stray);
    in every plot a swatch of the truth's colour and each estimate's mean per-pixel spectral angle to the truth
    (degrees). ``names``: the name of region k at index k − 1."""
    gt = _cube(truth)
    lab = regions.detach().cpu().numpy() if isinstance(regions, torch.Tensor) else np.asarray(regions)
    if lab.shape != gt.shape[1:]:
        raise ValueError(f"regions {lab.shape} do not match the cube's frame {gt.shape[1:]}")
    labels = sorted(int(k) for k in np.unique(lab) if k > 0)
    if not labels:
        raise ValueError("the label map has no region (no label > 0)")
    cubes = {label: _cube(cube) for label, cube in estimates.items()}
    for label, x in cubes.items():
        if x.shape != gt.shape:
            raise ValueError(f"{label}: shape {x.shape} differs from the truth's {gt.shape}")
    c = gt.shape[0]
    axis = np.asarray(wavelengths, np.float64) if wavelengths is not None else np.arange(1, c + 1)
    gain = auto_exposure(gt, wavelengths)
    n = len(labels)
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    height = rows * 118 + 70
    fig = _figure(cols * 150, height)
    fig.suptitle("spectrum of each patch", fontsize=9, y=1 - 4 / height, va="top")
    stats = []
    for k in labels:
        inside = lab == k
        t = gt[:, inside]
        stats.append((t.mean(1), {label: (x[:, inside].mean(1), np.percentile(x[:, inside], [10, 90], axis=1),
                                          float(_pixel_angles(x[:, inside], t).mean())) for label, x in cubes.items()}))
    handles: list = []
    for i, (k, (mean_gt, est)) in enumerate(zip(labels, stats)):
        ax = fig.add_subplot(rows, cols, i + 1)
        handles = [(ax.plot(axis, mean_gt, "--", color="black", lw=1.2, zorder=3)[0], "truth (patch mean)")]
        for j, (label, (mean, band, angle)) in enumerate(est.items()):
            ax.fill_between(axis, band[0], band[1], color=f"C{j}", alpha=0.18, lw=0)
            handles.append((ax.plot(axis, mean, "-", color=f"C{j}", lw=1.1)[0], label))
            ax.text(0.98, 0.96 - 0.12 * j, f"{angle:.1f}°", transform=ax.transAxes, ha="right", va="top",
                    fontsize=5.5, color=f"C{j}")
        top = max([float(mean_gt.max())] + [float(e[1].max()) for e in est.values()])  # each plot its own scale
        ax.set_ylim(0, 1.3 * top or 1.0)
        ax.set_xlim(axis.min(), axis.max())
        ax.tick_params(labelsize=5, length=2, pad=1)
        if i < n - cols:
            ax.set_xticklabels([])
        name = names[k - 1] if names is not None and 0 < k <= len(names) else ""
        ax.set_title(f"{k} {name}".strip()[:26], fontsize=6.5, pad=2)
        swatch = to_rgb(mean_gt[:, None, None], wavelengths, gain)[0, 0]
        ax.add_patch(_rectangle((0.03, 0.76), 0.14, 0.18, swatch, ax.transAxes))
    fig.legend([h for h, _ in handles], [lab for _, lab in handles], loc="upper center", ncol=len(handles),
               fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1 - 16 / height))
    xl = "wavelength (nm)" if wavelengths is not None else "band"
    fig.text(0.5, 0.004, f"{xl}. Lines: means over the patch; bands: 10–90 % of each estimate's pixels; "
             "degrees: each estimate's mean per-pixel spectral angle to the truth", ha="center", va="bottom",
             fontsize=6.5)
    fig.subplots_adjust(left=0.03, right=0.995, bottom=28 / height, top=1 - 46 / height, wspace=0.22, hspace=0.3)
    return _write_png(fig, path, f"spectrum of each of {n} regions: truth and {', '.join(cubes)}")


def _rectangle(xy, w, h, colour_, transform):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, w, h, facecolor=colour_, edgecolor="black", lw=0.4, transform=transform)


# ----------------------------------------------------------------------------- report page

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:6px 10px;vertical-align:top;text-align:left}
th{background:#f4f4f4}img{image-rendering:pixelated}.err{color:#b00000;font-weight:bold;max-width:40em}
.num{font-variant-numeric:tabular-nums;white-space:nowrap}.small{color:#666;font-size:90%}"""


def report_html(rows: Sequence[dict], title: str, notes: Sequence[str] = ()) -> str:
    """A self-contained HTML page: one table row per scene (``rows`` as in the run summary, plus "files":
    {"preview", "mosaic", "spectra", "compare", "cube", "baseline", "baseline_compare", "patch_spectra"} paths
    relative to the page; a baseline column appears when a row has one; a scene's "patch_spectra" picture
    gets a full-width row under it), pictures by relative path, no scripts, no network."""
    esc = html.escape
    metric_keys = [k for k in dict.fromkeys(k for r in rows for k in r)
                   if k not in ("name", "files", "error", "status", "rendering")]
    failed = sum(1 for r in rows if r.get("error"))
    head = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
            f"<style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
            f"<p>{len(rows)} scene(s), {len(rows) - failed} reconstructed, {failed} failed.</p>"]
    head += [f"<p class=small>{esc(n)}</p>" for n in notes]
    beside = any((r.get("files") or {}).get("baseline") for r in rows)
    body = ["<table>", "<tr><th>scene</th><th>preview</th>" + ("<th>baseline</th>" if beside else "")
            + "<th>result</th><th>spectra</th></tr>"]

    def img(rel, width, alt):
        return f'<a href="{esc(rel)}"><img src="{esc(rel)}" width="{width}" alt="{esc(alt)}"></a>'

    for r in rows:
        files = r.get("files") or {}
        name = esc(str(r["name"]))
        cell = [f"<b>{name}</b>"]
        if r.get("status"):
            cell.append(f"<div class=small>{esc(str(r['status']))}</div>")
        if files.get("cube"):
            cell.append(f'<div class=small><a href="{esc(files["cube"])}">cube</a></div>')
        preview = img(files["preview"], 256, f"{r['name']} preview") if files.get("preview") else ""
        if files.get("compare"):
            preview += f'<div class=small><a href="{esc(files["compare"])}">truth | reconstruction | error</a></div>'
        if files.get("mosaic"):
            preview += f'<div class=small><a href="{esc(files["mosaic"])}">bands</a></div>'
        if r.get("rendering"):
            preview += f"<div class=small>{esc(r['rendering'])}</div>"
        if r.get("error"):
            result = f"<div class=err>{esc(str(r['error']))}</div>"
        else:
            def fmt(v):
                return f"{v:.4g}" if isinstance(v, float) else esc(str(v))
            result = "<table>" + "".join(f"<tr><td>{esc(k)}</td><td class=num>{fmt(r[k])}</td></tr>"
                                         for k in metric_keys if r.get(k) is not None) + "</table>"
        spectra = img(files["spectra"], 420, f"{r['name']} spectra") if files.get("spectra") else ""
        base = ""
        if beside:
            base = img(files["baseline"], 256, f"{r['name']} baseline") if files.get("baseline") else ""
            if files.get("baseline_compare"):
                base += (f'<div class=small><a href="{esc(files["baseline_compare"])}">truth | baseline | '
                         f'error</a></div>')
            base = f"<td>{base}</td>"
        body.append(f"<tr><td>{''.join(cell)}</td><td>{preview}</td>{base}<td>{result}</td><td>{spectra}</td></tr>")
        if files.get("patch_spectra"):  # a scene with patches (e.g. a colour chart): their spectra, full width
            picture = img(files["patch_spectra"], 900, f"{r['name']} patch spectra")
            body.append(f"<tr><td class=small>{name}: the spectrum of each patch against the truth</td>"
                        f"<td colspan={3 + beside}>{picture}</td></tr>")
    body.append("</table></body></html>")
    return "\n".join(head + body) + "\n"


def read_curve(run_dir, y: str = "val/psnr", x: str = "time/cpu_min") -> tuple[list[float], list[float]]:
    """(x values, y values) of the rows of a training run's ``logs/version_*/metrics.csv`` (all versions,
    in order: a resumed run continues its curve) that have both columns. FileNotFoundError naming the folder
    when it has no metrics file; ValueError when no row has both columns."""
    import csv

    files = sorted(Path(run_dir).glob("logs/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[-1]))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no logs/version_*/metrics.csv (not a training run folder?)")
    xs, ys = [], []
    for f in files:
        with open(f, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get(x) and row.get(y):
                    xs.append(float(row[x]))
                    ys.append(float(row[y]))
    if not xs:
        raise ValueError(f"{run_dir}: no logged row has both {x!r} and {y!r}")
    return xs, ys


def save_learning_curves(path, curves: dict, baselines: dict | None = None, xlabel: str = "CPU-minutes",
                         ylabel: str = "validation PSNR (dB)", title: str = "") -> Path:
    """One PNG: ``curves`` {label: (xs, ys)} as lines, ``baselines`` {label: value} as dashed horizontal lines
    (e.g. GAP-TV on the same scenes)."""
    fig = _figure(900, 560)
    ax = fig.add_subplot(1, 1, 1)
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker=".", markersize=3, linewidth=1.2, label=label)
    for i, (label, value) in enumerate((baselines or {}).items()):
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{(len(curves) + i) % 10}", label=f"{label} ({value:.2f})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _write_png(fig, path, title or "learning curves")
