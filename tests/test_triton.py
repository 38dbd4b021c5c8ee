"""The triton backend: fused A, Aᵀ, pinv and data step equal to the reference loop, adjoint, every
block size, float32/bfloat16/float16 and 64-bit indexing, autograd through the fused data step.

On CPU the kernels run in Triton's interpreter at tiny sizes; the interpreter must be switched on
before triton is first imported, so those checks run in a fresh process. On a CUDA machine the
same checks run at real sizes: ``pytest -m gpu tests/test_triton.py``.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cassi import CASSI

TINY = (2, 5, 7, 9)  # B, C, H, W: odd, non-square


def geometries(C: int) -> dict:
    return {
        "step1": dict(step=1),
        "step2": dict(step=2),
        "table": dict(offsets=[(5 * c) % (C + 2) for c in range(C)]),  # integer, unordered, non-uniform
        "frac": dict(offsets=[1.6 * c + 0.3 * (c % 2) for c in range(C)]),
    }


def make(kind, geom, axis, backend, dtype, size, device, seed=0):
    B, C, H, W = size
    g = torch.Generator().manual_seed(seed)
    shape = {"2d": (H, W), "3d": (C, H, W), "batch": (B, C, H, W)}[kind]
    mask = (torch.rand(shape, generator=g) > 0.35).double() * (0.5 + torch.rand(shape, generator=g, dtype=torch.float64))
    return CASSI(mask.to(device, dtype), bands=C if kind == "2d" else None, axis=axis, backend=backend,
                 **geometries(C)[geom])


def rand(shape, dtype, device, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(device, dtype)


def close(got, want, tol):
    err = (got.double() - want.double()).abs().max().item()
    return err <= tol * max(1.0, want.double().abs().max().item()), err


def check_matrix(size, device, kinds=("2d", "3d", "batch"), geoms=None, axes="wh") -> list:
    """Every map and out= against the loop (float32), adjointness in float64, fused = composed data step."""
    bad = []
    for kind in kinds:
        for geom in geoms or geometries(size[1]):
            for axis in axes:
                op = make(kind, geom, axis, "triton", torch.float32, size, device)
                ref = make(kind, geom, axis, "loop", torch.float32, size, device)
                x = rand((size[0], *op.x_shape), torch.float32, device, 1)
                y = rand((size[0], *op.y_shape), torch.float32, device, 2)
                rho = torch.tensor([0.1, 2.0] * (size[0] // 2) + [0.5] * (size[0] % 2), device=device).view(-1, 1, 1, 1)
                yo, xo, po = (torch.full_like(t, float("nan")) for t in (y, x, x))
                fused = op.data_step(x, y, rho)
                maps = {
                    "A": (op(x), ref(x)), "At": (op.adjoint(y), ref.adjoint(y)), "pinv": (op.pinv(y), ref.pinv(y)),
                    "A out=": (op(x, out=yo), ref(x)), "At out=": (op.adjoint(y, out=xo), ref.adjoint(y)),
                    "pinv out=": (op.pinv(y, out=po), ref.pinv(y)),
                    "step": (op.data_step(x, y), ref.data_step(x, y)),
                    "step rho": (fused, ref.data_step(x, y, rho)),
                    "fused = composed": (fused, x + op.adjoint((y - op(x)) * op._weights(rho))),
                }
                for name, (got, want) in maps.items():
                    ok, err = close(got, want, 1e-5)
                    if not ok:
                        bad.append(f"{kind}/{geom}/{axis} {name}: max error {err:.3g}")
                op64 = make(kind, geom, axis, "triton", torch.float64, size, device)
                x, y = x.double(), y.double()
                lhs, rhs = (op64(x) * y).sum().item(), (x * op64.adjoint(y)).sum().item()
                if abs(lhs - rhs) > 1e-12 * abs(lhs):
                    bad.append(f"{kind}/{geom}/{axis} adjointness: <Ax,y> {lhs!r} vs <x,A'y> {rhs!r}")
    return bad


def check_dtypes(size, device) -> list:
    """bfloat16/float16 inputs, float32 sums: within one rounding of the output of the float64 loop."""
    bad = []
    for dtype in (torch.bfloat16, torch.float16):
        for geom in ("step2", "frac"):
            op = make("batch", geom, "w", "triton", dtype, size, device)
            ref = CASSI(op.mask.double(), offsets=op.offsets, backend="loop")
            x, y = rand((size[0], *op.x_shape), dtype, device, 1), rand((size[0], *op.y_shape), dtype, device, 2)
            xd, yd = x.double(), y.double()
            maps = {"A": (op(x), ref(xd)), "At": (op.adjoint(y), ref.adjoint(yd)), "pinv": (op.pinv(y), ref.pinv(yd)),
                    "step": (op.data_step(x, y, 0.3), ref.data_step(xd, yd, 0.3))}
            for name, (got, want) in maps.items():  # the step also rounds Φ, stored in the operator's dtype
                ok, err = close(got, want, torch.finfo(dtype).eps * (2 if name == "step" else 1))
                if not ok or got.dtype != dtype:
                    bad.append(f"{dtype}/{geom} {name}: {got.dtype}, max error {err:.3g}")
    return bad


def check_blocks(size, device, configs) -> list:
    """Each block size the tuner may choose (and small tiles: several column blocks, ragged edges)."""
    from cassi.physics.backends import triton as T

    saved = T.CONFIGS, T.STEP_CONFIGS, T.INTERPRET_CONFIG
    bad = []
    try:
        for cfg in configs:
            T.CONFIGS = T.STEP_CONFIGS = (cfg,)
            T.INTERPRET_CONFIG = cfg
            T._TUNED.clear()
            bad += [f"config {cfg}: {b}" for b in check_matrix(size, device, ("batch",), ("frac",), "w")]
    finally:
        T.CONFIGS, T.STEP_CONFIGS, T.INTERPRET_CONFIG = saved
        T._TUNED.clear()
    return bad


def check_int64(size, device) -> list:
    """The 64-bit index path (forced: tensors of 2³¹ elements do not fit a CPU test)."""
    from cassi.physics.backends import triton as T

    wide, T._wide = T._wide, lambda *t: True
    T._TUNED.clear()
    try:
        return [f"int64: {b}" for b in check_matrix(size, device, ("batch",), ("step2", "frac"), "wh")]
    finally:
        T._wide = wide


def check_autograd(device) -> list:
    """gradcheck (float64) of the fused data step in z, y and a per-sample ρ, and of A and pinv."""
    bad = []
    op = make("batch", "frac", "h", "triton", torch.float64, (2, 3, 3, 2), device)
    z = rand((2, *op.x_shape), torch.float64, device, 1).requires_grad_()
    y = rand((2, *op.y_shape), torch.float64, device, 2).requires_grad_()
    rho = torch.tensor([0.2, 0.7], dtype=torch.float64, device=device).view(2, 1, 1, 1).requires_grad_()
    for name, fn, args in (("data_step", op.data_step, (z, y, rho)), ("A", op, (z,)), ("pinv", op.pinv, (y,))):
        try:
            torch.autograd.gradcheck(fn, args, fast_mode=True)
        except Exception as e:  # noqa: BLE001 - report every failure
            bad.append(f"gradcheck {name}: {str(e).splitlines()[0]}")
    return bad


def interpreted() -> None:
    """All checks at tiny sizes (run with TRITON_INTERPRET=1)."""
    bad = (check_matrix(TINY, "cpu", ("batch",))  # every geometry and axis; the other mask layouts on two
           + check_matrix(TINY, "cpu", ("2d", "3d"), ("step2", "frac"), "w")
           + check_dtypes(TINY, "cpu")
           + check_blocks(TINY, "cpu", [(4, 8, 1), (1, 16, 1)])  # several row and column blocks, ragged ends
           + check_int64(TINY, "cpu") + check_autograd("cpu"))
    print("\n".join(bad) or "all equal")
    raise SystemExit(bool(bad))


@pytest.mark.slow
def test_triton_interpreted():
    pytest.importorskip("triton", reason="triton is part of the dev install (pip install -e '.[dev]')")
    here = Path(__file__).parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(here), str(here.parent)]))
    r = subprocess.run([sys.executable, "-c", "import test_triton; test_triton.interpreted()"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]


# ------------------------------------------------------------------ the same at real sizes on a GPU
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
REAL = {"seed": (16, 28, 256, 256), "many_bands": (2, 128, 256, 256), "real": (1, 28, 660, 660)}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("size", list(REAL))
def test_triton_gpu_matrix(size):
    assert check_matrix(REAL[size], "cuda") == []


@pytest.mark.gpu
@gpu
def test_triton_gpu_dtypes_blocks_autograd():
    from cassi.physics.backends import triton as T

    assert check_dtypes(REAL["seed"], "cuda") == []
    assert check_blocks((4, 28, 256, 256), "cuda", sorted(set(T.CONFIGS + T.STEP_CONFIGS))) == []
    assert check_autograd("cuda") == []


@pytest.mark.gpu
@gpu
def test_triton_gpu_beyond_int32_indexing():
    """x of 2³¹ + elements (bfloat16, 4.3 GB): rows at the far end match the loop on the same rows."""
    B, C, H, W = 1, 32, 8192, 8200
    assert B * C * H * W >= 2**31
    mask = (torch.rand(H, W, device="cuda") > 0.5).to(torch.bfloat16)
    op = CASSI(mask, bands=C, step=2, backend="triton")
    x = torch.rand(B, C, H, W, device="cuda", dtype=torch.bfloat16)
    y = op(x)
    tail = slice(H - 3, H)
    ref = CASSI(mask[tail].float(), bands=C, step=2, backend="loop")
    torch.testing.assert_close(y[:, :, tail].float(), ref(x[:, :, tail].float()), rtol=1e-2, atol=1e-2)
    xt = op.adjoint(y)
    torch.testing.assert_close(xt[:, :, tail].float(), ref.adjoint(y[:, :, tail].float()), rtol=1e-2, atol=1e-2)
    del xt
    step = op.data_step(x, y, 0.5)
    torch.testing.assert_close(step[:, :, tail].float(), ref.data_step(x[:, :, tail].float(), y[:, :, tail].float(), 0.5),
                               rtol=2e-2, atol=2e-2)
