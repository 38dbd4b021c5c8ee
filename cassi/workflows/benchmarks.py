"""Benchmark jobs on a Hydra config: the model configs' size and cost (conf/benchmark_models.yaml,
``scripts/benchmark_models.py``) and our GAP-TV against a textbook GAP-TV (conf/benchmark_solvers.yaml,
``scripts/benchmark_solvers.py``). The operator's benchmark is :mod:`cassi.bench`; the zoo's against the MST
toolbox, :mod:`cassi.models.zoo.compare`."""
from __future__ import annotations

import json
import multiprocessing as mp
import resource
import statistics
import time
from pathlib import Path
from queue import Empty

import torch
from hydra import compose
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from cassi import CASSI
from cassi.data.synthetic import synthetic_cube
from cassi.io import write_text_atomic
from cassi.models import load_model
from cassi.physics.masks import bernoulli_mask
from cassi.solvers import GAPTV, psnr, textbook

__all__ = ["benchmark_models", "benchmark_solvers", "benchmark_zoo", "model_spec", "paired_seconds", "models_markdown",
           "solvers_markdown"]

CONF = Path(__file__).resolve().parents[2] / "conf"  # the repository's Hydra configs


# ----------------------------------------------------------------------------- model configs: size and cost
def model_spec(name: str, bands: int) -> dict:
    """conf/model/<name>.yaml (or the model of conf/experiment/<name>.yaml) at ``bands`` bands, resolved to a
    plain dict (picklable for the child process); a checkpoint (``pretrained/<name>`` or a .ckpt path): the model
    it records, as it reconstructs (its inference settings included; its own bands). Needs Hydra initialized
    (inside ``@hydra.main``)."""
    if name.startswith("pretrained/") or name.endswith(".ckpt"):
        return {**load_model(name).config, "_recursive_": False}  # the config is the constructor call
    group = "experiment" if (CONF / "experiment" / f"{name}.yaml").is_file() else "model"
    return OmegaConf.to_container(compose("train", overrides=[f"{group}={name}", f"bands={bands}"]).model, resolve=True)


def _problem(batch: int, bands: int, size: int, device: str):
    """(op, x (batch, bands, size, size), y = op(x)): seeded random mask (step 2) and cube."""
    g = torch.Generator().manual_seed(0)
    op = CASSI((torch.rand(batch, 1, size, size, generator=g) > 0.5).float(), bands=bands, step=2).to(device)
    x = torch.rand(batch, bands, size, size, generator=g).to(device)
    return op, x, op(x)


def paired_seconds(a, b, repeats: int) -> tuple[float, float]:
    """Median wall times of ``a()`` and ``b()``, called alternately ``repeats`` times after one warm-up call
    each (alternating keeps the ratio fair when other processes share the machine)."""
    a(), b()
    times = ([], [])
    for _ in range(repeats):
        for fn, t in zip((a, b), times):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return tuple(sorted(t)[len(t) // 2] for t in times)


def _status_kb(field: str) -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))


