"""The numba backend beyond the shared backend tests of test_operator.py: memory layouts and out=
buffers, dtypes and devices it refuses (and auto's fallback), threads, the on-disk JIT cache, fork
safety. Geometry-by-geometry equality with loop, gradcheck and the fused data step are in
test_operator.py (parametrised over backends)."""
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from cassi import CASSI
from cassi.physics.backends import AutoBackend, UnsupportedGeometry
from cassi.physics.backends import numba as nb
from test_operator import B, C, H, W, make_op, rand


@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step2", "frac"])
def test_non_contiguous_inputs_and_out_buffers(geom, axis):
    """Slices, broadcast (stride-0) gradients and strided out= views give loop's results; out= is
    written in place (the returned tensor is out)."""
    op, ref = make_op("batch", geom, axis, "numba"), make_op("batch", geom, axis, "loop")
    big = rand((B, 2 * C, H + 3, W + 4))
    x = big[:, ::2, 1 : H + 1, 2 : W + 2]  # non-contiguous in every dimension
    y = rand((1, 1, 1, op.y_shape[-1])).expand(B, *op.y_shape)  # stride 0, like the gradient of a sum
    torch.testing.assert_close(op(x), ref(x))
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
    torch.testing.assert_close(op.pinv(y), ref.pinv(y))
    torch.testing.assert_close(op.data_step(x, y, 0.2), ref.data_step(x, y, 0.2))
    y_out = torch.full((B, *op.y_shape[:-1], op.y_shape[-1] + 3), float("nan"), dtype=torch.float64)[..., 1:-2]
    x_out = torch.full((B, C + 1, *op.x_shape[1:]), float("nan"), dtype=torch.float64)[:, 1:]
    assert op(x, out=y_out) is y_out and op.adjoint(y, out=x_out) is x_out
    torch.testing.assert_close(y_out, ref(x))
    torch.testing.assert_close(x_out, ref.adjoint(y))
    assert op.pinv(y, out=x_out) is x_out
    torch.testing.assert_close(x_out, ref.pinv(y))


