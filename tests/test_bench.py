"""The benchmark's floor: the bytes each map must read and write, and kernels that move exactly those."""
import pytest
import torch

from cassi import bench


@pytest.fixture(autouse=True)
def no_retries(monkeypatch):
    monkeypatch.setattr(bench, "RETRIES", 0)  # timings here are smoke, never repeated for a busy machine

# the seed case B16 C28 256² step 2, float32, one 2-D mask
X, Y, M = 16 * 28 * 256 * 256 * 4, 16 * 256 * (256 + 54) * 4, 256 * 256 * 4


def test_traffic_per_map():
    """A reads x and the mask and writes y; Aᵀ reads y and the mask and writes x; A then Aᵀ both;
    the data step reads z, y and the mask and writes x."""
    assert bench.traffic("A", X, Y, M) == (117_440_512 + 262_144, 5_079_040)
    assert bench.traffic("At", X, Y, M) == (5_079_040 + 262_144, 117_440_512)
    assert bench.traffic("A+At", X, Y, M) == (117_440_512 + 5_079_040 + 2 * 262_144, 117_440_512 + 5_079_040)
    assert bench.traffic("step", X, Y, M) == (117_440_512 + 5_079_040 + 262_144, 117_440_512)
    with pytest.raises(KeyError):
        bench.traffic("A x", X, Y, M)


