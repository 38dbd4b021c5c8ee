"""Benchmark the CASSI operator's backends (see cassi/bench.py and conf/benchmark.yaml).

    python scripts/benchmark.py                       # all backends, default cases
    python scripts/benchmark.py cases=[seed] backends=[strided,loop]
    python scripts/benchmark.py scaling=true          # A then Aᵀ vs bytes moved over bands, sizes, batch
Writes benchmark.{json,md} (or scaling.{json,md,png}) into the Hydra output directory.
"""
import json
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markdown import Markdown

from cassi import bench
from cassi.io import write_text_atomic


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    bench.RETRIES = cfg.retries
    threads = torch.get_num_threads()
    console = Console()
    device = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else cfg.device
    console.print(f"torch {torch.__version__}, threads {threads}, device {device}, dtype {cfg.dtype}")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, cfg.dtype)
    if cfg.scaling:
        sweeps = {k: tuple(v) for k, v in OmegaConf.to_container(cfg.sweeps).items()}
        rows = bench.scaling(cfg.scaling_backend, sweeps, dict(cfg.case_table[cfg.scaling_base]), cfg.repeats,
                             cfg.warmup, cfg.device, dtype, cfg.max_x_gb)
        md = bench.scaling_markdown(rows, threads, device)
        write_text_atomic(out / "scaling.md", md)
        write_text_atomic(out / "scaling.json", json.dumps(rows, indent=1))
        bench.scaling_plot(rows, out / "scaling.png", f"cassi {cfg.scaling_backend} backend, {device}, "
                           f"{threads} threads, {cfg.dtype}")
        console.print(Markdown(md))
        console.print(f"wrote {out / 'scaling.md'}, {out / 'scaling.json'} and {out / 'scaling.png'}")
        return
    rows = []
    for name in cfg.cases:
        case = {"name": name, **cfg.case_table[name]}
        console.print(f"case {name}: {case}")
        rows += bench.run_case(case, list(cfg.backends), cfg.repeats, cfg.warmup, cfg.device, dtype, cfg.peak_memory)
    md = bench.markdown(rows, threads, device)
    write_text_atomic(out / "benchmark.md", md)
    write_text_atomic(out / "benchmark.json", bench.to_json(rows))
    console.print(Markdown(md))
    console.print(f"wrote {out / 'benchmark.md'} and {out / 'benchmark.json'}")


if __name__ == "__main__":
    main()