@pytest.mark.parametrize("axis", ["w", "h"])
def test_fresh_outputs_keep_the_operator_layout(axis):
    """Results are fresh tensors of the usual layout (contiguous (B, C, H, W) / (B, 1, H', W'))."""
    op = make_op("3d", "step2", axis, "numba", torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    y = op(x)
    assert y.is_contiguous() and op.adjoint(y).is_contiguous() and op.pinv(y).is_contiguous()


def test_other_dtypes_are_refused_and_auto_falls_back():
    mask = (torch.rand(H, W) > 0.4).to(torch.bfloat16)
    x = torch.rand(B, C, H, W).to(torch.bfloat16)
    with pytest.raises(UnsupportedGeometry, match="float32 and float64 only, got torch.bfloat16"):
        CASSI(mask, bands=C, step=2, backend="numba")(x)
    op = CASSI(mask, bands=C, step=2, backend=AutoBackend(candidates=("numba", "strided", "loop")))
    ref = CASSI(mask, bands=C, step=2, backend="loop")
    torch.testing.assert_close(op(x).float(), ref(x).float(), rtol=2e-2, atol=2e-2)
    assert op.backend.choice(x, op.mask, op.geometry).name != "numba"
    why = [r["numba"] for k, r in AutoBackend.rejected.items() if k and k[2] == torch.bfloat16 and "numba" in r]
    assert why and why[0].startswith("unsupported") and "bfloat16" in why[0]


@pytest.mark.parametrize("forked", [False, True])
@pytest.mark.parametrize("rows", [1, 3, H])
def test_every_row_block_size_equals_loop(monkeypatch, rows, forked):
    """Tasks cover blocks of R rows (R = 3 leaves a partial block of H = 7) and bands in groups of four (C = 5
    leaves a partial group), in the parallel kernels and in the serial twins of a forked child: A, Aᵀ, pinv and
    the data step equal loop's, whatever R the thread count would choose."""
    monkeypatch.setattr(nb, "_rows_per_task", lambda outer, h, cap: rows)
    monkeypatch.setattr(nb, "_FORKED", forked)
    op, ref = make_op("batch", "frac", "w", "numba"), make_op("batch", "frac", "w", "loop")
    x, y = rand((B, *op.x_shape)), rand((B, *op.y_shape))
    torch.testing.assert_close(op(x), ref(x))
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
    torch.testing.assert_close(op.pinv(y), ref.pinv(y))
    torch.testing.assert_close(op.data_step(x, y, 0.2), ref.data_step(x, y, 0.2))


@pytest.mark.parametrize("forked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [37, 64])
@pytest.mark.parametrize("geom", ["step2", "frac"])
def test_streamed_stores_equal_loop(monkeypatch, geom, width, dtype, forked):
    """Aᵀ and pinv writing x with non-temporal stores (what a cube larger than the last-level cache gets): rows
    of 37 start off the 64-byte boundary (a plain head, 64-byte stores, a plain tail), rows of 64 on it; into a
    fresh buffer and into out=, equal to loop's, in the parallel kernels and in the serial twins."""
    monkeypatch.setattr(nb, "_streams", lambda t: True)
    monkeypatch.setattr(nb, "_FORKED", forked)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(H, width, generator=g) > 0.4).to(dtype)
    kw = {"step": 2} if geom == "step2" else {"step": 1.5}
    op, ref = (CASSI(mask, bands=C, backend=b, **kw) for b in ("numba", "loop"))
    y = rand((B, *op.y_shape), dtype)
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
    torch.testing.assert_close(op.pinv(y), ref.pinv(y))
    out = torch.full((B, C, H, width), float("nan"), dtype=dtype)
    assert op.adjoint(y, out=out) is out
    torch.testing.assert_close(out, ref.adjoint(y))
    torch.testing.assert_close(op.data_step(out, y, 0.2), ref.data_step(out, y, 0.2))  # the step streams x too
    z = out.clone()
    assert op.data_step(z, y, 0.2, out=z) is z  # in place: each streamed x row is computed before it is written
    torch.testing.assert_close(z, ref.data_step(out, y, 0.2))


@pytest.mark.parametrize("mask_kind", ["3d", "batch"])
@pytest.mark.parametrize("geom", ["step2", "frac"])
def test_streamed_stores_with_per_band_and_per_sample_masks(monkeypatch, geom, mask_kind):
    """The streamed kernels index a mask plane per band (3-D masks) and per sample (batches of masks) alike:
    Aᵀ, pinv and the data step (fresh and in place) equal loop's, in float32 and float64."""
    monkeypatch.setattr(nb, "_streams", lambda t: True)
    for dtype in (torch.float32, torch.float64):
        op, ref = make_op(mask_kind, geom, "w", "numba", dtype, w=37), make_op(mask_kind, geom, "w", "loop", dtype, w=37)
        y, z = rand((B, *op.y_shape), dtype), rand((B, *op.x_shape), dtype, seed=2)
        torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
        torch.testing.assert_close(op.pinv(y), ref.pinv(y))
        expect = ref.data_step(z, y, 0.3)
        torch.testing.assert_close(op.data_step(z, y, 0.3), expect)
        torch.testing.assert_close(op.data_step(z, y, 0.3, out=z), expect)


@pytest.mark.parametrize("streams", [False, True])
def test_adjoint_asks_for_streamed_stores_exactly_when_x_exceeds_the_cache(monkeypatch, streams):
    """Aᵀ, pinv and the data step pass ``_streams(x)`` to the kernel; and the compiled kernel does contain
    non-temporal stores (x86-64: ``movnt``), so a lost ``!nontemporal`` would show."""
    monkeypatch.setattr(nb, "_streams", lambda t: streams)
    calls = []
    real = nb._run
    monkeypatch.setattr(nb, "_run", lambda name, *args: (calls.append((name, args[-1])), real(name, *args))[1])
    op = make_op("2d", "step2", "w", "numba", torch.float32)
    x, y = rand((B, *op.x_shape), torch.float32), rand((B, *op.y_shape), torch.float32)
    op.adjoint(y), op.pinv(y), op.data_step(x, y, 0.2)
    assert [c for c in calls if c[0] == "adj_w"] == [("adj_w", streams)] * 2
    assert [c for c in calls if c[0] == "step_w"] == [("step_w", streams)]
    if streams and platform.machine() in ("x86_64", "AMD64"):  # the kernels' cached code cannot be inspected:
        import numba  # compile the row streamer afresh and look at its machine code
        import numpy as np

        row = nb._kernels()._stream
        stream = numba.njit(cache=False)(lambda d, s: row(d, s))
        d, s = np.zeros(100, np.float32), np.arange(100, dtype=np.float32)
        stream(d, s)
        assert np.array_equal(d, s)
        assert any("movnt" in asm for asm in stream.inspect_asm().values())


def test_only_cubes_larger_than_the_cache_are_streamed(monkeypatch):
    """A solver's cache-sized x is written through the cache (its next step reads it back from there); a cube
    larger than the last-level cache is streamed."""
    assert nb._last_level_cache() >= 2**16  # the real query finds a cache (or assumes 32 MiB)
    monkeypatch.setattr(nb, "_last_level_cache", lambda: 1000)
    assert not nb._streams(torch.zeros(250)) and nb._streams(torch.zeros(251))
    assert nb._streams(torch.zeros(126, dtype=torch.float64))


def test_refuses_other_devices_and_a_missing_numba(monkeypatch):
    g = make_op("2d", "step2", "w", "loop").geometry
    with pytest.raises(UnsupportedGeometry, match="CPU only"):
        nb.NumbaBackend().check(g, torch.device("cuda"))
    monkeypatch.setattr(nb, "available", lambda: False)
    with pytest.raises(UnsupportedGeometry, match="pip install numba"):
        make_op("2d", "step2", "w", "numba")


def test_threads_follow_torch(monkeypatch):
    """The parallel kernel runs with n = torch.get_num_threads() numba threads (capped at numba's pool)."""
    import numba

    from cassi.physics.backends import _numba_kernels

    op = make_op("3d", "frac", "w", "numba", torch.float32)
    x = rand((B, *op.x_shape), torch.float32)
    expected = op(x)
    ran = []
    for name in ("fwd_w", "fwd_w_serial"):
        kernel = getattr(_numba_kernels, name)
        monkeypatch.setattr(_numba_kernels, name,
                            lambda *a, kernel=kernel, name=name: (ran.append((name, numba.get_num_threads())),
                                                                  kernel(*a)))
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(op(x), expected)
    finally:
        torch.set_num_threads(before)
    assert ran == [("fwd_w", 1), ("fwd_w", min(2, numba.config.NUMBA_NUM_THREADS))]


def _python(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={**os.environ, **env})


@pytest.mark.slow
def test_jit_cache_spares_a_second_process_the_compilation(tmp_path):
    """cache=True: the first process compiles and writes the cache (here under tmp_path), the second
    loads it (numba's dispatcher counts cache hits and misses)."""
    code = """
        import torch
        from cassi import CASSI
        from cassi.physics.backends.numba import _kernels
        op = CASSI(torch.rand(6, 7), bands=3, step=2, backend="numba")
        op(torch.rand(1, 3, 6, 7))
        s = [_kernels().fwd_w.stats, _kernels().fwd_w_serial.stats]  # the kernel that ran: parallel or serial
        print(sum(sum(t.cache_hits.values()) for t in s), sum(sum(t.cache_misses.values()) for t in s))
    """
    cache = tmp_path / "numba_cache"
    first = _python(code, tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["0", "1"]
    assert any(cache.rglob("*.nbi")) and any(cache.rglob("*.nbc"))
    second = _python(code, tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["1", "0"]


def test_a_forked_child_can_run_the_kernels(tmp_path):
    """DataLoader workers are forked: a child must be able to call a kernel after its parent did (with
    GNU OpenMP as numba's threading layer, numba aborts a child that enters a parallel region: the
    child runs the serial twins)."""
    code = """
        import multiprocessing as mp
        import torch
        from cassi import CASSI
        torch.set_num_threads(2)  # the parent runs the parallel kernels (numba's OpenMP layer)
        op = CASSI(torch.rand(6, 7), bands=3, step=2, backend="numba")
        x = torch.rand(2, 3, 6, 7)
        expected = op(x)
        from cassi.physics.backends import numba as nb
        nb._LOCK.acquire()  # as if another thread of the parent were in a kernel when it forked
        def child(q):
            q.put(torch.equal(op(x), expected))
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(300)
        print(p.exitcode, q.get(timeout=5) if p.exitcode == 0 else None)
    """
    r = _python(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "True"], r.stdout + r.stderr



@pytest.mark.parametrize("axis", ["w", "h"])
@pytest.mark.parametrize("geom", ["step2", "frac"])
@pytest.mark.parametrize("masks", ["2d", "batch"])
def test_serial_kernels_equal_the_loop(masks, geom, axis, monkeypatch):
    """The serial twins that forked children (DataLoader workers) run compute the same operator."""
    monkeypatch.setattr(nb, "_FORKED", True)
    op, ref = make_op(masks, geom, axis, "numba"), make_op(masks, geom, axis, "loop")
    x, y = rand((B, *op.x_shape)), rand((B, *op.y_shape))
    torch.testing.assert_close(op(x), ref(x))
    torch.testing.assert_close(op.adjoint(y), ref.adjoint(y))
    torch.testing.assert_close(op.pinv(y), ref.pinv(y))
    torch.testing.assert_close(op.data_step(x, y, 0.2), ref.data_step(x, y, 0.2))


def test_first_call_keeps_torchs_thread_setting(tmp_path):
    """numba's OpenMP layer shares torch's OpenMP runtime; starting it must not reset torch's threads."""
    code = """
        import numba, torch
        from cassi import CASSI
        torch.set_num_threads(1)
        CASSI(torch.rand(6, 7), bands=3, step=2, backend="numba")(torch.rand(1, 3, 6, 7))
        print(torch.get_num_threads(), numba.get_num_threads())
    """
    r = _python(code, tmp_path, NUMBA_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"], r.stdout + r.stderr
