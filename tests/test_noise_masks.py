"""Masks (Bernoulli, crops) and measurement noise models."""
import numpy as np
import pytest
import torch

from cassi.physics.masks import bernoulli_mask, center_crop, random_crops
from cassi.physics.noise import Compose, GaussianNoise, ShotNoise


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- masks

def test_bernoulli_shapes_values_fraction():
    m = bernoulli_mask(256, 200, p=0.3, seed=1)
    assert m.shape == (256, 200) and m.dtype == torch.float32
    assert set(m.unique().tolist()) == {0.0, 1.0}
    assert abs(m.mean().item() - 0.3) < 0.01  # 5 sigma for 51200 pixels
    b = bernoulli_mask(20, 30, p=0.5, seed=1, batch=4, dtype=torch.bool)
    assert b.shape == (4, 1, 20, 30) and b.dtype == torch.bool
    assert not torch.equal(b[0], b[1])
    assert bernoulli_mask(5, 7, p=1.0).eq(1).all()


def test_bernoulli_deterministic():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = bernoulli_mask(64, 64, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, bernoulli_mask(64, 64, seed=3))
    assert (a != bernoulli_mask(64, 64, seed=4)).float().mean() > 0.3


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(p=0.0), ValueError, r"p must be a number in \(0, 1\], got 0.0"),
    (dict(p=1.5), ValueError, "got 1.5"),
    (dict(p="0.5"), TypeError, "p must"),
    (dict(height=0), ValueError, "height must be an int >= 1, got 0"),
    (dict(width=3.0), TypeError, "width"),
    (dict(batch=0), ValueError, "batch"),
])
def test_bernoulli_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        bernoulli_mask(**{"height": 8, "width": 8, **kwargs})


def test_random_crops_are_subarrays_at_offsets():
    H, W = 13, 17
    src = torch.arange(H * W, dtype=torch.float32).reshape(H, W)  # every value marks its position
    crops, off = random_crops(src, (4, 6), batch=50, generator=gen(2), return_offsets=True)
    assert crops.shape == (50, 1, 4, 6) and off.shape == (50, 2) and crops.dtype == src.dtype
    for c, (t, l) in zip(crops[:, 0], off.tolist()):
        assert torch.equal(c, src[t:t + 4, l:l + 6])
        t0, l0 = divmod(int(c[0, 0]), W)  # position read from the content itself
        assert (t0, l0) == (t, l)
    assert off[:, 0].max() <= H - 4 and off[:, 1].max() <= W - 6 and off.min() >= 0


def test_random_crops_cover_all_positions_and_are_deterministic():
    src = torch.arange(30).reshape(5, 6)
    crops, off = random_crops(src, 3, batch=2000, generator=gen(0), return_offsets=True)
    assert set(off[:, 0].tolist()) == {0, 1, 2} and set(off[:, 1].tolist()) == {0, 1, 2, 3}
    assert torch.equal(crops, random_crops(src, 3, batch=2000, generator=gen(0)))
    assert not torch.equal(crops, random_crops(src, 3, batch=2000, generator=gen(1)))
    full = random_crops(src, (5, 6), batch=2)
    assert torch.equal(full, src.expand(2, 1, 5, 6))


def test_random_crops_errors():
    m = torch.zeros(10, 12)
    with pytest.raises(ValueError, match=r"crop size \(h, w\) = \(11, 4\) is larger than .* \(10, 12\)"):
        random_crops(m, (11, 4), batch=1)
    with pytest.raises(ValueError, match="larger"):
        random_crops(m, 12, batch=1)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        random_crops(np.zeros((10, 12)), 4, batch=1)
    with pytest.raises(ValueError, match=r"mask must have shape \(H, W\), got shape \(1, 10, 12\)"):
        random_crops(m[None], 4, batch=1)
    with pytest.raises(ValueError, match="size"):
        random_crops(m, (0, 3), batch=1)
    with pytest.raises(TypeError, match="size"):
        random_crops(m, 2.5, batch=1)
    with pytest.raises(ValueError, match="batch"):
        random_crops(m, 4, batch=0)


def test_center_crop():
    src = torch.arange(42).reshape(6, 7)
    c = center_crop(src, (2, 3))
    assert torch.equal(c, torch.tensor([[16, 17, 18], [23, 24, 25]]))  # corner (2, 2)
    assert torch.equal(center_crop(src, 5), src[0:5, 1:6])
    batched = src.expand(3, 1, 6, 7)
    assert torch.equal(center_crop(batched, (2, 3)), c.expand(3, 1, 2, 3))
    with pytest.raises(ValueError, match="larger"):
        center_crop(src, (7, 1))
    with pytest.raises(ValueError, match="shape"):
        center_crop(torch.zeros(5), 2)


# ---------------------------------------------------------------- noise

def test_gaussian_statistics():
    y = torch.full((2, 1, 300, 400), 0.5)
    n = GaussianNoise(0.1)(y, generator=gen(0))
    assert n.shape == y.shape and n.dtype == y.dtype
    assert torch.equal(y, torch.full_like(y, 0.5))  # input untouched
    d = (n - y).double()
    assert abs(d.mean().item()) < 5 * 0.1 / d.numel() ** 0.5
    assert abs(d.std().item() - 0.1) < 1e-3


