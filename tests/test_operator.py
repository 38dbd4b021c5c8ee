"""The CASSI operator: every backend against the reference loop, adjointness,
pseudo-inverse, Φ, autograd, out=, batches of masks and input validation."""
import logging
import math

import numpy as np
import pytest
import torch

from cassi import CASSI
from cassi.physics.backends import BACKENDS, AutoBackend, Backend, UnsupportedGeometry

B, C, H, W = 2, 5, 7, 9  # odd, non-square sizes catch transposition and off-by-one errors

GEOMETRIES = {
    "step1": dict(step=1),
    "step2": dict(step=2),
    "step3": dict(step=3),
    "table": dict(offsets=[3, 0, 1, 6, 2]),  # integer, non-uniform, unordered
    "frac": dict(offsets=[0.0, 1.6, 3.1, 4.5, 7.25]),
}
MASKS = ("2d", "3d", "batch")
EAGER = ("conv", "scatter", "fold", "strided", "fft", "numba", "auto")
# what each backend is expected to support: an unexpected UnsupportedGeometry fails the test
SUPPORTS = {
    "scatter": lambda g: g != "frac",
    "fold": lambda g: g.startswith("step"),
}


def make_mask(kind, dtype=torch.float64, seed=0, h=H, w=W):
    g = torch.Generator().manual_seed(seed)
    shape = {"2d": (h, w), "3d": (C, h, w), "batch": (B, C, h, w)}[kind]
    m = (torch.rand(shape, generator=g) > 0.35).to(dtype)
    return m * (0.5 + torch.rand(shape, generator=g, dtype=dtype))  # non-binary values too


def make_op(mask_kind, geom, axis="w", backend="loop", dtype=torch.float64, **kw):
    mask = make_mask(mask_kind, dtype, **kw)
    bands = C if mask_kind == "2d" and "offsets" not in GEOMETRIES[geom] else None
    return CASSI(mask, bands=bands, axis=axis, backend=backend, **GEOMETRIES[geom])


def rand(shape, dtype=torch.float64, seed=1):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def supported(backend, geom):
    return SUPPORTS.get(backend, lambda g: True)(geom)


