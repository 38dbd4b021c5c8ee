"""cassi.viz: colours rendered from spectra, the pictures and the report page."""
import html.parser
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from cassi.io import CAVE_WAVELENGTHS, TSA_WAVELENGTHS
from cassi.viz import (is_false_colour, rendering, report_html, save_band_mosaic, save_comparison, save_preview,
                       save_spectra, to_rgb)

BAND_SETS = {"tsa": list(TSA_WAVELENGTHS), "cave": list(CAVE_WAVELENGTHS),
             "irregular": [405.0, 430.0, 470.0, 490.0, 540.0, 560.0, 600.0, 640.0, 690.0, 760.0]}


def narrow_band(wavelengths, centre, sigma=6.0, size=4):
    """A cube whose every pixel has a Gaussian spectrum of width sigma nm at `centre`."""
    wl = torch.tensor(wavelengths, dtype=torch.float64)
    return torch.exp(-0.5 * ((wl - centre) / sigma) ** 2)[:, None, None].expand(-1, size, size)


@pytest.mark.parametrize("bands", BAND_SETS)
def test_a_flat_spectrum_renders_neutral_grey(bands):
    wl = BAND_SETS[bands]
    rgb = to_rgb(torch.full((len(wl), 3, 5), 0.18), wl, exposure=1)
    assert rgb.shape == (3, 5, 3) and np.ptp(rgb, axis=-1).max() < 1e-6
    assert rgb[0, 0, 0] == pytest.approx(0.4613, abs=1e-3)  # sRGB encoding of 18 % grey
    assert np.allclose(to_rgb(torch.ones(len(wl), 2, 2), wl, exposure=1), 1)  # value 1 at exposure 1: white


@pytest.mark.parametrize("bands", ["tsa", "cave"])
@pytest.mark.parametrize("centre,channel", [(620, 0), (530, 1), (460, 2)])
def test_a_narrow_band_renders_its_colour(bands, centre, channel):
    """620 nm is red, 530 nm green, 460 nm blue, whatever the band set."""
    rgb = to_rgb(narrow_band(BAND_SETS[bands], centre), BAND_SETS[bands])[0, 0]
    others = np.delete(rgb, channel)
    assert rgb[channel] > 0.9 and others.max() < 0.5 * rgb[channel], rgb


def test_exposure_auto_brings_the_bright_end_to_white():
    wl = BAND_SETS["cave"]
    dim = torch.full((31, 16, 16), 0.02)
    dim[:, 0, 0] = 0.5  # one hot pixel (0.4 %) clips, the rest becomes white
    rgb = to_rgb(dim, wl)
    assert np.allclose(rgb[1:, 1:], 1, atol=1e-5) and np.allclose(to_rgb(dim, wl, exposure=50)[1:, 1:], 1, atol=1e-5)


def test_without_wavelengths_a_labelled_false_colour():
    assert is_false_colour(None) and is_false_colour([900.0, 1000.0, 1100.0]) and not is_false_colour(TSA_WAVELENGTHS)
    assert rendering(None, 28) == "FALSE COLOUR (no wavelengths): B = bands 1–9, G = bands 10–19, R = bands 20–28"
    x = torch.zeros(28, 2, 2)
    x[19:] = 1  # only the last third: red
    assert np.allclose(to_rgb(x, None, exposure=1)[0, 0], [1, 0, 0])
    assert np.allclose(to_rgb(torch.ones(5, 2, 2), None, exposure=1), 1)  # flat: white


def test_preview_png_is_the_rendering_under_a_caption(tmp_path):
    wl = BAND_SETS["tsa"]
    cube = torch.cat([narrow_band(wl, 620, size=300)[:, :, :150], narrow_band(wl, 460, size=300)[:, :, :150]], -1)
    path = save_preview(tmp_path / "p.png", cube, wl)
    img = Image.open(path)
    assert img.size == (300, 300 + 16) and "453.3–648.1 nm" in img.text["Description"]
    pixels = np.asarray(img.convert("RGB"))[16:] / 255  # below the caption strip
    np.testing.assert_allclose(pixels, to_rgb(cube, wl), atol=1.5 / 255)
    small = save_preview(tmp_path / "false.png", torch.rand(6, 20, 30), None)  # enlarged to >= 256 px wide
    assert Image.open(small).size == (270, 180 + 16) and "FALSE COLOUR" in Image.open(small).text["Description"]
    assert not list(tmp_path.glob(".*"))  # written atomically: no temporary left


def test_mosaic_comparison_and_spectra_pictures(tmp_path):
    wl = BAND_SETS["cave"]
    truth = torch.rand(31, 40, 50)
    mosaic = Image.open(save_band_mosaic(tmp_path / "m.png", truth, wl))
    assert all(f"{w:g} nm" in mosaic.text["Description"] for w in wl)
    assert "band 3" in Image.open(save_band_mosaic(tmp_path / "m2.png", truth[:5], None)).text["Description"]
    for path in (save_comparison(tmp_path / "c.png", truth, truth * 0.9, wl),
                 save_spectra(tmp_path / "s.png", truth, wl, truth=truth, points=[(3, 4), (30, 40)])):
        assert Image.open(path).size[0] > 300
    with pytest.raises(ValueError, match="differ in shape"):
        save_comparison(tmp_path / "x.png", truth, truth[:, :10], wl)


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.refs, self.tags = 0, [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.rows += tag == "tr"
        self.refs += [v for k, v in attrs if k in ("src", "href")]


def test_report_page_is_self_contained():
    rows = [{"name": "a", "psnr": 31.5, "residual": 0.01, "time": 2.0, "status": "reconstructed",
             "files": {"preview": "previews/a.png", "spectra": "previews/a_spectra.png", "cube": "reconstructions/a.tif"}},
            {"name": "b<&>", "status": "failed", "error": "b.mat: <script>alert(1)</script> truncated"}]
    page = report_html(rows, "GAP-TV", notes=["sRGB ..."])
    parser = Page()
    parser.feed(page)
    assert "script" not in parser.tags and "link" not in parser.tags  # no scripts, no external stylesheet
    assert sorted(parser.refs) == ["previews/a.png", "previews/a.png", "previews/a_spectra.png",
                                   "previews/a_spectra.png", "reconstructions/a.tif"]
    assert "31.5" in page and "&lt;script&gt;alert(1)&lt;/script&gt; truncated" in page and "b&lt;&amp;&gt;" in page
    assert "2 scene(s), 1 reconstructed, 1 failed" in page


def test_importing_viz_loads_neither_matplotlib_nor_colour():
    code = "import sys, cassi.viz; sys.exit(any(m in sys.modules for m in ('matplotlib', 'colour', 'lightning')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
