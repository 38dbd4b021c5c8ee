"""Operator benchmark: every backend vs. the memory floor and the seed loop, in one run.

For each case (B, C, H, W, step) and backend it times A, Aᵀ, A then Aᵀ and the data step
z + Aᵀ((y − A z) ⊘ (Φ + ρ)) (median of ``repeats`` after ``warmup``), once with fresh outputs
and once with caller-given ``out=`` buffers. In the same run it times

* the **floor** of each map: the faster of two kernels that read exactly the bytes the map must read and
  write exactly the bytes it must write (``traffic``): A reads x and the mask and writes y; Aᵀ reads y and
  the mask and writes x; A then Aᵀ is both; the data step reads z, y and the mask and writes x. Each
  kernel copies the bytes read and written alike and reads (or writes) the rest: torch's ``copy_`` and
  ``sum`` (or ``fill_``), and one numba pass with non-temporal stores (``floor_ms``);
* the **seed loop**: the seed's method 1 (the ``loop`` backend) with fresh outputs;

and reports ratios to both: each backend's map (fresh, then ``out=``) and its floor's fastest kernel are called in
turn, round after round (``_medians_ms``), and the map's ratio divides by the floor's time from those rounds, so
that a drift of the machine's memory bandwidth during the run (measured: docs/benchmarks.md, "Floors timed in
turn") touches both alike;
plus the peak extra resident memory of A with a fresh output
(measured in a child process from VmHWM). ``scaling`` sweeps A then Aᵀ over bands, sizes and
batch against bytes moved.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from cassi import CASSI
from cassi.physics.backends import UnsupportedGeometry
from cassi.physics.backends.base import empty

MAPS = ("A", "At", "A+At", "step")
RHO = 0.1  # ρ of the benchmarked data step
FLOOR = ("× floor = time / time of the fastest kernel (torch's copy_ + sum/fill_, or one numba pass with "
         "non-temporal stores) that reads the bytes the map must read and writes those it must write: "
         "A reads |x| + |M| and writes |y|, Aᵀ reads |y| + |M| and writes |x|, A then Aᵀ both, "
         "the data step reads |x| + |y| + |M| and writes |x|; for a backend's rows that kernel is timed again, "
         "in turn with the map, round after round (floor ms), and the ratios divide by that time")


def traffic(map_: str, x_bytes: int, y_bytes: int, mask_bytes: int) -> tuple[int, int]:
    """(read, write): the least bytes a map must read and write, given the bytes of x, y and the stored mask:
    A reads x and M and writes y; Aᵀ reads y and M and writes x; A then Aᵀ does both; the data step
    reads z, y and M and writes x (what ``op.data_step`` returns: the residual y − A z that fused kernels also
    write for autograd, and the weights 1/(Φ + ρ), are left out). Bytes moved = read + write."""
    x, y, m = x_bytes, y_bytes, mask_bytes
    return {"A": (x + m, y), "At": (y + m, x), "A+At": (x + y + 2 * m, x + y), "step": (x + y + m, x)}[map_]



@dataclass
class Row:
    case: str
    backend: str
    map: str
    ms_fresh: float
    ms_out: float
    x_floor_fresh: float
    x_floor_out: float
    x_seed_fresh: float
    peak_extra_mb: float | None = None
    mb_moved: float | None = None  # the map's bytes, read + write (traffic), in MB
    gb_s_out: float | None = None  # mb_moved / ms (out=): the achieved bandwidth
    floor_ms: float | None = None  # the floor's kernel, timed in turn with this row's map (× floor divides by it)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy jiffies of the whole machine, of this process) from /proc; None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
        return sum(v) - v[3] - v[4], int(own[11]) + int(own[12])  # minus idle and iowait; utime + stime
    except (OSError, ValueError, IndexError):
        return None


#: a timing during which other processes kept more than this share of the CPUs busy is repeated,
#: up to RETRIES times after a pause, while the process has waited less than WAIT_S in all
DISTURBED, RETRIES, WAIT_S = 0.15, 3, 120.0
_waited = 0.0


def _median_ms(fn, repeats: int, warmup: int, sync) -> float:
    """Median ms of ``fn`` (after ``warmup`` calls); see ``_medians_ms``."""
    return _medians_ms([fn], repeats, warmup, sync)[0]


def _medians_ms(fns, repeats: int, warmup: int, sync) -> list[float]:
    """Median ms of each of ``fns`` (after ``warmup`` calls of each), called in turn, round after round: two
    kernels timed together see the same state of a shared machine (its memory bandwidth drifts between and
    within runs), so their ratio is steadier than that of two timings taken one after the other. On a shared
    machine a timing is repeated while other processes used the CPUs meanwhile (Linux): with every core in
    use, a map of many small ops waits a scheduler slice per op and its time means nothing. A timing still
    disturbed is kept with a warning on stderr."""
    global _waited
    for attempt in range(RETRIES + 1):
        before, t_start = _cpu_jiffies(), time.perf_counter()
        ms = _medians_once(fns, repeats, warmup, sync)
        after, wall = _cpu_jiffies(), time.perf_counter() - t_start
        if before is None or after is None:
            return ms
        others = ((after[0] - before[0]) - (after[1] - before[1])) / os.sysconf("SC_CLK_TCK")
        if others <= DISTURBED * wall * (os.cpu_count() or 1):
            return ms
        pause = 5.0 * (attempt + 1)
        if attempt == RETRIES or _waited + pause > WAIT_S:
            print(f"  warning: other processes used {others:.2f} CPU-s in {wall:.2f} s: timing disturbed",
                  file=sys.stderr)
            return ms
        _waited += pause
        time.sleep(pause)


def _medians_once(fns, repeats: int, warmup: int, sync) -> list[float]:
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]

    def one_round():
        for fn, ts in zip(fns, times):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)

    one_round()
    first = sum(ts[0] for ts in times)
    n = max(3, min(repeats, int(5.0 / max(first, 1e-9))))  # slow backends: fewer rounds, at least 3
    for _ in range(n - 1):
        one_round()
    return [1e3 * sorted(ts)[len(ts) // 2] for ts in times]


def _setup(case: dict, backend: str, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(case["height"], case["width"], generator=g) > 0.5).to(dtype)
    op = CASSI(mask, bands=case["bands"], step=case["step"], backend=backend).to(device)
    x = torch.rand(case["batch"], case["bands"], case["height"], case["width"], generator=g, dtype=dtype).to(device)
    return op, x


def _maps(op, x, y, out_y=None, out_x=None):
    fns = {
        "A": lambda: op(x, out=out_y),
        "At": lambda: op.adjoint(y, out=out_x),
        "A+At": lambda: op.adjoint(op(x, out=out_y), out=out_x),
    }
    fns["step"] = lambda: op.data_step(x, y, RHO, out=out_x)
    return fns


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@lru_cache(maxsize=1)
def _stream_pass():
    """One parallel numba pass (None without numba) that copies src[:n] to dst[:n] with non-temporal stores,
    reads (sums) the rest of src and streams a fixed row over the rest of dst, each task a slice of all three:
    a floor kernel that reads and writes exactly the given bytes. Such stores skip the read for ownership of
    dst, so the pass can beat torch's ops on buffers larger than the cache, and the numba backend writes large
    x this way: a floor must be the fastest way to move the bytes. ``run(dst, src, n)`` returns the sum of
    src[n:] (what it read beyond the copy)."""
    from cassi.physics.backends import numba as nb

    if not nb.available() or nb._FORKED:  # a forked child cannot run numba's OpenMP kernels
        return None
    import numba
    import numpy as np

    nb._kernels()  # numba's threading layer, as the kernels use it
    from cassi.physics.backends._numba_kernels import _fence, _stream

    @numba.njit(parallel=True, fastmath=True, cache=False)
    def run_pass(dst, src, n, row, sums, lanes):
        tasks, extra_r, extra_w = sums.shape[0], src.shape[0] - n, dst.shape[0] - n
        for t in numba.prange(tasks):
            a, b = t * n // tasks, (t + 1) * n // tasks
            _stream(dst[a:b], src[a:b])
            part = src[n + t * extra_r // tasks:n + (t + 1) * extra_r // tasks]
            # `lanes` (32) sums at once, a run-time count: one accumulator, or a constant 32 (unrolled to
            # scalar code), read slower (measured: docs/benchmarks.md, "The floor: bytes each map must move")
            acc = np.zeros(lanes, np.float32)
            for i in range(part.shape[0] // lanes):
                blk = part[i * lanes:(i + 1) * lanes]
                for j in range(lanes):
                    acc[j] += blk[j]
            for i in range(part.shape[0] // lanes * lanes, part.shape[0]):
                acc[0] += part[i]
            sums[t] = acc.sum()
            w0, w1 = n + t * extra_w // tasks, n + (t + 1) * extra_w // tasks
            for j in range(w0, w1, row.shape[0]):
                e = min(w1, j + row.shape[0])
                _stream(dst[j:e], row[:e - j])
            _fence()

    row = np.random.default_rng(0).random(4096, dtype=np.float32)  # read from cache, never the zero page

    def run(dst: torch.Tensor, src: torch.Tensor, n: int) -> float:
        if not (dst.is_contiguous() and src.is_contiguous() and dst.dim() == src.dim() == 1
                and dst.dtype == src.dtype == torch.float32 and 0 <= n <= min(dst.numel(), src.numel())):
            raise ValueError("the streaming pass takes two contiguous 1-D float32 tensors and 0 ≤ n ≤ their sizes")
        tasks = max(1, -(-max(src.numel(), dst.numel()) // (1 << 16)))  # ≤ 256 KB of each buffer per task
        sums = np.empty(tasks, np.float32)
        nb._parallel(run_pass, dst.numpy(), src.numpy(), n, row, sums, 32)
        return float(sums.sum(dtype=np.float64))  # of src[n:], what the pass read beyond the copy

    return run


def _floor_buffers(read: int, write: int, device: str = "cpu"):
    """(src, dst, n): float32 buffers of ``read`` and ``write`` bytes (rounded down to 4, at least one element),
    filled (never the zero page), and n, the elements both hold (copied; the rest of src is read, of dst
    written)."""
    src = torch.rand(max(1, read // 4), device=device, dtype=torch.float32)
    dst = torch.rand(max(1, write // 4), device=device, dtype=torch.float32)
    return src, dst, min(read, write) // 4


def floor_ms(read: int, write: int, repeats: int, warmup: int, device: str, sync) -> float:
    """ms of the fastest kernel that reads ``read`` bytes and writes ``write`` bytes (to 4 bytes): the common
    part copied, the rest read (or written). Candidates: torch (``copy_``, then ``sum`` or ``fill_``) and, on
    CPU, ``_stream_pass``. A copy of (read + write) / 2 bytes is no floor for a map that mostly reads or mostly
    writes: reads and writes together use the memory system better than either alone (docs/benchmarks.md)."""
    return _floor(read, write, repeats, warmup, device, sync)[0]


def _floor(read: int, write: int, repeats: int, warmup: int, device: str, sync):
    """(ms, kernel) of ``floor_ms``: the fastest candidate and its time."""
    src, dst, n = _floor_buffers(read, write, device)
    extra_r, extra_w = src.numel() - n, dst.numel() - n

    def with_torch() -> float:  # returns the sum of the extra reads, like the numba pass
        dst[:n].copy_(src[:n])
        if extra_w:
            dst[n:].fill_(0.5)
        return float(src[n:].sum()) if extra_r else 0.0

    kernels = [with_torch]
    stream = _stream_pass() if device == "cpu" else None
    if stream is not None:
        kernels.append(lambda: stream(dst, src, n))
    timed = [(_median_ms(k, repeats, warmup, sync), k) for k in kernels]
    return min(timed, key=lambda t: t[0])


def run_case(case: dict, backends, repeats=10, warmup=2, device="cpu", dtype=torch.float32, peak_memory=True):
    """Benchmark rows for one case (dict with name, batch, bands, height, width, step)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seed_op, x = _setup(case, "loop", device, dtype)
    y = seed_op(x)
    rw = {k: traffic(k, _nbytes(x), _nbytes(y), _nbytes(seed_op.mask)) for k in MAPS}
    moved = {k: sum(rw[k]) for k in MAPS}
    floors = {k: _floor(*rw[k], repeats, warmup, device, sync) for k in MAPS}  # (ms, kernel)
    floor = {k: floors[k][0] for k in MAPS}
    seed = {k: _median_ms(f, repeats, warmup, sync) for k, f in _maps(seed_op, x, y).items()}
    rows = [Row(case["name"], "floor", k, floor[k], floor[k], 1.0, 1.0, seed[k] / floor[k], None,
                moved[k] / 1e6, moved[k] / 1e6 / floor[k], floor[k]) for k in MAPS]
    for name in backends:
        try:
            op, _ = _setup(case, name, device, dtype)
            op(x[:1] if name != "auto" else x)  # checks device support; auto times its candidates here
        except (UnsupportedGeometry, RuntimeError) as e:
            print(f"  {case['name']}: skipping {name}: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        out_y, out_x = empty(y.shape, y), empty(x.shape, x)
        out_y.zero_(), out_x.zero_()  # touch the pages once, as a reused buffer would be
        fresh_fns, given_fns = _maps(op, x, y), _maps(op, x, y, out_y, out_x)
        fresh, given, paired = {}, {}, {}
        for k in MAPS:  # the map (fresh, out=) and its floor's kernel in turn: ratios under one machine state
            fresh[k], given[k], paired[k] = _medians_ms([fresh_fns[k], given_fns[k], floors[k][1]], repeats,
                                                        warmup, sync)
        peak = peak_forward_mb(case, name, device, dtype) if peak_memory and device == "cpu" else None
        for k in MAPS:
            rows.append(Row(case["name"], name, k, fresh[k], given[k], fresh[k] / paired[k], given[k] / paired[k],
                            seed[k] / fresh[k], peak if k == "A" else None, moved[k] / 1e6, moved[k] / 1e6 / given[k],
                            paired[k]))
        print(f"  {case['name']}: {name} A+At {fresh['A+At']:.1f} ms fresh, {given['A+At']:.1f} ms out=", file=sys.stderr)
    return rows


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_child(case: dict, backend: str, device: str, dtype: str) -> None:
    """In a fresh process, after one warm-up call: peak resident size (VmHWM, reset first) during
    one A x with a fresh output, minus the resident size before it."""
    op, x = _setup(case, backend, device, getattr(torch, dtype))
    op(x)  # warm up: kernels, caches, auto's timing of its candidates
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    base = _status_mb("VmRSS")
    y = op(x)
    peak = _status_mb("VmHWM")
    print(json.dumps({"extra_mb": peak - base, "y_mb": y.numel() * y.element_size() / 2**20}))


def peak_forward_mb(case: dict, backend: str, device="cpu", dtype=torch.float32) -> float | None:
    if not sys.platform.startswith("linux"):
        return None
    arg = json.dumps([case, backend, device, str(dtype).removeprefix("torch.")])
    r = subprocess.run([sys.executable, "-m", "cassi.bench", arg], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])["extra_mb"]


