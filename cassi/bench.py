"""Operator benchmark: every backend vs. the memory floor and the seed loop, in one run.

For each case (B, C, H, W, step) and backend it times A, Aᵀ and A then Aᵀ
(median of ``repeats`` after ``warmup``), once with fresh outputs and once
with caller-given ``out=`` buffers. In the same run it times

* the **copy floor**: ``dst.copy_(src)`` of an x-sized buffer, once per map
  (each map must at least stream x: read it for A, write it for Aᵀ);
* the **seed loop**: the seed's method 1 (the ``loop`` backend) with fresh outputs;

and reports ratios to both, plus the peak extra resident memory of A with a
fresh output (measured in a child process from VmHWM).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

from cassi import CASSI
from cassi.backends import UnsupportedGeometry
from cassi.backends.base import empty

MAPS = ("A", "At", "A+At")


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


def _median_ms(fn, repeats: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    n = max(3, min(repeats, int(5.0 / max(first, 1e-9))))  # slow backends: fewer repeats, at least 3
    times = [first]
    for _ in range(n - 1):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def _setup(case: dict, backend: str, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(case["height"], case["width"], generator=g) > 0.5).to(dtype)
    op = CASSI(mask, bands=case["bands"], step=case["step"], backend=backend).to(device)
    x = torch.rand(case["batch"], case["bands"], case["height"], case["width"], generator=g, dtype=dtype).to(device)
    return op, x


def _maps(op, x, y, out_y=None, out_x=None):
    return {
        "A": lambda: op(x, out=out_y),
        "At": lambda: op.adjoint(y, out=out_x),
        "A+At": lambda: op.adjoint(op(x, out=out_y), out=out_x),
    }


def run_case(case: dict, backends, repeats=10, warmup=2, device="cpu", dtype=torch.float32, peak_memory=True):
    """Benchmark rows for one case (dict with name, batch, bands, height, width, step)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seed_op, x = _setup(case, "loop", device, dtype)
    y = seed_op(x)
    src, dst = torch.rand_like(x), torch.empty_like(x)
    copy_ms = _median_ms(lambda: dst.copy_(src), repeats, warmup, sync)
    floor = {"A": copy_ms, "At": copy_ms, "A+At": 2 * copy_ms}
    seed = {k: _median_ms(f, repeats, warmup, sync) for k, f in _maps(seed_op, x, y).items()}
    rows = [Row(case["name"], "copy floor", k, floor[k], floor[k], 1.0, 1.0, seed[k] / floor[k]) for k in MAPS]
    for name in backends:
        try:
            op, _ = _setup(case, name, device, dtype)
            op(x[:1] if name != "auto" else x)  # checks device support; auto times its candidates here
        except (UnsupportedGeometry, RuntimeError) as e:
            print(f"  {case['name']}: skipping {name}: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        fresh = {k: _median_ms(f, repeats, warmup, sync) for k, f in _maps(op, x, y).items()}
        out_y, out_x = empty(y.shape, y), empty(x.shape, x)
        out_y.zero_(), out_x.zero_()  # touch the pages once, as a reused buffer would be
        given = {k: _median_ms(f, repeats, warmup, sync) for k, f in _maps(op, x, y, out_y, out_x).items()}
        peak = peak_forward_mb(case, name, device, dtype) if peak_memory and device == "cpu" else None
        for k in MAPS:
            rows.append(Row(case["name"], name, k, fresh[k], given[k], fresh[k] / floor[k], given[k] / floor[k],
                            seed[k] / fresh[k], peak if k == "A" else None))
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


def markdown(rows: list[Row], threads: int, device: str) -> str:
    lines = [
        f"threads: {threads}, device: {device}. ms = median; × floor = time / copy floor; "
        "× seed = seed loop (fresh) / this (fresh); peak = extra resident MB during A with a fresh output.",
        "",
        "| case | backend | map | ms (fresh) | ms (out=) | × floor (fresh) | × floor (out=) | × seed loop | peak extra MB (A) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peak = "" if r.peak_extra_mb is None else f"{r.peak_extra_mb:.1f}"
        lines.append(f"| {r.case} | {r.backend} | {r.map} | {r.ms_fresh:.2f} | {r.ms_out:.2f} | "
                     f"{r.x_floor_fresh:.2f} | {r.x_floor_out:.2f} | {r.x_seed_fresh:.2f} | {peak} |")
    return "\n".join(lines) + "\n"


def to_json(rows: list[Row]) -> str:
    return json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(r).items()}
                       for r in rows], indent=1)


if __name__ == "__main__":  # child process of peak_forward_mb
    _peak_child(*json.loads(sys.argv[1]))
