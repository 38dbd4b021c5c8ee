"""Iterative solvers (cassi.solvers): convergence, equivalences, batching, backends, PnP, checks.

Small problems (B ≤ 2, C = 8, 32×32) so the whole file runs in a few seconds.
"""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cassi.solvers.tv as tvmod
from cassi import CASSI
from cassi.physics.masks import bernoulli_mask
from cassi.data.synthetic import synthetic_batch
from cassi.solvers import (ADMM, ADMMTV, GAP, GAPTV, PseudoInverse, Result, TVDenoiser, TwIST, psnr, tv_norm,
                           twist_parameters)
from cassi.solvers import textbook

C, H, W, S = 8, 32, 32, 2
CPU_BACKENDS = ("loop", "strided", "scatter", "fold", "fft", "conv")
CONF = Path(__file__).resolve().parents[1] / "conf" / "solver"


@pytest.fixture(scope="module")
def problem():
    """Two scenes, two different masks: (op, y, x, mask)."""
    x = synthetic_batch(2, H, W, C, seed=1)
    mask = bernoulli_mask(H, W, seed=1, batch=2)
    op = CASSI(mask, bands=C, step=S, backend="strided")
    return op, op(x), x, mask


def one(problem, i):
    op, y, x, mask = problem
    return CASSI(mask[i:i + 1], bands=C, step=S, backend="strided"), y[i:i + 1], x[i:i + 1]


SOLVERS = {
    "gap_tv": lambda: GAPTV(iters=30),
    "admm_tv": lambda: ADMMTV(iters=30),
    "twist": lambda: TwIST(iters=30),
    "pnp_gap": lambda: GAP(TVDenoiser(0.4, 5), iters=30, sigma=0.4, decay=0.95),
    "pnp_admm": lambda: ADMM(TVDenoiser(0.4, 5), iters=30, sigma=0.4, decay=0.95),
}


# --------------------------------------------------------------------------- TV prior
def test_tv_denoiser_reduces_tv_and_is_identity_for_tiny_weight():
    f = synthetic_batch(2, H, W, C, seed=2)
    f = f + 0.1 * torch.randn(f.shape, generator=torch.Generator().manual_seed(0))
    u = TVDenoiser(0.1, 10)(f)
    assert (tv_norm(u) < 0.6 * tv_norm(f)).all()
    assert torch.allclose(TVDenoiser(1e-6, 10)(f), f, atol=1e-5)


def _tv_reference(f, w, s, iters=4000):
    """argmin_u ½‖u − f‖² + w·Σ|(∂_h u, ∂_w u, s·∂_c u)|: FISTA on the dual, ∇ as an explicit matrix."""
    def grad(u):
        g = [F.pad(torch.diff(u, dim=a), (0, 0) * (3 - a) + (0, 1)) for a in (2, 3)]
        return torch.stack(g + ([s * F.pad(torch.diff(u, dim=1), (0, 0, 0, 0, 0, 1))] if s else []))

    D = torch.autograd.functional.jacobian(grad, f).reshape(-1, f.numel())      # (K·N, N)
    K, fv = D.shape[0] // f.numel(), f.reshape(-1)
    step = 1 / (w * w * torch.linalg.matrix_norm(D, 2) ** 2)
    p = q = torch.zeros(D.shape[0], dtype=f.dtype)
    t = 1.0
    for _ in range(iters):
        z = q + step * w * (D @ (fv - w * (D.T @ q)))
        z = z.view(K, -1) / (z.view(K, -1).norm(dim=0).clamp_min(1))
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        p, q = z.reshape(-1), z.reshape(-1) + (t - 1) / t_new * (z.reshape(-1) - p)
        t = t_new
    return (fv - w * (D.T @ p)).view_as(f)