def _f(v, fmt=".2f") -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(rows: list[Row], threads: int, device: str) -> str:
    lines = [
        f"threads: {threads}, device: {device}. ms = median; {FLOOR}; × seed = seed loop (fresh) / this (fresh); "
        "GB/s = bytes moved / ms (out=); peak = extra resident MB during A with a fresh output.",
        "",
        "| case | backend | map | MB moved | ms (fresh) | ms (out=) | floor ms | × floor (fresh) | × floor (out=) "
        "| × seed loop | GB/s | peak extra MB (A) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.case} | {r.backend} | {r.map} | {_f(r.mb_moved, '.1f')} | {_f(r.ms_fresh)} | {_f(r.ms_out)} | "
                     f"{_f(r.floor_ms)} | "
                     f"{_f(r.x_floor_fresh)} | {_f(r.x_floor_out)} | {_f(r.x_seed_fresh)} | {_f(r.gb_s_out, '.1f')} | "
                     f"{_f(r.peak_extra_mb, '.1f')} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- scaling
SWEEPS = {"bands": (8, 16, 28, 64, 128, 256, 512), "size": (64, 128, 256, 512, 1024, 2048),
          "batch": (1, 2, 4, 8, 16, 32)}
SCALING_BASE = {"batch": 4, "bands": 28, "height": 256, "width": 256, "step": 2}


def scaling(backend: str = "auto", sweeps: dict = SWEEPS, base: dict = SCALING_BASE, repeats: int = 5,
            warmup: int = 1, device: str = "cpu", dtype=torch.float32, max_x_gb: float = 2.0) -> list[dict]:
    """A then Aᵀ (``out=`` buffers) of ``backend`` over one-axis sweeps around ``base``: per point the
    bytes moved (``traffic``, read + write), ms, the floor of those reads and writes (``floor_ms``'s kernel, timed in
    turn with the map), × floor and GB/s. Points whose x exceeds ``max_x_gb`` are skipped; a point holds x, A's and
    Aᵀ's outputs and the floor's two buffers at once (about 4 × x at the peak)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for sweep, values in sweeps.items():
        for v in values:
            case = dict(base, name=f"{sweep}={v}")
            case.update({"height": v, "width": v} if sweep == "size" else {sweep: v})
            x_bytes = case["batch"] * case["bands"] * case["height"] * case["width"] * torch.finfo(dtype).bits // 8
            if x_bytes > max_x_gb * 1e9:
                print(f"  scaling: skipping {case['name']} (x would be {x_bytes / 1e9:.1f} GB)", file=sys.stderr)
                continue
            op, x = _setup(case, backend, device, dtype)
            y = empty((case["batch"], *op.y_shape), x).zero_()
            xo = empty(x.shape, x).zero_()
            op(x, out=y)  # auto: checks and times its candidates here, not in the timed rounds
            chosen = op.backend.choice(x, op.mask, op.geometry).name if hasattr(op.backend, "choice") else backend
            rw = traffic("A+At", x_bytes, _nbytes(y), _nbytes(op.mask))
            moved = sum(rw)
            kernel = _floor(*rw, repeats, warmup, device, sync)[1]  # the faster floor kernel, then in turn with the map
            ms, floor = _medians_ms([lambda: op.adjoint(op(x, out=y), out=xo), kernel], repeats, warmup, sync)
            op = x = y = xo = kernel = None  # free them before the next case is allocated
            rows.append({"sweep": sweep, **{k: case[k] for k in ("batch", "bands", "height", "width", "step")},
                         "backend": chosen, "mb_moved": moved / 1e6, "ms": ms, "floor_ms": floor,
                         "x_floor": ms / floor, "gb_s": moved / 1e6 / ms, "floor_gb_s": moved / 1e6 / floor})
            print(f"  scaling {case['name']}: {ms:.2f} ms, {rows[-1]['gb_s']:.1f} GB/s ({chosen}), "
                  f"floor {rows[-1]['floor_gb_s']:.1f} GB/s", file=sys.stderr)
    return rows


def scaling_markdown(rows: list[dict], threads: int, device: str) -> str:
    lines = [f"threads: {threads}, device: {device}. A then Aᵀ with out= buffers; MB moved = 2(|x| + |y| + |M|); "
             "floor = the fastest kernel reading and writing the same bytes (floor_ms), timed in turn with the map.", "",
             "| sweep | B | C | H×W | backend | MB moved | ms | GB/s | floor GB/s | × floor |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['sweep']} | {r['batch']} | {r['bands']} | {r['height']}² | {r['backend']} | "
                     f"{r['mb_moved']:.1f} | {r['ms']:.2f} | {r['gb_s']:.1f} | {r['floor_gb_s']:.1f} | {r['x_floor']:.2f} |")
    return "\n".join(lines) + "\n"


def scaling_plot(rows: list[dict], path, title: str = "") -> None:
    """Two panels against bytes moved: time (log-log) and GB/s, per sweep, with the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for sweep, marker in zip(SWEEPS, "osd"):
        pts = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: r["mb_moved"])
        if not pts:
            continue
        mb = [r["mb_moved"] for r in pts]
        line = ax_t.plot(mb, [r["ms"] for r in pts], marker=marker, label=f"A then Aᵀ, sweep {sweep}")[0]
        ax_t.plot(mb, [r["floor_ms"] for r in pts], ls=":", color=line.get_color(), lw=1)
        ax_b.plot(mb, [r["gb_s"] for r in pts], marker=marker, color=line.get_color(), label=f"sweep {sweep}")
        ax_b.plot(mb, [r["floor_gb_s"] for r in pts], ls=":", color=line.get_color(), lw=1)
    ax_t.set(xscale="log", yscale="log", xlabel="MB moved (read + write)", ylabel="ms",
             title="time (dotted: copy of the same bytes)")
    ax_b.set(xscale="log", xlabel="MB moved (read + write)", ylabel="GB/s", ylim=(0, None),
             title="bytes per second (flat = time ∝ bytes)")
    ax_t.legend(fontsize=8)
    ax_b.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_json(rows: list[Row]) -> str:
    return json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(r).items()}
                       for r in rows], indent=1)


if __name__ == "__main__":  # child process of peak_forward_mb
    _peak_child(*json.loads(sys.argv[1]))
