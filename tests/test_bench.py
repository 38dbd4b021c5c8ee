"""The benchmark's floor: the bytes each map must move, and a copy that moves exactly those."""
import pytest
import torch

from cassi import bench


@pytest.fixture(autouse=True)
def no_retries(monkeypatch):
    monkeypatch.setattr(bench, "RETRIES", 0)  # timings here are smoke, never repeated for a busy machine

# the seed case B16 C28 256² step 2, float32, one 2-D mask
X, Y, M = 16 * 28 * 256 * 256 * 4, 16 * 256 * (256 + 54) * 4, 256 * 256 * 4


def test_bytes_moved_per_map():
    """A reads x and the mask and writes y; Aᵀ reads y and the mask and writes x; A then Aᵀ both;
    the data step reads z, y and the mask and writes x."""
    assert bench.bytes_moved("A", X, Y, M) == 117_440_512 + 5_079_040 + 262_144 == 122_781_696
    assert bench.bytes_moved("At", X, Y, M) == 122_781_696
    assert bench.bytes_moved("A+At", X, Y, M) == 2 * 122_781_696
    assert bench.bytes_moved("step", X, Y, M) == 2 * 117_440_512 + 5_079_040 + 262_144
    with pytest.raises(KeyError):
        bench.bytes_moved("A x", X, Y, M)


def test_copy_floor_moves_the_maps_bytes(monkeypatch):
    """The floor copies a buffer of half the bytes: read + write = the map's bytes (to 8 bytes)."""
    seen = []
    real = bench._median_ms

    def spy(fn, repeats, warmup, sync):
        seen.append(fn())  # the copy's destination
        return real(fn, 1, 0, sync)

    monkeypatch.setattr(bench, "_median_ms", spy)
    for n in (bench.bytes_moved("A", X, Y, M), 1000, 12):
        seen.clear()
        bench.copy_floor_ms(n, 1, 0, "cpu", lambda: None)
        assert len(seen) == (1 if bench._stream_copy() is None else 2)  # torch's copy_ and the streaming copy
        for dst in seen:
            assert n - 8 < 2 * dst.numel() * dst.element_size() <= n


@pytest.mark.parametrize("n", [1, 15, 16, 1000, 3 * (1 << 16) + 7])
def test_streaming_copy_copies_every_element(n):
    """The floor's non-temporal copy: a plain head up to the 64-byte boundary, 64-byte stores, a plain tail,
    over chunks; an offset view starts off the boundary."""
    stream = bench._stream_copy()
    if stream is None:
        pytest.skip("numba is not installed")
    src, buf = torch.rand(n + 3), torch.empty(n + 3)
    for off in (0, 3):
        s, dst = src[off:off + n], buf[off:off + n].fill_(float("nan"))
        assert stream(dst, s) is dst
        assert torch.equal(dst, s)
    with pytest.raises(ValueError, match="contiguous 1-D float32"):
        stream(buf[::2], src[::2])  # strided: the streamed stores would ignore the stride


def test_run_case_rows_carry_the_floor(monkeypatch):
    monkeypatch.setattr(bench, "_median_ms", lambda fn, *a: (fn(), 2.0)[1])  # every timing 2 ms: no clock involved
    case = {"name": "tiny", "batch": 2, "bands": 3, "height": 4, "width": 5, "step": 2}
    rows = bench.run_case(case, ["strided"], repeats=1, warmup=0, peak_memory=False)
    x, y, m = 2 * 3 * 4 * 5 * 4, 2 * 4 * 9 * 4, 4 * 5 * 4
    for r in rows:
        assert r.mb_moved == pytest.approx(bench.bytes_moved(r.map, x, y, m) / 1e6)
        assert r.x_floor_fresh == pytest.approx(1.0)
    assert {(r.backend, r.map) for r in rows} == {(b, k) for b in ("copy floor", "strided") for k in bench.MAPS}
    md = bench.markdown(rows, 2, "cpu")
    assert "A and Aᵀ |x| + |y| + |M|" in md and md.count("| tiny |") == len(rows)


def test_scaling_rows_and_plot(tmp_path):
    rows = bench.scaling("strided", {"bands": (2, 3)}, {"batch": 1, "bands": 2, "height": 8, "width": 8, "step": 1},
                         repeats=1, warmup=0)
    assert [r["bands"] for r in rows] == [2, 3]
    assert rows[1]["mb_moved"] == pytest.approx(bench.bytes_moved("A+At", 3 * 64 * 4, 8 * 10 * 4, 64 * 4) / 1e6)
    bench.scaling_plot(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert bench.scaling_markdown(rows, 1, "cpu").count("| bands |") == 2


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
