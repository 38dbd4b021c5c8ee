"""Synthetic scenes: shape, determinism, and that they look like real cubes
(smooth spectra, a few piecewise-constant materials, sharp spatial edges)."""
import pytest
import torch

from cassi.data.synthetic import default_wavelengths, synthetic_batch, synthetic_cube


def spectral_roughness(x):
    """Mean |second difference along bands| of x, divided by the same for
    x with its bands shuffled: ~1 for spectrally white data, << 1 if smooth."""
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    d2 = lambda t: (t[2:] - 2 * t[1:-1] + t[:-2]).abs().mean()
    return float(d2(x) / d2(x[perm]))


def unit_spectra(x):
    """(H*W, C) per-pixel spectra scaled to unit norm (shading cancels)."""
    x = x.double()
    return (x / x.norm(dim=0, keepdim=True)).reshape(x.shape[0], -1).t()


def n_distinct_spectra(x):
    return torch.unique((unit_spectra(x) * 1000).round(), dim=0).shape[0]


def spectral_rank(x):
    flat = unit_spectra(x)
    s = torch.linalg.svdvals(flat - flat.mean(0))
    return int((s > 0.01 * s[0]).sum())


def edge_fraction(x):
    """Fraction of horizontal neighbour pairs whose unit spectra differ."""
    n = unit_spectra(x).t().reshape(x.shape)
    return float(((n[:, :, 1:] - n[:, :, :-1]).abs().amax(0) > 1e-4).double().mean())


@pytest.mark.parametrize("h,w,c", [(17, 23, 5), (1, 1, 1), (32, 48, 28), (9, 64, 2)])
def test_shape_dtype_range(h, w, c):
    x = synthetic_cube(h, w, c, seed=3)
    assert x.shape == (c, h, w) and x.dtype == torch.float32
    assert x.min() >= 0 and x.max() <= 1
    assert 0.9 <= x.max() <= 1.0
    assert torch.isfinite(x).all()


def test_dtype_and_wavelengths():
    wl = torch.linspace(400, 700, 31)
    x = synthetic_cube(16, 20, bands=28, wavelengths=wl, seed=1, dtype=torch.float64)
    assert x.shape == (31, 16, 20) and x.dtype == torch.float64  # wavelengths win over bands
    assert torch.allclose(default_wavelengths(28), torch.linspace(450, 650, 28, dtype=torch.float64))
    assert default_wavelengths(28).shape == (28,)


def test_deterministic_and_seed_dependent():
    a, b = synthetic_cube(40, 40, 8, seed=5), synthetic_cube(40, 40, 8, seed=5)
    assert torch.equal(a, b)
    assert (a - synthetic_cube(40, 40, 8, seed=6)).abs().mean() > 0.02


def test_global_rng_untouched():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = synthetic_cube(16, 16, 4, seed=2)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(999)
    assert torch.equal(synthetic_cube(16, 16, 4, seed=2), a)


@pytest.mark.parametrize("seed", [0, 7, 21])
def test_looks_like_a_real_scene(seed):
    x = synthetic_cube(64, 64, 28, seed=seed)
    assert spectral_roughness(x) < 0.1  # smooth spectra (white noise gives ~1)
    assert 6 <= n_distinct_spectra(x) <= 60  # a few piecewise-constant materials, not per-pixel
    assert spectral_rank(x) >= 4  # spectrally varied, not one spectrum times shading
    assert 0.01 < edge_fraction(x) < 0.25  # region borders exist, regions are large
    img = x.mean(0)
    g = (img[:, 1:] - img[:, :-1]).abs().flatten()
    assert g.quantile(0.99) > 5 * g.median()  # sharp edges on smooth regions


def test_criteria_reject_unrealistic_cubes():
    noise = torch.rand(28, 64, 64, generator=torch.Generator().manual_seed(0))
    assert spectral_roughness(noise) > 0.5 and n_distinct_spectra(noise) > 1000
    one = torch.linspace(0.2, 0.8, 28)[:, None, None] * (0.1 + torch.rand(1, 64, 64))  # one material
    assert n_distinct_spectra(one) <= 2 and edge_fraction(one) < 0.01


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spectral_variety_follows_n_materials(seed):
    assert spectral_rank(synthetic_cube(64, 64, 28, seed=seed, n_materials=1)) <= 2
    assert spectral_rank(synthetic_cube(64, 64, 28, seed=seed, n_materials=6)) >= 4


def test_batch():
    b = synthetic_batch(3, 24, 20, 6, seed=11)
    assert b.shape == (3, 6, 24, 20)
    assert torch.equal(b, synthetic_batch(3, 24, 20, 6, seed=11))
    for i in range(3):
        for j in range(i):
            assert (b[i] - b[j]).abs().mean() > 0.02
    assert (b - synthetic_batch(3, 24, 20, 6, seed=12)).flatten(1).abs().mean(1).min() > 0.02


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(height=0), ValueError, "height"),
    (dict(width=2.5), TypeError, "width"),
    (dict(bands=0), ValueError, "bands"),
    (dict(n_materials=0), ValueError, "n_materials"),
    (dict(wavelengths=[500.0, -1.0]), ValueError, "wavelengths"),
    (dict(wavelengths=[]), ValueError, "wavelengths"),
    (dict(wavelengths=[[500.0, 600.0]]), ValueError, "wavelengths"),
    (dict(dtype=torch.int32), TypeError, "dtype"),
    (dict(seed=-1), ValueError, "seed"),
])
def test_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        synthetic_cube(**{"height": 8, "width": 8, **kwargs})
    with pytest.raises(ValueError, match="batch"):
        synthetic_batch(0)
