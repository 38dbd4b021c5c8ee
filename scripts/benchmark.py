"""Benchmark the CASSI operator's backends (see cassi/bench.py and conf/benchmark.yaml).

    python scripts/benchmark.py                       # all backends, default cases
    python scripts/benchmark.py cases=[seed] backends=[strided,loop]
Writes benchmark.json and benchmark.md into the Hydra output directory.
"""
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.markdown import Markdown

from cassi import bench
from cassi.io import write_text_atomic


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    console = Console()
    console.print(f"torch {torch.__version__}, threads {threads}, device {cfg.device}, dtype {cfg.dtype}")
    rows = []
    for name in cfg.cases:
        case = {"name": name, **cfg.case_table[name]}
        console.print(f"case {name}: {case}")
        rows += bench.run_case(case, list(cfg.backends), cfg.repeats, cfg.warmup, cfg.device,
                               getattr(torch, cfg.dtype), cfg.peak_memory)
    md = bench.markdown(rows, threads, cfg.device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "benchmark.md", md)
    write_text_atomic(out / "benchmark.json", bench.to_json(rows))
    console.print(Markdown(md))
    console.print(f"wrote {out / 'benchmark.md'} and {out / 'benchmark.json'}")


if __name__ == "__main__":
    main()
