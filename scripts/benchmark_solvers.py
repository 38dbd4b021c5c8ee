"""Our GAP-TV (cassi.solvers.GAPTV) vs a textbook GAP-TV (cassi/solvers/textbook.py).

    python scripts/benchmark_solvers.py                      # 1×28×256×256 scene, Bernoulli mask, 2 threads
    python scripts/benchmark_solvers.py repeats=3 solver.iters=40
Both run the same iterations with the same TV weights from the same pseudo-inverse start, so
they compute the same iterates: the PSNRs must agree within ``psnr_tol`` dB. Times are medians
of repeated runs after warm-up, ours first, then the textbook (the textbook's page faulting
slows whatever runs right after it, so the runs are not interleaved). Writes benchmark_solvers.json and benchmark_solvers.md into
the Hydra output directory (atomically).
"""
import json
import resource
import statistics
import time
from pathlib import Path

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from cassi import CASSI
from cassi.data.synthetic import synthetic_cube
from cassi.io import write_text_atomic
from cassi.physics.masks import bernoulli_mask
from cassi.solvers import GAPTV, psnr
from cassi.solvers import textbook


def timed(fn):
    """fn(), its wall and CPU seconds and its minor page faults (fresh memory touched)."""
    f0, t0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter(), time.process_time()
    out = fn()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    return out, t, c, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def markdown(r: dict) -> str:
    o, t = r["ours"], r["textbook"]
    rows = [
        "| | ours (GAPTV) | textbook | ratio |",
        "|---|---|---|---|",
        f"| wall time, median (s) | {o['wall_median_s']:.3f} | {t['wall_median_s']:.3f} | **{r['speedup_median']:.2f}×** |",
        f"| wall time, min (s) | {o['wall_min_s']:.3f} | {t['wall_min_s']:.3f} | {r['speedup_min']:.2f}× |",
        f"| CPU time, median (s) | {o['cpu_median_s']:.3f} | {t['cpu_median_s']:.3f} | {r['speedup_cpu']:.2f}× |",
        f"| page faults per run, median | {o['page_faults']:,} | {t['page_faults']:,} | |",
        f"| per iteration, median (ms) | {1e3 * o['wall_median_s'] / r['iters']:.1f} | "
        f"{1e3 * t['wall_median_s'] / r['iters']:.1f} | |",
        f"| PSNR (dB) | {o['psnr']:.3f} | {t['psnr']:.3f} | Δ {r['psnr_diff']:.4f} |",
    ]
    return "\n".join([
        f"# GAP-TV: ours vs textbook ({r['scene']}, {r['iters']} iterations)",
        "",
        f"torch {r['torch']}, threads {r['threads']}, backend {r['backend']}, {r['repeats']} runs each "
        f"after {r['warmup']} warm-up (ours first, then the textbook); parameters {r['params']}",
        "",
        *rows,
        "",
        f"pseudo-inverse start: {r['psnr_pinv']:.3f} dB; max |x_ours − x_textbook| = {r['max_abs_diff']:.2e}",
        f"same PSNR (|Δ| ≤ {r['psnr_tol']} dB): {'yes' if r['same_psnr'] else 'NO'}; "
        f"speed-up ≥ {r['target_speedup']}×: {'yes' if r['target_met'] else 'NO'}",
        "",
    ])


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_solvers")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    solver = instantiate(cfg.solver)
    if not isinstance(solver, GAPTV) or not solver.accelerate or solver.step != 1 or solver.denoiser.spectral_weight:
        raise ValueError(f"the textbook runs accelerated GAP-TV (step 1, spatial TV); got {solver!r}")
    x = synthetic_cube(cfg.height, cfg.width, cfg.bands, seed=cfg.seed)[None]
    mask = bernoulli_mask(cfg.height, cfg.width, p=cfg.mask_p, seed=cfg.seed)
    op = CASSI(mask, bands=cfg.bands, step=cfg.step, backend=cfg.backend)
    y = op(x)
    weights, tv_iters = solver.sigmas, solver.denoiser.iters
    runs = {"ours": lambda: solver(op, y).x,
            "textbook": lambda: textbook.gap_tv(y, mask, cfg.step, weights, tv_iters)}
    print(f"torch {torch.__version__}, threads {threads}, scene 1×{cfg.bands}×{cfg.height}×{cfg.width}, "
          f"{len(weights)} iterations, {solver!r}")
    wall, cpu, faults, out = {k: [] for k in runs}, {k: [] for k in runs}, {k: [] for k in runs}, {}
    for name, fn in runs.items():  # one block each: the textbook's page-fault storm slows whatever runs next
        for _ in range(cfg.warmup):
            fn()
        for i in range(cfg.repeats):
            out[name], w, c, pf = timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
            faults[name].append(pf)
            print(f"  run {i + 1}/{cfg.repeats} {name:8s} {w:.3f} s")
    stats = {k: {"wall_median_s": statistics.median(wall[k]), "wall_min_s": min(wall[k]),
                 "cpu_median_s": statistics.median(cpu[k]), "page_faults": int(statistics.median(faults[k])),
                 "wall_s": wall[k], "psnr": float(psnr(out[k], x))} for k in runs}
    o, t = stats["ours"], stats["textbook"]
    result = {
        "scene": f"1×{cfg.bands}×{cfg.height}×{cfg.width}", "iters": len(weights), "threads": threads,
        "torch": torch.__version__, "backend": cfg.backend, "repeats": cfg.repeats, "warmup": cfg.warmup,
        "params": {k: v for k, v in vars(solver).items() if not k.startswith("_") and k != "denoiser"}
        | {"tv_iters": tv_iters, "mask_p": cfg.mask_p, "dispersion_step": cfg.step, "seed": cfg.seed},
        "ours": o, "textbook": t,
        "speedup_median": t["wall_median_s"] / o["wall_median_s"], "speedup_min": t["wall_min_s"] / o["wall_min_s"],
        "speedup_cpu": t["cpu_median_s"] / o["cpu_median_s"],
        "psnr_pinv": float(psnr(op.pinv(y), x)), "psnr_diff": abs(o["psnr"] - t["psnr"]),
        "max_abs_diff": float((out["ours"] - out["textbook"]).abs().max()),
        "psnr_tol": cfg.psnr_tol, "target_speedup": cfg.target_speedup,
    }
    result["same_psnr"] = result["psnr_diff"] <= cfg.psnr_tol
    result["target_met"] = result["same_psnr"] and result["speedup_median"] >= cfg.target_speedup
    md = markdown(result)
    dest = Path(cfg.output_dir)
    dest.mkdir(parents=True, exist_ok=True)
    write_text_atomic(dest / "benchmark_solvers.md", md)
    write_text_atomic(dest / "benchmark_solvers.json", json.dumps(result, indent=2, default=str))
    print(md)
    print(f"wrote {dest / 'benchmark_solvers.md'} and {dest / 'benchmark_solvers.json'}")


if __name__ == "__main__":
    main()