# ------------------------------------------------------------------ backends agree with the loop
@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("backend", EAGER)
def test_backend_equals_loop_float32(backend, mask_kind, geom, axis):
    if not supported(backend, geom):
        with pytest.raises(UnsupportedGeometry, match=backend):
            make_op(mask_kind, geom, axis, backend, torch.float32)
        return
    op = make_op(mask_kind, geom, axis, backend, torch.float32)
    ref = make_op(mask_kind, geom, axis, "loop", torch.float32)
    x = rand((B, *ref.x_shape), torch.float32)
    y = rand((B, *ref.y_shape), torch.float32, seed=2)
    torch.testing.assert_close(op(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(op.pinv(y), ref.pinv(y), rtol=1e-5, atol=1e-5)


def supported_pairs(backends, geoms=tuple(GEOMETRIES)):
    return [(b, g) for b in backends for g in geoms if supported(b, g)]


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("backend, geom", supported_pairs(("loop",) + EAGER))
def test_adjointness_float64(backend, geom, mask_kind, axis):
    op = make_op(mask_kind, geom, axis, backend)
    x, y = rand((B, *op.x_shape)), rand((B, *op.y_shape), seed=2)
    lhs, rhs = (op(x) * y).sum(), (x * op.adjoint(y)).sum()
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_reference_loop_matches_seed_toy_example():
    """The 1-D example of seed 000: x rows [1,1,1], [2,2,2], [3,3,3], step 1 -> [1,3,6,5,3]."""
    op = CASSI(torch.ones(1, 3), bands=3, step=1, backend="loop")
    x = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1).expand(1, 3, 1, 3)
    assert op(x).flatten().tolist() == [1, 3, 6, 5, 3]


def test_fractional_offset_splits_between_two_pixels():
    op = CASSI(torch.ones(1, 1), offsets=[0.0, 1.25], backend="loop")
    x = torch.tensor([1.0, 10.0]).view(1, 2, 1, 1)
    assert op.delta == 2
    torch.testing.assert_close(op(x).flatten(), torch.tensor([1.0, 7.5, 2.5]))


# ------------------------------------------------------------------ Φ, pinv, data step
def dense(op):
    """The explicit matrix of A (float64), columns = A e_i."""
    n = math.prod(op.x_shape)
    return op(torch.eye(n, dtype=torch.float64).view(n, *op.x_shape)).reshape(n, -1).T


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step1", "step2", "table"])
@pytest.mark.parametrize("mask_kind", ["2d", "3d"])
def test_pinv_equals_dense_pinv(mask_kind, geom, axis):
    op = make_op(mask_kind, geom, axis, "strided", h=3, w=4)
    assert (op.phi == 0).any(), "the test mask should leave detector pixels dark"
    A = dense(op)
    y = rand((1, *op.y_shape), seed=3)
    expected = (torch.linalg.pinv(A) @ y.flatten()).view(1, *op.x_shape)
    torch.testing.assert_close(op.pinv(y), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(op.phi.flatten(), torch.diagonal(A @ A.T))


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("mask_kind", MASKS)
def test_phi_is_A_of_At_ones(mask_kind, geom, axis):
    op = make_op(mask_kind, geom, axis, "strided")
    ones = torch.ones(B, *op.y_shape, dtype=torch.float64)
    expected = op(op.adjoint(ones))
    torch.testing.assert_close(op.phi.expand_as(expected), expected)
    assert op.phi.shape == ((B if mask_kind == "batch" else 1), *op.y_shape)


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step1", "step2", "step3", "table"])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_pinv_is_right_inverse_on_range(mask_kind, geom, axis):
    op = make_op(mask_kind, geom, axis, "strided")
    y = op(rand((B, *op.x_shape)))
    torch.testing.assert_close(op(op.pinv(y)), y)


def test_pinv_is_zero_where_phi_is_zero_and_finite():
    mask = torch.zeros(8, 10)
    mask[2:6, 3:7] = 1.0
    op = CASSI(mask, bands=4, step=2, backend="strided")
    y = torch.rand(1, *op.y_shape)
    x = op.pinv(y)
    assert torch.isfinite(x).all()
    assert (x[:, :, mask == 0] == 0).all()


@pytest.mark.parametrize("geom", ["step2", "frac"])
def test_data_step(geom):
    op = make_op("3d", geom, "w", "strided")
    y = op(rand((B, *op.x_shape)))
    z = rand((B, *op.x_shape), seed=5)
    r0 = (op(z) - y).norm()
    x0 = op.data_step(z, y)  # GAP projection
    if geom == "step2":
        torch.testing.assert_close(op(x0), y)  # exact projection onto {Ax = y}
    assert (op(x0) - y).norm() < r0
    # ρ > 0: the closed-form proximal point satisfies the normal equations for integer offsets
    rho = 0.3
    x1 = op.data_step(z, y, rho)
    if geom == "step2":
        grad = op.adjoint(op(x1) - y) + rho * (x1 - z)
        assert grad.abs().max() < 1e-10
    else:  # majorised step: residual still decreases
        assert (op(x1) - y).norm() < r0


@pytest.mark.parametrize("geom", ["step2", "table", "frac"])
def test_norm(geom):
    op = make_op("3d", geom, "w", "strided", h=3, w=4)
    sigma = torch.linalg.matrix_norm(dense(op), ord=2).item()
    if geom == "frac":
        assert sigma <= op.norm() + 1e-12  # Φ ⪰ A Aᵀ: an upper bound
    else:
        assert sigma == pytest.approx(op.norm(), rel=1e-12)


@pytest.fixture(params=[1, 40 * 21])
def small_blocks(request, monkeypatch):
    """Row blocks of one row, or of a few rows with a ragged last block (float64 y rows of 88–168
    bytes), so that tiny cases run the blocked forward."""
    from cassi.physics.backends import strided

    monkeypatch.setattr(strided, "BLOCK_BYTES", request.param)
    assert len(strided._blocks(B, H, 8 * 17)) > 1 and len(strided._blocks(B, H, 8 * 11)) > 1


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("mask_kind", MASKS)
def test_strided_row_blocks_equal_loop(small_blocks, mask_kind, geom, axis):
    op = make_op(mask_kind, geom, axis, "strided")
    ref = make_op(mask_kind, geom, axis, "loop")
    x, y = rand((B, *op.x_shape)), rand((B, *op.y_shape), seed=2)
    torch.testing.assert_close(op(x), ref(x))
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
    torch.testing.assert_close(op.data_step(x, y, 0.2), ref.data_step(x, y, 0.2))


#: backends with a fused data step and pinv (tested against the composed loop)
FUSED = ("strided", "numba")
RHOS = {"0": lambda: 0.0, "float": lambda: 0.3, "0-d": lambda: torch.tensor(0.3, dtype=torch.float64),
        "per-sample": lambda: torch.tensor([0.1, 2.0], dtype=torch.float64).view(B, 1, 1, 1)}


@pytest.mark.parametrize("rho", list(RHOS))
@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step2", "table", "frac"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("backend", FUSED)
def test_fused_data_step_equals_composed(backend, mask_kind, geom, axis, rho):
    """A fused step = z + Aᵀ((y − A z) ⊘ (Φ + ρ)) composed from the loop's A and Aᵀ."""
    op = make_op(mask_kind, geom, axis, backend)
    ref = make_op(mask_kind, geom, axis, "loop")
    z, y = rand((B, *op.x_shape)), rand((B, *op.y_shape), seed=2)
    r = RHOS[rho]()
    w = ref.phi_inv if rho == "0" else 1 / (ref.phi + r)
    expected = z + ref.adjoint((y - ref(z)) * w)
    torch.testing.assert_close(op.data_step(z, y, r), expected)
    torch.testing.assert_close(ref.data_step(z, y, r), expected)
    for o in (op, ref):  # into a NaN-filled buffer, and in place (out = z)
        buf, zc = torch.full_like(z, float("nan")), z.clone()
        assert o.data_step(z, y, r, out=buf) is buf
        torch.testing.assert_close(buf, expected)
        assert o.data_step(zc, y, r, out=zc) is zc
        torch.testing.assert_close(zc, expected)


def test_data_step_tensor_rho_zero_is_guarded():
    """A learned ρ that reaches 0 divides by Φ + ρ = 0 where the mask leaves the detector dark."""
    op = make_op("3d", "step2", "w", "strided", h=3, w=4)
    assert (op.phi == 0).any()
    z, y = rand((1, *op.x_shape)), rand((1, *op.y_shape), seed=2)
    for backend in ("strided", "numba", "loop"):
        op.backend = BACKENDS[backend]()
        rho = torch.zeros((), dtype=torch.float64, requires_grad=True)
        x = op.data_step(z, y, rho)
        torch.testing.assert_close(x, op.data_step(z, y))
        x.sum().backward()
        assert torch.isfinite(rho.grad)


@pytest.mark.parametrize("backend", ["strided", "numba", "loop", "auto"])
@pytest.mark.parametrize("geom", ["step2", "frac"])
def test_data_step_gradcheck(backend, geom):
    """Differentiable in z, y and a learned ρ (per sample), twice (the fused step's backward is itself a step)."""
    op = make_op("batch", geom, "h", backend, h=4, w=5)
    z = rand((B, *op.x_shape)).requires_grad_()
    y = rand((B, *op.y_shape), seed=2).requires_grad_()
    rho = torch.tensor([0.2, 0.7], dtype=torch.float64).view(B, 1, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(op.data_step, (z, y, rho))
    assert torch.autograd.gradgradcheck(op.data_step, (z, y, rho))
    assert torch.autograd.gradcheck(lambda z, y: op.data_step(z, y, 0.5), (z, y))
    assert torch.autograd.gradcheck(lambda z, y: op.data_step(z, y), (z, y))


def test_data_step_like_an_unrolled_stage():
    """Unrolled networks: ρ a learned 0-d parameter and a per-sample tensor, float32, one backward:
    the fused (strided) step gives the gradients of the composed (loop) one."""
    grads = {}
    for backend in ("strided", "numba", "loop"):
        op = make_op("3d", "step2", "w", backend, torch.float32)
        theta = torch.tensor(-1.0, requires_grad=True)
        alpha = torch.tensor([0.05, 0.5]).view(B, 1, 1, 1).requires_grad_()
        y = rand((B, *op.y_shape), torch.float32, seed=2)
        z = op.pinv(y).requires_grad_()
        x = op.data_step(z, y, torch.nn.functional.softplus(theta))
        x = op.data_step(x * 0.9, y, alpha)
        (x ** 2).sum().backward()
        grads[backend] = (theta.grad, alpha.grad, z.grad)
    for fused in FUSED:
        for a, b in zip(grads[fused], grads["loop"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ batches of masks
@pytest.mark.parametrize("backend", ["loop", "strided", "scatter", "fold", "conv", "fft", "numba"])
def test_batch_of_masks_applies_one_mask_per_sample(backend):
    masks = make_mask("batch")
    op = CASSI(masks, step=2, backend=backend)
    x = rand((B, *op.x_shape))
    y = op(x)
    xt = op.adjoint(y)
    for b in range(B):
        single = CASSI(masks[b], step=2, backend="loop")
        torch.testing.assert_close(y[b : b + 1], single(x[b : b + 1]))
        torch.testing.assert_close(xt[b : b + 1], single.adjoint(y[b : b + 1]))
        torch.testing.assert_close(op.phi[b : b + 1], single.phi)


def test_expanded_mask_is_stored_once_and_broadcasts():
    mask = make_mask("2d")
    op = CASSI(mask[None, None].expand(B, 1, H, W), bands=C, step=2, backend="strided")
    single = CASSI(mask, bands=C, step=2, backend="loop")
    assert op.mask.shape == (1, 1, H, W) and op.phi.shape == (1, *single.y_shape)
    x = rand((B + 1, C, H, W))  # any batch, like a single mask
    torch.testing.assert_close(op(x), single(x))


def test_per_sample_2d_masks_broadcast_over_bands():
    masks = make_mask("2d", seed=3)[None, None].repeat(B, 1, 1, 1)
    masks[1] = make_mask("2d", seed=4)
    op = CASSI(masks, bands=C, step=2, backend="strided")
    full = CASSI(masks.expand(B, C, H, W).clone(), step=2, backend="loop")
    x = rand((B, C, H, W))
    torch.testing.assert_close(op(x), full(x))


# ------------------------------------------------------------------ autograd, dtype, out=
@pytest.mark.parametrize("backend, geom", supported_pairs(["loop", "strided", "fft", "scatter", "numba"], ["step2", "frac", "table"]))
def test_gradcheck(backend, geom):
    op = make_op("3d", geom, "h", backend, h=4, w=5)
    x = rand((1, *op.x_shape)).requires_grad_()
    y = rand((1, *op.y_shape), seed=2).requires_grad_()
    assert torch.autograd.gradcheck(op, (x,))
    assert torch.autograd.gradcheck(op.adjoint, (y,))
    assert torch.autograd.gradcheck(op.pinv, (y,))
    assert torch.autograd.gradgradcheck(op, (x,))


def test_to_dtype_and_float32_float64_agree():
    op = make_op("3d", "frac", "w", "strided", dtype=torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    y32 = op(x)
    op64 = op.to(torch.float64)
    assert op64.mask.dtype == op64.phi.dtype == torch.float64
    torch.testing.assert_close(op64(x.double()).float(), y32)
    with pytest.raises(TypeError, match="dtype"):
        op64(x)


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("backend", ["strided", "numba", "loop", "fold", "triton-missing"])
def test_out_buffers_and_fresh_results(backend, axis):
    if backend == "triton-missing":
        backend = "scatter"
    op = make_op("3d", "step2", axis, backend, torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    y_ref, xt_ref, xp_ref = op(x), op.adjoint(op(x)), op.pinv(op(x))
    y_out = torch.full((B, *op.y_shape), float("nan"))
    x_out = torch.full((B, *op.x_shape), float("nan"))
    assert op(x, out=y_out) is y_out
    torch.testing.assert_close(y_out, y_ref)
    assert op.adjoint(y_out, out=x_out) is x_out
    torch.testing.assert_close(x_out, xt_ref)
    assert op.pinv(y_out, out=x_out) is x_out
    torch.testing.assert_close(x_out, xp_ref)
    # no aliasing: a second call never reuses the first result's memory
    y1, y2 = op(x), op(x)
    x1, x2 = op.adjoint(y1), op.adjoint(y1)
    assert y1.data_ptr() != y2.data_ptr() and x1.data_ptr() != x2.data_ptr()
    y1.zero_()
    torch.testing.assert_close(y2, y_ref)


def test_out_rejects_wrong_shape_and_grad():
    op = make_op("3d", "step2", "w", "strided", torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    with pytest.raises(ValueError, match="out must have shape"):
        op(x, out=torch.empty(B, 1, H, W))
    y = op(x)
    with pytest.raises(ValueError, match="out must have shape"):
        op.data_step(x, y, out=torch.empty(B, 1, H, W))
    with pytest.raises(RuntimeError, match="not differentiable"):
        op.data_step(x, y, torch.tensor(0.5, requires_grad=True), out=torch.empty_like(x))
    with pytest.raises(RuntimeError, match="not differentiable"):
        op(x.requires_grad_(), out=torch.empty(B, *op.y_shape))
    with pytest.raises(RuntimeError, match="not differentiable"):
        op.data_step(x, y, out=torch.empty_like(x))


# ------------------------------------------------------------------ validation
def test_offsets_are_normalised_and_delta():
    mask = torch.ones(H, W)
    op = CASSI(mask, offsets=[2.5, 3.0, 5.7], backend="loop")
    assert op.offsets == pytest.approx([0.0, 0.5, 3.2])
    assert op.delta == 4 and op.y_shape == (1, H, W + 4)
    op = CASSI(mask, bands=28, step=2)
    assert op.delta == 54 and op.y_shape == (1, H, W + 54)
    assert CASSI(mask, bands=4, step=3, axis="h").y_shape == (1, H + 9, W)
    assert CASSI(mask, offsets=np.array([0, 1.0000000001, 2]), backend="fold").geometry.step == 1


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(mask=torch.ones(H, W)), ValueError, "needs bands="),
        (dict(mask=torch.ones(H, W), bands=3, step=0), ValueError, "step must be .* > 0.*got 0"),
        (dict(mask=torch.ones(H, W), bands=3, step=-1.5), ValueError, "step must be"),
        (dict(mask=torch.ones(H, W), bands=3, step=float("nan")), ValueError, "step must be"),
        (dict(mask=torch.ones(H, W), bands=3, step=float("inf")), ValueError, "step must be"),
        (dict(mask=torch.ones(C, H, W), offsets=[0, 1]), ValueError, "offsets has length 2 but the mask has 5"),
        (dict(mask=torch.ones(H, W), bands=3, offsets=[0, 1]), ValueError, "offsets has length 2 but bands=3"),
        (dict(mask=torch.ones(H, W), offsets=[0, float("nan")]), ValueError, "offsets must be finite"),
        (dict(mask=torch.ones(H, W), step=1, offsets=[0, 1]), ValueError, "either step= or offsets=, not both"),
        (dict(mask=torch.ones(H, W), offsets=[]), ValueError, "offsets must not be empty"),
        (dict(mask=torch.ones(C, H, W), bands=4), ValueError, "bands=4 does not match the mask's 5 bands"),
        (dict(mask=torch.full((H, W), float("nan")), bands=3), ValueError, "mask contains NaN or Inf"),
        (dict(mask=torch.zeros(H, W), bands=3), ValueError, "mask is all zeros"),
        (dict(mask=torch.ones(W)), ValueError, r"mask must be \(H, W\).*got shape \(9,\)"),
        (dict(mask=[[1.0]]), TypeError, "mask must be a torch.Tensor or numpy array, got list"),
        (dict(mask=torch.ones(H, W), bands=3, axis="x"), ValueError, "axis must be 'w' or 'h', got 'x'"),
        (dict(mask=torch.ones(H, W), bands=3, backend="magic"), ValueError, "backend must be one of .*got 'magic'"),
        (dict(mask=torch.ones(H, W), bands=0), ValueError, "bands must be a positive integer, got 0"),
    ],
)
def test_constructor_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        CASSI(**kwargs)


def test_call_errors_name_the_argument_and_shapes():
    op = CASSI(torch.ones(H, W), bands=C, step=2, backend="strided")
    with pytest.raises(ValueError, match=r"x must be a cube \(B, C, H, W\) with \(C, H, W\)=\(5, 7, 9\), got shape \(2, 4, 7, 9\)"):
        op(torch.rand(B, 4, H, W))
    with pytest.raises(ValueError, match=r"x must be .*got shape \(5, 7, 9\)"):
        op(torch.rand(C, H, W))
    with pytest.raises(ValueError, match=r"y must be a measurement .*\(1, 7, 17\), got shape \(2, 1, 7, 16\)"):
        op.adjoint(torch.rand(B, 1, H, W + 7))
    with pytest.raises(ValueError, match=r"y must be"):
        op.pinv(torch.rand(B, 1, H, W + 7))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        op(np.zeros((B, C, H, W)))
    batch_op = CASSI(torch.ones(3, C, H, W), backend="strided")
    with pytest.raises(ValueError, match="x has batch 2 but the operator has a batch of 3 masks"):
        batch_op(torch.rand(B, C, H, W))


def test_numpy_and_integer_masks_are_accepted():
    op = CASSI(np.ones((H, W), dtype=np.uint8), bands=3, step=1, backend="loop")
    assert op.mask.dtype == torch.float32
    assert CASSI(np.ones((H, W)), bands=3).mask.dtype == torch.float32  # loadmat's float64 -> float32
    assert CASSI(torch.ones(H, W, dtype=torch.float64), bands=3).mask.dtype == torch.float64
    assert op(torch.ones(1, 3, H, W)).sum() == 3 * H * W


# ------------------------------------------------------------------ auto, compiled, triton
def test_auto_picks_a_supported_backend_and_caches():
    op = make_op("3d", "frac", "w", "auto", torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    op(x)
    chosen = op.backend.choice(x, op.mask, op.geometry)
    assert chosen.name in ("numba", "strided", "loop")  # scatter and fold cannot do fractional offsets
    assert op.backend.choice(x, op.mask, op.geometry) is chosen
    with pytest.raises(UnsupportedGeometry, match="no candidate"):
        CASSI(torch.ones(H, W), offsets=[0, 0.5], backend=AutoBackend(candidates=("fold", "scatter")))
    with pytest.raises(ValueError, match="concrete backends"):
        AutoBackend(candidates=("auto",))


class _Wrong(Backend):
    """A deliberately wrong backend: ``loop`` with one defect, and free to be fastest."""

    def __init__(self, defect):
        self.name, self.defect, self.ref = f"wrong-{defect}", defect, BACKENDS["loop"]()

    def forward(self, x, mask, g, out=None):
        if self.defect == "raises":
            raise RuntimeError("kernel exploded")
        y = self.ref.forward(x, mask, g)
        if self.defect == "scaled":
            y = y * 1.001
        if self.defect == "ignores-out" or out is None:
            return y
        return out.copy_(y)

    def adjoint(self, y, mask, g, out=None):
        x = self.ref.adjoint(y, mask, g, out)
        if self.defect == "shifted":  # the window of the wrong columns
            x[..., :-1] = x[..., 1:].clone()
        return x

    def data_step(self, z, y, w, mask, g, out=None):
        if not self.defect.startswith("step-"):
            return None
        u = y - self.ref.forward(z, mask, g)
        r = self.ref.adjoint(u * w, mask, g)
        if self.defect == "step-ignores-out" or out is None:
            return z + r, u  # right values, but never written into out
        out.zero_()  # step-clobbers-z: right into a separate buffer, wrong in place (out = z is zeroed first)
        return out.add_(z).add_(r), u


DEFECTS = ("raises", "scaled", "shifted", "ignores-out", "step-ignores-out", "step-clobbers-z")


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step2", "frac"])
@pytest.mark.parametrize("defect", DEFECTS)
def test_auto_drops_a_wrong_or_raising_candidate(defect, geom, axis, caplog):
    """auto checks every candidate against loop before timing it: a wrong one is never chosen, even
    when it would be the fastest, and the reason is logged."""
    wrong = _Wrong(defect)
    auto = AutoBackend(candidates=(wrong, "strided"))
    op = make_op("batch", geom, axis, auto, torch.float32)
    ref = make_op("batch", geom, axis, "loop", torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    with caplog.at_level(logging.WARNING, logger="cassi"):
        torch.testing.assert_close(op(x), ref(x))
    assert op.backend.choice(op._t(x), op._t(op.mask), op.geometry).name == "strided"
    reasons = [r[wrong.name] for r in AutoBackend.rejected.values() if wrong.name in r]
    assert reasons, "the wrong candidate was not dropped"
    assert ("raised RuntimeError: kernel exploded" if defect == "raises" else "differs from loop") in reasons[0]
    assert any(wrong.name in m and "dropped" in m for m in caplog.messages)


def test_auto_verify_accepts_correct_backends():
    """``verify`` passes every correct backend on every geometry it supports (no false alarms)."""
    from cassi.physics.backends.auto import verify

    for geom in GEOMETRIES:
        for axis in ("w", "h"):
            for backend in ("loop", "strided", "numba", "scatter", "fold", "conv", "fft"):
                if not supported(backend, geom):
                    continue
                for dtype in (torch.float32, torch.float64):
                    op = make_op("batch", geom, axis, backend, dtype)
                    x = op._t(rand((B, *op.x_shape), dtype))
                    assert verify(op.backend, x, op._t(op.mask), op.geometry) is None, (backend, geom, axis, dtype)


def test_auto_says_why_when_no_candidate_is_left():
    auto = AutoBackend(candidates=(_Wrong("scaled"), _Wrong("raises")))
    op = make_op("2d", "step2", "w", auto, torch.float32)
    with pytest.raises(UnsupportedGeometry, match="wrong-scaled: A differs from loop.*wrong-raises: raised"):
        op(rand((B, *op.x_shape), torch.float32))


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("mask_kind", MASKS)
def test_compiled_equals_loop(mask_kind, geom, axis):
    """Tiny sizes: each distinct geometry and layout costs a compilation (~2 s, ~20 s for the first)."""
    op = make_op(mask_kind, geom, axis, "compiled", torch.float32)
    ref = make_op(mask_kind, geom, axis, "loop", torch.float32)
    x, y = rand((B, *op.x_shape), torch.float32), rand((B, *op.y_shape), torch.float32, 2)
    torch.testing.assert_close(op(x), ref(x))
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))


def test_triton_without_cuda_says_what_it_needs(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    op = make_op("2d", "step2", "w", "triton", torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA device or TRITON_INTERPRET=1"):
        op(rand((B, *op.x_shape), torch.float32))


def test_every_backend_is_tested():
    assert set(BACKENDS) == {"loop", "conv", "scatter", "fold", "strided", "fft", "compiled", "triton", "numba", "auto"}


def test_import_cassi_is_light():
    import subprocess
    import sys

    code = "import sys, cassi; bad=[m for m in ('lightning','hydra','pytorch_lightning','omegaconf','triton','numba') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
