"""Collect a sweep into one table: one row per job with its overrides, the value it returned (train.py:
the best validation metric), its mean result metrics, time and, for failed or unfinished jobs, the error.

    python scripts/collect.py sweep_dir=multirun/2026-11-23/07-00-00     # writes <sweep_dir>/sweep.{md,csv,json}
    python scripts/collect.py sweep_dir=latest                          # the newest sweep under multirun/
    python scripts/collect.py sweep_dir=... sort=test/psnr mode=max out=results/lr_sweep
Arguments are key=value: sweep_dir (required), sort (a column; default: the optimised metric the jobs
returned, else the mean PSNR of their result tables), mode (max | min; default: the jobs' monitor_mode),
out (output stem; default <sweep_dir>/sweep). Rows are sorted best first; failed and unfinished jobs last.
Exit status: 0 when the table was written (failed jobs included), 2 for bad arguments or no jobs.
"""
import sys
from pathlib import Path

from cassi.workflows.sweeps import collect, latest_sweep

KEYS = {"sweep_dir": None, "sort": None, "mode": None, "out": None}


def parse(argv: list[str]) -> dict:
    args = dict(KEYS)
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq and args["sweep_dir"] is None and not a.startswith("-"):
            key, value = "sweep_dir", a  # a bare path
        elif key not in KEYS or not eq:
            raise SystemExit(f"collect.py: unknown argument {a!r}; use key=value with key in {sorted(KEYS)}")
        args[key] = None if value in ("", "null") else value
    if args["sweep_dir"] is None:
        raise SystemExit("collect.py: give sweep_dir=<a sweep folder> (or sweep_dir=latest)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    sweep = Path(args["sweep_dir"])
    try:
        if args["sweep_dir"] == "latest":
            sweep = latest_sweep(Path("multirun"))
        table = collect(sweep, out=args["out"], sort=args["sort"], mode=args["mode"])
    except (FileNotFoundError, ValueError) as e:
        print(f"collect.py: {e}", file=sys.stderr)
        return 2
    print(Path(table["paths"][0]).read_text())
    if table.get("best"):
        best = table["best"]
        chosen = " ".join(f"{k}={best[k]}" for k in table["varying"]) or " ".join(best["overrides"])
        print(f"best {table['sort']} = {best[table['sort']]:.4f}: job {best['job']} ({chosen})")
    print("wrote " + ", ".join(table["paths"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