def measure_training(row: dict, queue) -> None:
    """Runs in a fresh process: training throughput and peak memory of one (model, precision, checkpointing)."""
    torch.set_num_threads(row["threads"])
    dev = row["device"]
    model = instantiate({**row["spec"], "checkpointing": row["checkpointing"]}).to(dev)
    op, x, y = _problem(row["train_batch"], row["bands"], row["train_size"], dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    dtype = torch.bfloat16 if row["precision"] == "bf16" else None
    if dev == "cpu":  # reset the kernel's peak-RSS counter (VmHWM) so that the peak is this loop's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss0 = _status_kb("VmRSS")
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if dev == "cuda" else 0
    for i in range(row["steps"] + 1):
        if i == 1:
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
            loss = (model(op, y) - x).abs().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / row["steps"]
    peak = (torch.cuda.max_memory_allocated() - base if dev == "cuda"
            else (_status_kb("VmHWM") - rss0) * 1024)
    queue.put({"samples_per_s": row["train_batch"] / seconds, "step_s": seconds, "peak_memory_mb": peak / 2**20})


def _run_measure(ctx, row: dict) -> dict:
    """``measure_training(row)`` in a fresh process; a process that dies (e.g. killed when memory runs out) gives a
    row with its exit code instead of hanging the benchmark."""
    queue = ctx.Queue()
    proc = ctx.Process(target=measure_training, args=(row, queue))
    proc.start()
    while True:
        try:
            result = queue.get(timeout=1.0)
            break
        except Empty:
            if not proc.is_alive():
                result = {"samples_per_s": float("nan"), "step_s": float("nan"), "peak_memory_mb": float("nan"),
                          "error": f"the measuring process died (exit code {proc.exitcode}; -9: killed, "
                                   f"e.g. out of memory)"}
                break
    proc.join()
    return result


def models_markdown(rows: list[dict], cfg: DictConfig) -> str:
    """benchmark_models.md: the settings, then one table row per (model, precision, checkpointing)."""
    head = (f"# Model configs: size and training cost\n\ntorch {torch.__version__}, device {cfg.device}"
            f"{'' if cfg.device != 'cpu' else f', {cfg.threads} threads'}; FLOPs of one forward pass at "
            f"{cfg.flops_size}²×{cfg.bands} (FlopCounterMode, multiply-add = 2 FLOPs); reconstruction time of "
            f"one {cfg.flops_size}²×{cfg.bands} cube and GAP-TV's on the same measurement (medians of {cfg.repeats}, "
            f"called alternately); training at batch "
            f"{cfg.train_batch} × {cfg.bands} × {cfg.train_size}², mean of {cfg.steps} Adam steps after one "
            f"warm-up\n\n")
    lines = ["| model | stages | parameters (M) | GFLOPs | reconstruct (s) | GAP-TV (s) | × GAP-TV speed | "
             "precision | checkpointing | samples/s | peak memory (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['stages']} | {r['params'] / 1e6:.2f} | {r['gflops']:.1f} | "
              f"{r['reconstruct_s']:.3f} | {r['gap_tv_s']:.3f} | {r['gap_tv_s'] / r['reconstruct_s']:.1f} | "
              f"{r['precision']} | "
              f"{'yes' if r['checkpointing'] else 'no'} | {r['samples_per_s']:.2f} | {r['peak_memory_mb']:.0f} |"
              for r in rows]
    lines += [f"\n{r['model']} ({r['precision']}, checkpointing {r['checkpointing']}): {r['error']}" for r in rows
              if r.get("error")]
    return head + "\n".join(lines) + "\n"


def benchmark_models(cfg: DictConfig) -> list[dict]:
    """Per model of ``cfg.models`` (and precision, checkpointing): parameters, FLOPs of one forward pass (batch 1,
    flops_size² × bands), its reconstruction time against GAP-TV's, training samples/s and peak memory (each row
    in a fresh process); writes benchmark_models.{md,json} into ``cfg.output_dir`` and returns the rows. Needs
    Hydra initialized (inside ``@hydra.main``)."""
    torch.set_num_threads(cfg.threads)
    ctx, rows = mp.get_context("spawn"), []
    op, _, y = _problem(1, cfg.bands, cfg.flops_size, "cpu")
    gaptv = instantiate(compose("evaluate", overrides=["solver=gap_tv"]).solver)
    for name in cfg.models:
        spec = model_spec(name, cfg.bands)
        model = instantiate(spec).eval()
        with torch.no_grad():
            with FlopCounterMode(display=False) as counter:
                model(op, y)
            elapsed, gaptv_s = paired_seconds(lambda: model(op, y), lambda: gaptv(op, y), cfg.repeats)
        size = {"model": name, "stages": model.stages, "params": sum(p.numel() for p in model.parameters()),
                "gflops": counter.get_total_flops() / 1e9, "reconstruct_s": elapsed, "gap_tv_s": gaptv_s}
        for precision in cfg.precision:
            for ckpt in cfg.checkpointing:
                row = {**size, "precision": str(precision), "checkpointing": bool(ckpt), "device": cfg.device,
                       "bands": cfg.bands, "threads": cfg.threads, "train_size": cfg.train_size,
                       "train_batch": cfg.train_batch, "steps": cfg.steps, "spec": spec}
                result = _run_measure(ctx, row)
                rows.append({**{k: v for k, v in row.items() if k != "spec"}, **result})
                print(f"{name}: {row['params'] / 1e6:.2f} M, {row['gflops']:.1f} GFLOPs, {precision}, "
                      f"checkpointing {ckpt}: {result['samples_per_s']:.2f} samples/s, "
                      f"peak {result['peak_memory_mb']:.0f} MB", flush=True)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = models_markdown(rows, cfg)
    write_text_atomic(out / "benchmark_models.md", md)
    write_text_atomic(out / "benchmark_models.json", json.dumps(rows, indent=1))
    print(md)
    return rows


# ----------------------------------------------------------------------------- GAP-TV: ours vs the textbook's
def _timed(fn):
    """fn(), its wall and CPU seconds and its minor page faults (fresh memory touched)."""
    f0, t0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter(), time.process_time()
    out = fn()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    return out, t, c, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def solvers_markdown(r: dict) -> str:
    """benchmark_solvers.md of :func:`benchmark_solvers`'s result: times, page faults and PSNRs side by side."""
    o, t = r["ours"], r["textbook"]
    rows = [
        "| | ours (GAPTV) | textbook | ratio |",
        "|---|---|---|---|",
        f"| wall time, median (s) | {o['wall_median_s']:.3f} | {t['wall_median_s']:.3f} | "
        f"**{r['speedup_median']:.2f}×** |",
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


def benchmark_solvers(cfg: DictConfig) -> dict:
    """``cfg.solver`` (an accelerated GAPTV, step 1, spatial TV; ValueError otherwise) against
    :func:`cassi.solvers.textbook.gap_tv` on the seeded 1×bands×height×width synthetic scene through a Bernoulli
    mask: same iterates, median wall and CPU times of ``repeats`` runs each after ``warmup`` (ours, then the
    textbook), PSNRs; writes benchmark_solvers.{md,json} into ``cfg.output_dir`` and returns the result."""
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
            out[name], w, c, pf = _timed(fn)
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
    md = solvers_markdown(result)
    dest = Path(cfg.output_dir)
    dest.mkdir(parents=True, exist_ok=True)
    write_text_atomic(dest / "benchmark_solvers.md", md)
    write_text_atomic(dest / "benchmark_solvers.json", json.dumps(result, indent=2, default=str))
    print(md)
    print(f"wrote {dest / 'benchmark_solvers.md'} and {dest / 'benchmark_solvers.json'}")
    return result


# ---------------------------------------------------------------------------------------------- the zoo
ZOO_COLUMNS = ["method", "threads", "precision", "params (M)", "reference params (M)", "GFLOPs", "forward s",
               "reference forward s", "× faster", "train step s", "reference train step s", "× faster (train)"]


def _zoo_cells(r: dict) -> list[str]:
    ratio = lambda a, b: f"{b / a:.2f}" if a and b else "–"  # noqa: E731
    return [r["method"], str(r["threads"]), r.get("precision", "fp32"), f"{r['params'] / 1e6:.3f}",
            f"{r['toolbox_params'] / 1e6:.3f}", f"{r['gflops']:.1f}", f"{r['forward_s']:.3f}", f"{r['toolbox_forward_s']:.3f}",
            ratio(r["forward_s"], r["toolbox_forward_s"]), f"{r.get('train_step_s', 0):.3f}",
            f"{r.get('toolbox_train_step_s', 0):.3f}", ratio(r.get("train_step_s"), r.get("toolbox_train_step_s"))]


def benchmark_zoo(cfg: DictConfig) -> list[dict]:
    """Each of ``cfg.methods`` against its reference code (``cfg.toolbox``, ``cfg.authors.<source>``) at each of
    ``cfg.threads`` and ``cfg.precisions`` (:func:`cassi.models.zoo.compare.benchmark`): rows printed as they come,
    ``benchmark_zoo.{md,json}`` in ``cfg.output_dir``. SystemExit naming the setting when a method's reference code
    is not given or not found (before any timing), or when a row failed (the others kept)."""
    from rich.console import Console

    from cassi.models.zoo import compare
    from cassi.models.zoo.toolbox import METHODS

    console, rows, failed, out = Console(), [], [], Path(cfg.output_dir)
    codes = {}  # each reference's code, loaded once (before any timing: a missing checkout fails first)
    for method in cfg.methods:
        source = METHODS[method].source if method in METHODS else None
        if source is None:
            raise SystemExit(f"error: unknown method {method!r}: one of {', '.join(sorted(METHODS))}")
        if source not in codes:
            try:
                codes[source] = compare.reference_code(method, cfg.toolbox, cfg.authors, cfg.device)
            except (ValueError, FileNotFoundError) as e:
                raise SystemExit(f"error: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    for method in cfg.methods:
        tb = codes[METHODS[method].source]
        for threads in cfg.threads:
            for precision in cfg.precisions:
                try:
                    rows.append(compare.benchmark(tb, method, cfg.size, cfg.batch, threads, cfg.repeats, cfg.train,
                                                  cfg.device, precision))
                except Exception as e:  # one method failing (e.g. the toolbox's code under bf16) loses no other row
                    failed.append(f"{method} ({threads} threads, {precision}): {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}")
                    console.print(f"[red]{failed[-1]}[/red]")
                    continue
                console.print(" | ".join(_zoo_cells(rows[-1])))
                write_text_atomic(out / "benchmark_zoo.json", json.dumps(rows, indent=1))  # kept if stopped
    table = ["| " + " | ".join(ZOO_COLUMNS) + " |", "|" + "---|" * len(ZOO_COLUMNS)]
    table += ["| " + " | ".join(_zoo_cells(r)) + " |" for r in rows]
    note = (f"\n{cfg.size}² × 28 bands, batch {cfg.batch}, on {cfg.device}; medians of {cfg.repeats} alternating calls; "
            f"reference code: {', '.join(sorted(codes))}\n" + "".join(f"\nfailed: {f}" for f in failed))
    write_text_atomic(out / "benchmark_zoo.md", "\n".join(table) + "\n" + note)
    write_text_atomic(out / "benchmark_zoo.json", json.dumps(rows, indent=1))
    console.print(f"wrote {out / 'benchmark_zoo.md'}")
    if failed:
        raise SystemExit(f"{len(failed)} row(s) failed: see {out / 'benchmark_zoo.md'}")
    return rows

