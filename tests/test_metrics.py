"""The published tables' metrics (cassi.metrics.psnr_table, ssim_table) against the MST toolbox's Matlab protocol
(Cal_quality_assessment.m: im2uint8, csnr, cal_ssim with Wang et al.'s ssim_index) written out in numpy."""
import numpy as np
import pytest
import torch
from scipy.signal import correlate2d

from cassi.metrics import all_metrics, psnr_table, ssim_table


def _fspecial_gaussian(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    r = np.arange(size) - (size - 1) / 2
    g = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * sigma**2))
    return g / g.sum()


def _ssim_index(a: np.ndarray, b: np.ndarray, L: float = 255.0) -> float:
    """ssim_index.m with its defaults: filter2(window, ·, 'valid'), K = (0.01, 0.03)."""
    w = _fspecial_gaussian()
    f = lambda t: correlate2d(t, w, mode="valid")  # filter2 is a correlation
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2
    mu1, mu2 = f(a), f(b)
    s1, s2, s12 = f(a * a) - mu1**2, f(b * b) - mu2**2, f(a * b) - mu1 * mu2
    return float(np.mean((2 * mu1 * mu2 + c1) * (2 * s12 + c2) / ((mu1**2 + mu2**2 + c1) * (s1 + s2 + c2))))


def _matlab(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(PSNR, SSIM) of one (C, H, W) cube as Cal_quality_assessment.m computes them."""
    to8 = lambda x: np.round(np.clip(x, 0, 1) * 255)  # im2uint8 of the clipped cube
    z, s = to8(pred), to8(truth)
    psnr = np.mean([10 * np.log10(255**2 / np.mean((s[c] - z[c]) ** 2)) for c in range(len(s))])
    return float(psnr), float(np.mean([_ssim_index(s[c], z[c]) for c in range(len(s))]))


def test_table_metrics_follow_the_toolbox_protocol():
    g = torch.Generator().manual_seed(0)
    truth = torch.rand(2, 3, 24, 20, generator=g, dtype=torch.float64)
    pred = truth + 0.08 * torch.randn(2, 3, 24, 20, generator=g, dtype=torch.float64)  # some values beyond [0, 1]
    p, s = psnr_table(pred, truth), ssim_table(pred, truth)
    for i in range(2):
        want_p, want_s = _matlab(pred[i].numpy(), truth[i].numpy())
        assert p[i].item() == pytest.approx(want_p, abs=1e-9)
        assert s[i].item() == pytest.approx(want_s, abs=1e-9)
    # the 8-bit rounding matters: within half a grey level of the 8-bit grid the table metrics see no error
    grid = (truth * 255).round() / 255
    near = grid + 0.3 / 255 * torch.sign(torch.randn(grid.shape, generator=g, dtype=torch.float64))
    assert torch.all(ssim_table(near, grid) == 1) and torch.all(psnr_table(near, grid) == float("inf"))
    assert set(all_metrics(pred.float(), truth.float())) == {"psnr", "psnr_table", "ssim", "ssim_table", "sam"}


def test_all_metrics_on_frames_under_the_table_ssim_window():
    """A 8×9 frame (a tiny crop): the table's SSIM is NaN, not an error; the others are computed."""
    g = torch.Generator().manual_seed(0)
    truth = torch.rand(2, 3, 8, 9, generator=g)
    m = all_metrics((truth + 0.05).clamp(0, 1), truth)
    assert torch.isnan(m["ssim_table"]).all() and m["ssim_table"].shape == (2,)
    assert torch.isfinite(m["psnr_table"]).all() and torch.isfinite(m["psnr"]).all()
    with pytest.raises(ValueError, match="at least 11×11"):
        ssim_table(truth, truth)


def test_metrics_are_measured_in_full_precision_under_bf16_autocast():
    """Validation under trainer.precision=bf16-mixed runs inside autocast: the scores must still be float32 ones
    (SSIM's Gaussian convolutions would otherwise run in bfloat16 and read low)."""
    import torch

    from cassi.metrics import all_metrics

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 4, 32, 32, generator=g)
    pred = (target + 0.05 * torch.randn(2, 4, 32, 32, generator=g)).clamp(0, 1)
    plain = all_metrics(pred, target)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = all_metrics(pred, target)
        half = all_metrics(pred.bfloat16(), target)  # a bf16 output is scored as its float32 value
    for k in plain:
        assert auto[k].dtype == torch.float32 and torch.equal(auto[k], plain[k]), k
        assert torch.equal(half[k], all_metrics(pred.bfloat16().float(), target)[k]), k
