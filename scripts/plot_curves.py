"""Learning curves of training runs in one picture: a metric against CPU-minutes (or steps), baselines dashed.

    python scripts/plot_curves.py out=docs/training_curves.png "GAP-TV=24.44" 64²×8=outputs/exp/base 256²×1=outputs/exp/p256
    python scripts/plot_curves.py out=curves.png x=step y=val/ssim runs/cave_tsa
Arguments: out=<png> (default curves.png), x=<column> (default time/cpu_min, logged by the ElapsedTime
callback), y=<column> (default val/psnr), title=<text>, then runs as label=<run folder> or a bare folder
(its name is the label), and baselines as label=<number>. Exit status 2 for a folder without metrics.
"""
import sys
from pathlib import Path

from cassi.viz import read_curve, save_learning_curves

OPTIONS = {"out": "curves.png", "x": "time/cpu_min", "y": "val/psnr", "title": ""}


def main(argv: list[str]) -> int:
    opts, curves, baselines = dict(OPTIONS), {}, {}
    try:
        for a in argv:
            key, eq, value = a.partition("=")
            if eq and key in OPTIONS:
                opts[key] = value
                continue
            label, value = (key, value) if eq else (Path(a).name, a)
            try:
                baselines[label] = float(value)
            except ValueError:
                curves[label] = read_curve(value, y=opts["y"], x=opts["x"])
    except (FileNotFoundError, ValueError) as e:
        print(f"plot_curves.py: {e}", file=sys.stderr)
        return 2
    if not curves:
        print("plot_curves.py: give at least one run folder (label=<folder>)", file=sys.stderr)
        return 2
    xlabel = {"time/cpu_min": "CPU-minutes (process time, all threads)", "step": "optimizer steps"}.get(opts["x"], opts["x"])
    path = save_learning_curves(opts["out"], curves, baselines, xlabel=xlabel, ylabel=opts["y"], title=opts["title"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