def test_floor_kernels_move_the_maps_bytes(monkeypatch):
    """Both floor kernels (torch, and the numba pass where numba is installed) read the map's reads and write
    its writes: the common part copied, every other element of src read (their sum returned), every other
    element of dst written."""
    calls, bufs = [], []
    real = bench._floor_buffers
    monkeypatch.setattr(bench, "_floor_buffers", lambda *a: bufs.append(real(*a)) or bufs[-1])
    monkeypatch.setattr(bench, "_median_ms", lambda fn, repeats, warmup, sync: calls.append(fn) or 1.0)
    cases = [bench.traffic("A", 4000, 400, 40), bench.traffic("At", 4000, 400, 40), (1000, 1000), (12, 20),
             (4 * 200_003, 12), (8, 4 * 200_003)]  # the last two: extra reads / writes over several tasks
    for read, write in cases:
        calls.clear(), bufs.clear()
        bench.floor_ms(read, write, 1, 0, "cpu", lambda: None)
        (src, dst, n), = bufs
        assert (src.numel() * 4, dst.numel() * 4, n) == (read // 4 * 4, write // 4 * 4, min(read, write) // 4)
        assert len(calls) == (1 if bench._stream_pass() is None else 2)  # torch's kernel and the numba pass
        for fn in calls:
            dst.fill_(float("nan"))
            total = fn()
            assert torch.equal(dst[:n], src[:n])
            assert not dst.isnan().any()  # every byte it must write is written
            assert total == pytest.approx(src[n:].double().sum().item(), rel=1e-4, abs=1e-6)  # and read


@pytest.mark.parametrize("n,extra_r,extra_w", [(1, 0, 0), (15, 0, 0), (1000, 0, 0), (3 * (1 << 16) + 7, 0, 0),
                                               (100, 5000, 0), (3, 200_000, 0), (100, 0, 9000), (0, 0, 70000)])
def test_streaming_pass_copies_reads_and_writes(n, extra_r, extra_w):
    """The numba pass: a plain head up to the 64-byte boundary, 64-byte non-temporal stores, a plain tail,
    over tasks; an offset view starts off the boundary. The common part equals src, the rest of dst is the
    fixed row's values (not NaN, not the old contents), the rest of src is read (its sum returned)."""
    stream = bench._stream_pass()
    if stream is None:
        pytest.skip("numba is not installed")
    src, buf = torch.rand(n + extra_r + 3), torch.empty(n + extra_w + 3)
    for off in (0, 3):
        s, dst = src[off:off + n + extra_r], buf[off:off + n + extra_w].fill_(float("nan"))
        assert stream(dst, s, n) == pytest.approx(s[n:].double().sum().item(), rel=1e-4, abs=1e-6)
        assert torch.equal(dst[:n], s[:n])
        assert not dst[n:].isnan().any() and ((dst[n:] >= 0) & (dst[n:] < 1)).all()
    with pytest.raises(ValueError, match="contiguous 1-D float32"):
        stream(buf[::2], src[::2], 1)  # strided: the streamed stores would ignore the stride
    with pytest.raises(ValueError, match="n ≤ their sizes"):
        stream(buf, src, buf.numel() + 1)


def test_run_case_rows_carry_the_floor(monkeypatch):
    # no clock involved: the floor's kernels (defined in bench._floor) take 2 ms alone and 2.5 ms in turn with a
    # backend's map (the machine drifted), any other call 3 ms
    def fake(fns, *a):
        floor = 2.0 if len(fns) == 1 else 2.5
        return [(f(), floor if "_floor." in f.__qualname__ else 3.0)[1] for f in fns]

    monkeypatch.setattr(bench, "_medians_ms", fake)
    case = {"name": "tiny", "batch": 2, "bands": 3, "height": 4, "width": 5, "step": 2}
    rows = bench.run_case(case, ["strided"], repeats=1, warmup=0, peak_memory=False)
    x, y, m = 2 * 3 * 4 * 5 * 4, 2 * 4 * 9 * 4, 4 * 5 * 4
    for r in rows:
        assert r.mb_moved == pytest.approx(sum(bench.traffic(r.map, x, y, m)) / 1e6)
        assert r.floor_ms == (2.0 if r.backend == "floor" else 2.5)  # timed again, in turn with each map
        assert r.x_floor_fresh == r.x_floor_out == pytest.approx(1.0 if r.backend == "floor" else 3.0 / 2.5)
    assert {(r.backend, r.map) for r in rows} == {(b, k) for b in ("floor", "strided") for k in bench.MAPS}
    md = bench.markdown(rows, 2, "cpu")
    assert "A reads |x| + |M| and writes |y|" in md and md.count("| tiny |") == len(rows)


def test_scaling_rows_and_plot(tmp_path):
    rows = bench.scaling("strided", {"bands": (2, 3)}, {"batch": 1, "bands": 2, "height": 8, "width": 8, "step": 1},
                         repeats=1, warmup=0)
    assert [r["bands"] for r in rows] == [2, 3]
    assert rows[1]["mb_moved"] == pytest.approx(sum(bench.traffic("A+At", 3 * 64 * 4, 8 * 10 * 4, 64 * 4)) / 1e6)
    bench.scaling_plot(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert bench.scaling_markdown(rows, 1, "cpu").count("| bands |") == 2


def test_kernels_timed_together_alternate_round_by_round():
    """Kernels timed together are called in turn (a, b, c, a, b, c, …), warm-ups first, so that a drift of the
    machine's state touches all of them alike; each gets its own median."""
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    ms = bench._medians_ms(fns, 4, 1, lambda: None)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] * 4
    assert len(ms) == 3 and all(t >= 0 for t in ms)


def test_disturbed_timing_is_repeated_then_kept_with_a_warning(monkeypatch, capsys):
    monkeypatch.setattr(bench, "RETRIES", 2)
    monkeypatch.setattr(bench, "_waited", 0.0)
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    busy = iter([(0, 0), (10**6, 0)] * 3)  # other processes kept every CPU busy during each attempt
    monkeypatch.setattr(bench, "_cpu_jiffies", lambda: next(busy))
    calls = []
    bench._median_ms(lambda: calls.append(1), 3, 0, lambda: None)
    assert len(calls) == 3 * 3 and "timing disturbed" in capsys.readouterr().err
    quiet = iter([(0, 0), (5, 5)])  # this process's own ticks only
    monkeypatch.setattr(bench, "_cpu_jiffies", lambda: next(quiet))
    calls.clear()
    bench._median_ms(lambda: calls.append(1), 3, 0, lambda: None)
    assert len(calls) == 3


def test_shared_machine_worker_runs_each_setting_in_its_own_process():
    """cassi.bench_shared: a worker times GAP-TV (and no model) with the thread setting it is given, in a fresh
    process whose environment is the setting's."""
    from cassi import bench_shared

    spec = {"size": 24, "bands": 4, "iters": 2, "repeats": 2, "mask": None, "ckpt": None, "threads": 1}
    res = bench_shared.run_worker(spec, {"OMP_WAIT_POLICY": "PASSIVE"})
    assert res["threads"] == 1 and len(res["gap_tv"]) == 2 and all(t > 0 for t in res["gap_tv"])
    assert "model" not in res and "fixed" in res["report"]
    with pytest.raises(RuntimeError, match="benchmark worker failed"):
        bench_shared.run_worker({**spec, "mask": "no/such/mask.mat"}, {})


def test_shared_machine_tables_compare_the_default_with_the_better_of_one_and_all_threads():
    from cassi import bench_shared

    rows = [{"busy": b, "setting": s, "threads": t, "gap_tv": g, "model": []}
            for b, s, t, g in [(0, "default", 2, [0.5, 0.6]), (0, "one thread", 1, [1.0]), (0, "all threads", 2, [0.4]),
                               (1, "default", 1, [0.9]), (1, "one thread", 1, [0.9]), (1, "all threads", 2, [1.8])]]
    md = bench_shared.contention_markdown(rows, None)
    assert "| 0 | 0.55 (0.50–0.60) | 1.00 (1.00–1.00) | 0.40 (0.40–0.40) | 1.38× |" in md  # 0.55 / 0.40
    assert "| 1 | 0.90 (0.90–0.90) | 0.90 (0.90–0.90) | 1.80 (1.80–1.80) | 1.00× |" in md
    sweep = bench_shared.sweep_markdown([{"launcher": "one after the other", "seconds": 20.0, "threads": [2, 2]},
                                         {"launcher": "joblib", "seconds": 16.0, "threads": [1, 1]}], 2, "evaluate")
    assert "| joblib | 1, 1 | 16.0 | 1.25× |" in sweep