@pytest.mark.parametrize("s", [0.0, 0.7])
def test_tv_denoiser_solves_the_tv_problem(s):
    """Many dual steps reach the minimiser found by an independent dense-matrix solver."""
    f = torch.rand(1, 4, 12, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = 0.05
    obj = lambda u: float(0.5 * (u - f).square().sum() + w * tv_norm(u, s).sum())
    u, ref = TVDenoiser(w, 3000, spectral_weight=s)(f), _tv_reference(f, w, s)
    assert obj(u) < obj(ref) + 1e-9 and (u - ref).abs().max() < 1e-5


def test_tv_denoiser_matches_textbook_and_is_blockwise_exact(monkeypatch):
    f = torch.rand(2, C, H, W, generator=torch.Generator().manual_seed(3))
    ref = textbook.tv_denoise(f, 0.2, 7)
    whole = TVDenoiser(0.2, 7)(f)
    assert torch.allclose(whole, ref, atol=1e-5)
    monkeypatch.setattr(tvmod, "_BLOCK_BYTES", 1)          # one plane per block (the torch ops)
    den = TVDenoiser(0.2, 7, inplace=True, impl="torch")
    g = f.clone()
    out = den(g)
    assert out is g and torch.allclose(out, whole, atol=1e-6)
    assert torch.allclose(den(f[:1]), whole[:1], atol=1e-6)  # workspace reuse with another shape


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_numba_tv_kernel_equals_the_torch_ops(dtype, tol):
    pytest.importorskip("numba")
    from cassi.physics.backends.numba import tv_denoise

    f = torch.rand(2, C, 13, 10, generator=torch.Generator().manual_seed(4), dtype=dtype)
    ref = TVDenoiser(0.15, 6, impl="torch")(f)
    out = torch.empty_like(f)
    assert tv_denoise(f, out, 0.15, 6) and (out - ref).abs().max() < tol
    g = f.clone()
    assert TVDenoiser(0.15, 6, inplace=True)(g) is g and (g - ref).abs().max() < tol   # in place
    # where it does not apply, the kernel declines and the torch ops run: autograd, other dtypes
    assert not tv_denoise(f.clone().requires_grad_(), torch.empty_like(f), 0.15, 6)
    assert not tv_denoise(f.half(), f.half(), 0.15, 6)
    with pytest.raises(ValueError, match="impl must be 'auto' or 'torch'"):
        TVDenoiser(0.1, impl="numba")


def test_gap_tv_with_the_numba_tv_kernel_keeps_its_psnr(problem, monkeypatch):
    pytest.importorskip("numba")
    import cassi.physics.backends.numba as nb

    op, _, x, _ = problem
    ran, kernel = [], nb.tv_denoise
    monkeypatch.setattr(nb, "tv_denoise", lambda *a: ran.append(kernel(*a)) or ran[-1])
    fast = GAPTV(iters=30)(op, op(x), gt=x)
    assert len(ran) == 30 and all(ran)  # the kernel ran every denoising step
    monkeypatch.setattr(nb, "tv_denoise", lambda *a: False)  # the torch ops
    slow = GAPTV(iters=30)(op, op(x), gt=x)
    assert abs(float(fast.history["psnr"][-1].mean() - slow.history["psnr"][-1].mean())) < 1e-3
    assert torch.allclose(fast.x, slow.x, atol=1e-4)


def test_tv_norm_of_known_images():
    x = torch.zeros(2, C, H, W)
    x[..., W // 2:] = 1                                                # one vertical edge per band
    x[1] += 0.1 * torch.arange(C).view(C, 1, 1)                        # plus a spectral ramp
    assert tv_norm(x).tolist() == pytest.approx([C * H, C * H])
    spectral = H + (C - 1) * (H * math.hypot(1, 0.2) + (H * W - H) * 0.2)   # s·0.1 = 0.2 between bands
    assert tv_norm(x, 2.0).tolist() == pytest.approx([C * H, spectral], rel=1e-5)


def test_tv_spectral_variant_differs_and_smooths_spectra():
    f = torch.rand(1, C, H, W, generator=torch.Generator().manual_seed(4))
    a, b = TVDenoiser(0.1, 10)(f), TVDenoiser(0.1, 10, spectral_weight=1.0)(f)
    assert (a - b).abs().max() > 1e-2
    spec = lambda u: float((u[:, 1:] - u[:, :-1]).abs().sum())
    assert spec(b) < spec(a)
    assert TVDenoiser(0.1, 10, spectral_weight=1.0)(f[:, :1]).shape == (1, 1, H, W)  # one band


# --------------------------------------------------------------------------- solvers
@pytest.mark.parametrize("name", SOLVERS)
def test_solver_converges_and_beats_pinv(problem, name):
    op, y, x, _ = problem
    r = SOLVERS[name]()(op, y, gt=x)
    assert isinstance(r, Result) and r.iterations == 30 and r.x.shape == x.shape
    res, p = r.history["residual"], r.history["psnr"]
    assert res.shape == p.shape == (31, 2)
    assert torch.allclose(p[0], psnr(op.pinv(y), x))                 # row 0: the initial guess
    assert torch.allclose(p[-1], psnr(r.x, x))
    assert (p[-1] > p[0] + 8).all(), p[[0, -1]]                     # pinv ≈ 10–14 dB, solvers ≈ 21–24 dB
    assert (res[-1] < 0.05).all() and (res[-1] < res[1:6].max(0).values / 2).all(), res
    assert torch.equal(SOLVERS[name]()(op, y).x, r.x)                # deterministic


def test_twist_objective_is_monotone_and_parameters_follow_the_paper(problem):
    op, y, x, _ = problem
    f = TwIST(iters=30)(op, y).history["objective"]
    assert (f[1:] <= f[:-1] * (1 + 1e-6)).all()
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(6))
    f0 = 0.5 * ((y - op(x0)).square() * op.phi_inv).flatten(1).sum(1) + 0.01 * tv_norm(x0)
    assert torch.allclose(TwIST(0.01, iters=1)(op, y, x0=x0).history["objective"][0], f0)
    a, b = twist_parameters(1e-4)
    rho0 = (1 - 1e-4) / (1 + 1e-4)
    assert math.isclose(a, 2 / (1 + math.sqrt(1 - rho0**2))) and math.isclose(b, 2 * a / (1 + 1e-4))
    assert 1.95 < a < 1.97 and 3.9 < b < 3.93


def test_gap_tv_equals_textbook(problem):
    op, y, x, mask = problem
    weights = [0.4 * 0.95**k for k in range(20)]
    ours = GAPTV(iters=20, tv_weight=0.4, decay=0.95, tv_iters=5)(op, y).x
    ref = textbook.gap_tv(y, mask, S, weights, 5)
    assert torch.allclose(ours, ref, atol=1e-5)


def test_data_steps_are_op_data_step(problem):
    op, y, x, _ = problem
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(5))
    ident = lambda v: v
    assert torch.allclose(GAP(ident, iters=1, accelerate=False)(op, y, x0=x0).x, op.data_step(x0, y), atol=1e-6)
    assert torch.allclose(ADMM(ident, rho=0.3, iters=1)(op, y, x0=x0).x, op.data_step(x0, y, 0.3), atol=1e-6)
    half = GAP(ident, iters=1, accelerate=False, step=0.5)(op, y, x0=x0)
    assert torch.allclose(half.x, (x0 + op.data_step(x0, y)) / 2, atol=1e-6)
    rel = lambda v: (y - op(v)).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1)
    assert torch.allclose(half.history["residual"], torch.stack([rel(x0), rel(half.x)]), atol=1e-6)


