"""Parameters, FLOPs, reconstruction time and training cost of the model configs (conf/benchmark_models.yaml).

    python scripts/benchmark_models.py                       # every conf/model config on this CPU
    python scripts/benchmark_models.py device=cuda train_size=256 train_batch=4 precision=[32,bf16] checkpointing=[false,true]
    python scripts/benchmark_models.py 'models=[pretrained/cave_any]' repeats=5    # a shipped model against GAP-TV
FLOPs: one forward pass at flops_size² × bands, batch 1, counted by torch.utils.flop_counter.FlopCounterMode
(convolutions, matmuls and attention; a multiply-add counts 2; the operator's elementwise work is not
counted). Reconstruction: the median time of one forward pass at flops_size² × bands (batch 1, no
gradient) against GAP-TV (conf/solver/gap_tv.yaml) on the same measurement, in the same process. Training: samples/s over ``steps`` Adam steps after one warm-up step, and peak memory (CUDA:
max allocated above what was allocated before; CPU: the peak resident memory above the resident memory before
the first step, with Linux's peak counter reset (/proc/self/clear_refs), in a fresh process per row).
Writes benchmark_models.{md,json} in the output folder.
"""
import json
import multiprocessing as mp
import time
from pathlib import Path
from queue import Empty

import hydra
import torch
from hydra import compose
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from cassi import CASSI
from cassi.io import write_text_atomic
from cassi.models import load_model


def model_spec(name: str, bands: int) -> dict:
    """conf/model/<name>.yaml (or the model of conf/experiment/<name>.yaml) at ``bands`` bands, resolved to a
    plain dict (picklable for the child process); a checkpoint (``pretrained/<name>`` or a .ckpt path): the model
    it records, as it reconstructs (its inference settings included; its own bands)."""
    if name.startswith("pretrained/") or name.endswith(".ckpt"):
        return {**load_model(name).config, "_recursive_": False}  # the config is the constructor call
    group = "experiment" if (Path(__file__).parents[1] / "conf" / "experiment" / f"{name}.yaml").is_file() else "model"
    return OmegaConf.to_container(compose("train", overrides=[f"{group}={name}", f"bands={bands}"]).model, resolve=True)


def problem(batch: int, bands: int, size: int, device: str):
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


def measure(row: dict, queue) -> None:
    """Runs in a fresh process: training throughput and peak memory of one (model, precision, checkpointing)."""
    torch.set_num_threads(row["threads"])
    dev = row["device"]
    model = instantiate({**row["spec"], "checkpointing": row["checkpointing"]}).to(dev)
    op, x, y = problem(row["train_batch"], row["bands"], row["train_size"], dev)
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


def markdown(rows: list[dict], cfg) -> str:
    head = (f"# Model configs: size and training cost\n\ntorch {torch.__version__}, device {cfg.device}"
            f"{'' if cfg.device != 'cpu' else f', {cfg.threads} threads'}; FLOPs of one forward pass at "
            f"{cfg.flops_size}²×{cfg.bands} (FlopCounterMode, multiply-add = 2 FLOPs); reconstruction time of "
            f"one {cfg.flops_size}²×{cfg.bands} cube and GAP-TV's on the same measurement (medians of {cfg.repeats}, "
            f"called alternately); training at batch "
            f"{cfg.train_batch} × {cfg.bands} × {cfg.train_size}², mean of {cfg.steps} Adam steps after one warm-up\n\n")
    lines = ["| model | stages | parameters (M) | GFLOPs | reconstruct (s) | GAP-TV (s) | × GAP-TV speed | precision | "
             "checkpointing | samples/s | peak memory (MB) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['stages']} | {r['params'] / 1e6:.2f} | {r['gflops']:.1f} | "
              f"{r['reconstruct_s']:.3f} | {r['gap_tv_s']:.3f} | {r['gap_tv_s'] / r['reconstruct_s']:.1f} | "
              f"{r['precision']} | "
              f"{'yes' if r['checkpointing'] else 'no'} | {r['samples_per_s']:.2f} | {r['peak_memory_mb']:.0f} |"
              for r in rows]
    lines += [f"\n{r['model']} ({r['precision']}, checkpointing {r['checkpointing']}): {r['error']}" for r in rows
              if r.get("error")]
    return head + "\n".join(lines) + "\n"


def run_measure(ctx, row: dict) -> dict:
    """``measure(row)`` in a fresh process; a process that dies (e.g. killed when memory runs out) gives a
    row with its exit code instead of hanging the benchmark."""
    queue = ctx.Queue()
    proc = ctx.Process(target=measure, args=(row, queue))
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


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_models")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    ctx, rows = mp.get_context("spawn"), []
    op, _, y = problem(1, cfg.bands, cfg.flops_size, "cpu")
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
                result = run_measure(ctx, row)
                rows.append({**{k: v for k, v in row.items() if k != "spec"}, **result})
                print(f"{name}: {row['params'] / 1e6:.2f} M, {row['gflops']:.1f} GFLOPs, {precision}, "
                      f"checkpointing {ckpt}: {result['samples_per_s']:.2f} samples/s, "
                      f"peak {result['peak_memory_mb']:.0f} MB", flush=True)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, cfg)
    write_text_atomic(out / "benchmark_models.md", md)
    write_text_atomic(out / "benchmark_models.json", json.dumps(rows, indent=1))
    print(md)


if __name__ == "__main__":
    main()
