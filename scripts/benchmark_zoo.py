"""The field's models in cassi against the MST toolbox's code: parameters, FLOPs, forward and training-step time,
same weights, same scene, same process, alternating (cassi.models.zoo.compare.benchmark).

    python scripts/benchmark_zoo.py toolbox=<MST checkout>/simulation/train_code [methods=[mst_s]] [threads=[1,2]]

Writes benchmark_zoo.{md,json} in the output folder and prints the table.
"""
import json
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console

from cassi.io import write_text_atomic
from cassi.models.zoo import compare

COLUMNS = ["method", "threads", "params (M)", "toolbox params (M)", "GFLOPs", "forward s", "toolbox forward s",
           "× faster", "train step s", "toolbox train step s", "× faster (train)"]


def _cells(r: dict) -> list[str]:
    ratio = lambda a, b: f"{b / a:.2f}" if a and b else "–"  # noqa: E731
    return [r["method"], str(r["threads"]), f"{r['params'] / 1e6:.3f}", f"{r['toolbox_params'] / 1e6:.3f}",
            f"{r['gflops']:.1f}", f"{r['forward_s']:.3f}", f"{r['toolbox_forward_s']:.3f}",
            ratio(r["forward_s"], r["toolbox_forward_s"]), f"{r.get('train_step_s', 0):.3f}",
            f"{r.get('toolbox_train_step_s', 0):.3f}", ratio(r.get("train_step_s"), r.get("toolbox_train_step_s"))]


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_zoo")
def main(cfg: DictConfig) -> None:
    tb = compare.load_toolbox(cfg.toolbox)
    console, rows = Console(), []
    for method in cfg.methods:
        for threads in cfg.threads:
            rows.append(compare.benchmark(tb, method, cfg.size, cfg.batch, threads, cfg.repeats, cfg.train))
            console.print(" | ".join(_cells(rows[-1])))
    out = Path(cfg.output_dir)
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    note = (f"\n{cfg.size}² × 28 bands, batch {cfg.batch}; medians of {cfg.repeats} alternating calls; "
            f"toolbox: {tb.path}\n")
    write_text_atomic(out / "benchmark_zoo.md", "\n".join(table) + "\n" + note)
    write_text_atomic(out / "benchmark_zoo.json", json.dumps(rows, indent=1))
    console.print(f"wrote {out / 'benchmark_zoo.md'}")


if __name__ == "__main__":
    main()