@pytest.mark.parametrize("name", SOLVERS)
def test_batch_of_masks_equals_samples_alone(problem, name):
    op, y, x, _ = problem
    both = SOLVERS[name]()(op, y).x
    for i in range(2):
        o, yi, _ = one(problem, i)
        assert torch.allclose(both[i:i + 1], SOLVERS[name]()(o, yi).x, atol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", SOLVERS)
def test_every_backend_gives_the_same_result(problem, name, backend):
    op, y, x, mask = problem
    o = CASSI(mask, bands=C, step=S, backend=backend)
    assert torch.allclose(SOLVERS[name]()(o, y).x, SOLVERS[name]()(op, y).x, atol=1e-4)


def test_fractional_dispersion_and_float64(problem):
    _, _, x, mask = problem
    op = CASSI(mask.double(), bands=C, step=1.5, backend="strided")
    xd = x.double()
    y = op(xd)
    r = GAPTV(iters=20)(op, y, gt=xd)
    assert r.x.dtype == torch.float64 and (r.history["psnr"][-1] > r.history["psnr"][0] + 5).all()


# --------------------------------------------------------------------------- plug-and-play
def test_pnp_calls_the_custom_denoiser(problem):
    op, y, x, _ = problem
    calls = []

    def den(v, sigma=None):
        calls.append(sigma)
        return v

    r = GAP(den, iters=6, sigma=0.2, decay=0.5, sigma_min=0.02)(op, y)
    assert calls == [max(0.2 * 0.5**k, 0.02) for k in range(6)] and r.history["sigma"].tolist() == pytest.approx(calls)
    calls.clear()
    ADMM(den, iters=4)(op, y)
    assert calls == [None] * 4                                       # no schedule: den(x)
    ident = GAP(lambda v: v, iters=10)(op, y, gt=x).x
    assert not torch.allclose(ident, GAPTV(iters=10)(op, y).x, atol=1e-2)
    with pytest.raises(ValueError, match="denoiser must return a tensor of shape"):
        GAP(lambda v: v[:, :1], iters=2)(op, y)


def test_stages_schedule_and_stopping(problem):
    op, y, x, _ = problem
    r = GAPTV(stages=[(3, 0.4), (2, 0.1)])(op, y)
    assert r.iterations == 5 and r.history["sigma"].tolist() == pytest.approx([0.4] * 3 + [0.1] * 2)
    r = GAPTV(iters=200, tol=0.03)(op, y)
    res = r.history["residual"].max(1).values
    assert r.iterations < 200 and res[-1] < 0.03 and (res[1:-1] >= 0.03).all()
    seen = []
    r = ADMMTV(iters=50)(op, y, callback=lambda k, v, info: seen.append(info["residual"].shape) or k == 7)
    assert r.iterations == 7 and seen == [(2,)] * 7
    xx, hist = PseudoInverse()(op, y)                                 # Result unpacks as (x, history)
    assert torch.equal(xx, op.pinv(y)) and hist["residual"].shape == (1, 2)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("make, match", [
    (lambda: GAPTV(iters=0), r"iters must be an integer >= 1, got 0"),
    (lambda: GAPTV(iters=-3), r"iters must be an integer >= 1, got -3"),
    (lambda: TwIST(iters=2.5), r"iters must be an integer >= 1, got 2.5"),
    (lambda: GAPTV(tv_weight=0), r"tv_weight must be a finite number > 0, got 0"),
    (lambda: ADMMTV(tv_weight=float("nan")), r"tv_weight must be a finite number > 0, got nan"),
    (lambda: TVDenoiser(weight=-0.1), r"weight must be a finite number > 0, got -0.1"),
    (lambda: TwIST(tv_weight=-1), r"tv_weight must be a finite number > 0, got -1"),
    (lambda: TVDenoiser(0.1, spectral_weight=-1), r"spectral_weight must be a finite number >= 0, got -1"),
    (lambda: TVDenoiser(0.1, iters=0), r"iters must be an integer >= 1, got 0"),
    (lambda: ADMMTV(rho=0), r"rho must be a finite number > 0, got 0"),
    (lambda: ADMM(lambda v: v, rho=-0.1), r"rho must be a finite number > 0, got -0.1"),
    (lambda: GAPTV(tol=-1e-3), r"tol must be a finite number >= 0, got -0.001"),
    (lambda: GAPTV(step=2.5), r"step must be a finite number > 0 and < 2.0, got 2.5"),
    (lambda: GAPTV(decay=1.5), r"decay must be a number in \(0, 1\], got 1.5"),
    (lambda: GAPTV(iters=10, stages=[(3, 0.4)]), r"iters=10 does not match the stages' total of 3"),
    (lambda: GAPTV(stages=[(3, 0.0)]), r"stages\[0\] weight must be a finite number > 0, got 0.0"),
    (lambda: GAPTV(stages=[(0, 0.1)]), r"stages\[0\] iters must be an integer >= 1, got 0"),
    (lambda: GAP(lambda v: v, stages=[0.1, 0.2]), r"stages\[0\] must be a pair \(iters, sigma\), got 0.1"),
    (lambda: GAPTV(weight_min=-1), r"weight_min must be a finite number >= 0, got -1"),
    (lambda: GAP(lambda v: v, sigma=0.0), r"sigma must be a finite number > 0, got 0.0"),
    (lambda: TwIST(lam1=2.0), r"lam1 must be <= lamN"),
])
def test_invalid_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_invalid_inputs_name_expected_and_given(problem):
    op, y, x, _ = problem
    s = GAPTV(iters=2)
    with pytest.raises(ValueError, match=r"y must have shape .*\(B, 1, 32, 46\).*got \(2, 1, 32, 40\)"):
        s(op, y[..., :40])
    with pytest.raises(ValueError, match=r"y has batch 3 but the operator has a batch of 2 masks"):
        s(op, torch.cat([y, y[:1]]))
    with pytest.raises(ValueError, match=r"x0 must have shape \(B, C, H, W\) = \(2, 8, 32, 32\).*got \(2, 7, 32, 32\)"):
        s(op, y, x0=x[:, :7])
    with pytest.raises(ValueError, match=r"gt must have shape .*\(2, 8, 32, 32\).*got \(1, 8, 32, 32\)"):
        s(op, y, gt=x[:1])
    with pytest.raises(TypeError, match="denoiser must be callable"):
        GAP("tv")


# --------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name", ["gap_tv", "admm_tv", "twist", "pnp_gap", "pinv"])
def test_hydra_configs_instantiate_and_run(problem, name):
    instantiate = pytest.importorskip("hydra.utils").instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    if "iters" in cfg:
        cfg.iters = 3
    solver = instantiate(cfg)
    op, y, x, _ = problem
    r = solver(op, y, gt=x)
    assert r.x.shape == x.shape and r.iterations == (0 if name == "pinv" else 3)
    if name == "gap_tv":
        staged = instantiate(cfg, iters=None, stages=[[2, 0.4], [1, 0.1]])   # Hydra lists (ListConfig)
        assert staged(op, y).iterations == 3