def test_gaussian_deterministic_and_zero():
    y = torch.rand(3, 1, 8, 10, dtype=torch.float64)
    a = GaussianNoise(0.05)(y, generator=gen(7))
    assert a.dtype == torch.float64
    assert torch.equal(a, GaussianNoise(0.05)(y, generator=gen(7)))
    assert not torch.equal(a, GaussianNoise(0.05)(y, generator=gen(8)))
    z = GaussianNoise(0)(y)
    assert torch.equal(z, y) and z is not y


@pytest.mark.parametrize("level", [0.05, 0.3, 1.0])
def test_shot_mean_variance(level):
    photons = 200.0
    y = torch.full((4, 1, 200, 250), level)
    n = ShotNoise(photons)(y, generator=gen(1)).double()
    counts = n * photons
    assert torch.allclose(counts, counts.round(), atol=1e-3)  # whole photons
    assert abs(n.mean().item() - level) < 5 * (level / photons / n.numel()) ** 0.5
    assert n.var().item() == pytest.approx(level / photons, rel=0.03)


def test_shot_negative_and_zero_inputs():
    y = torch.tensor([[-1.0, 0.0, 0.0]])
    assert torch.equal(ShotNoise(50)(y, generator=gen()), torch.zeros_like(y))


def test_shot_deterministic():
    y = torch.rand(2, 1, 16, 20)
    a = ShotNoise(100, bit_depth=8)(y, generator=gen(3))
    assert torch.equal(a, ShotNoise(100, bit_depth=8)(y, generator=gen(3)))
    assert not torch.equal(a, ShotNoise(100, bit_depth=8)(y, generator=gen(4)))


@pytest.mark.parametrize("bits", [1, 3, 6])
def test_quantisation_per_sample_max(bits):
    L = 2**bits - 1
    y = torch.rand(3, 1, 40, 50) * torch.tensor([1.0, 2.0, 0.3])[:, None, None, None]
    raw = ShotNoise(500)(y, generator=gen(5))
    q = ShotNoise(500, bit_depth=bits)(y, generator=gen(5))  # same Poisson draw, then quantised
    for b in range(3):
        scale = raw[b].max()
        assert len(q[b].unique()) <= 2**bits
        assert q[b].max() == pytest.approx(scale.item())  # no saturation
        codes = q[b] / scale * L
        assert torch.allclose(codes, codes.round(), atol=1e-4)
        assert (q[b] - raw[b]).abs().max() <= scale / (2 * L) + 1e-6


def test_quantisation_fixed_full_scale_saturates():
    y = torch.linspace(0, 3, 5000).reshape(1, 1, 50, 100)
    q = ShotNoise(1000, bit_depth=2, full_scale=1.0)(y, generator=gen(0))
    u = q.unique()
    assert len(u) == 4 and torch.allclose(u, torch.tensor([0, 1 / 3, 2 / 3, 1]))
    assert (q[y > 1.2] == 1.0).all()


def test_compose_poisson_gaussian():
    y = torch.full((1, 1, 400, 500), 0.5)
    model = Compose([ShotNoise(1000), GaussianNoise(0.02)])
    n = model(y, generator=gen(0))
    assert torch.equal(n, model(y, generator=gen(0)))
    assert n.var().item() == pytest.approx(0.5 / 1000 + 0.02**2, rel=0.03)
    assert repr(model) == "Compose([ShotNoise(photons=1000, bit_depth=None, full_scale=None), GaussianNoise(sigma=0.02)])"


def test_noise_repr_and_errors():
    assert repr(GaussianNoise(0.05)) == "GaussianNoise(sigma=0.05)"
    assert repr(ShotNoise(1e3, bit_depth=12)) == "ShotNoise(photons=1000, bit_depth=12, full_scale=None)"
    with pytest.raises(ValueError, match="sigma must be a finite number >= 0, got -0.1"):
        GaussianNoise(-0.1)
    with pytest.raises(ValueError, match="sigma"):
        GaussianNoise(float("nan"))
    with pytest.raises(ValueError, match="photons must be a finite number > 0, got 0"):
        ShotNoise(0)
    with pytest.raises(ValueError, match="photons"):
        ShotNoise(-5.0)
    with pytest.raises(ValueError, match="bit_depth must be None or an int >= 1, got 0"):
        ShotNoise(10, bit_depth=0)
    with pytest.raises(ValueError, match="bit_depth"):
        ShotNoise(10, bit_depth=2.5)
    with pytest.raises(ValueError, match="full_scale"):
        ShotNoise(10, bit_depth=4, full_scale=0.0)
    with pytest.raises(TypeError, match="y must be a floating-point torch.Tensor, got dtype torch.int64"):
        GaussianNoise(0.1)(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="got list"):
        ShotNoise(10)([0.5])
    with pytest.raises(TypeError, match="callables"):
        Compose([GaussianNoise(0.1), 3])


@pytest.mark.gpu
def test_noise_on_gpu_matches_cpu_with_cpu_generator():
    y = torch.rand(2, 1, 16, 20)
    for model in (GaussianNoise(0.1), ShotNoise(100, bit_depth=8)):
        cpu = model(y, generator=gen(9))
        gpu = model(y.cuda(), generator=gen(9))
        assert gpu.device.type == "cuda"
        assert torch.allclose(gpu.cpu(), cpu, atol=1e-6)
