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

COLUMNS = ["method", "threads", "precision", "params (M)", "toolbox params (M)", "GFLOPs", "forward s", "toolbox forward s",
           "× faster", "train step s", "toolbox train step s", "× faster (train)"]


def _cells(r: dict) -> list[str]:
    ratio = lambda a, b: f"{b / a:.2f}" if a and b else "–"  # noqa: E731
    return [r["method"], str(r["threads"]), r.get("precision", "fp32"), f"{r['params'] / 1e6:.3f}", f"{r['toolbox_params'] / 1e6:.3f}",
            f"{r['gflops']:.1f}", f"{r['forward_s']:.3f}", f"{r['toolbox_forward_s']:.3f}",
            ratio(r["forward_s"], r["toolbox_forward_s"]), f"{r.get('train_step_s', 0):.3f}",
            f"{r.get('toolbox_train_step_s', 0):.3f}", ratio(r.get("train_step_s"), r.get("toolbox_train_step_s"))]


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_zoo")
def main(cfg: DictConfig) -> None:
    tb = compare.load_toolbox(cfg.toolbox, cfg.device)
    console, rows, failed, out = Console(), [], [], Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for method in cfg.methods:
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
                console.print(" | ".join(_cells(rows[-1])))
                write_text_atomic(out / "benchmark_zoo.json", json.dumps(rows, indent=1))  # kept if stopped
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    note = (f"\n{cfg.size}² × 28 bands, batch {cfg.batch}, on {cfg.device}; medians of {cfg.repeats} alternating calls; "
            f"toolbox: {tb.path}\n" + "".join(f"\nfailed: {f}" for f in failed))
    write_text_atomic(out / "benchmark_zoo.md", "\n".join(table) + "\n" + note)
    write_text_atomic(out / "benchmark_zoo.json", json.dumps(rows, indent=1))
    console.print(f"wrote {out / 'benchmark_zoo.md'}")
    if failed:
        raise SystemExit(f"{len(failed)} row(s) failed: see {out / 'benchmark_zoo.md'}")


if __name__ == "__main__":
    main()
