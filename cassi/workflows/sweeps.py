"""Sweeps: a record of every Hydra job (:class:`JobRecord`) and one table per sweep (:func:`collect`).

A sweep (``python scripts/train.py -m ...``, an Optuna search, a joblib or SLURM launcher) writes one folder
per job under its sweep folder. :class:`JobRecord`, a Hydra callback registered in ``conf/train.yaml`` and
``conf/evaluate.yaml``, writes ``job.json`` into each job's folder: its overrides, status (``running`` while
it runs, then ``completed`` or ``failed``), the value the entry point returned (``train.py``: the best
validation ``monitor``), the error of a failed job, start, end, duration and the job's torch threads.
:class:`ThreadShare` tells the jobs of a local parallel launcher how many run at once (their share of the
cores). :func:`collect` gathers those records and the jobs' result tables (``test_results.json`` of train.py,
``results.json`` of evaluate.py) into ``<sweep>/sweep.{md,csv,json}``, sorted by the optimised metric, failed jobs kept with their error.

Standard library only (plus Hydra's callback base class): no torch, no Lightning at import.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import socket
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:  # Hydra's base class when Hydra is there (always for the scripts); the callback API is duck-typed
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object

RECORD = "job.json"
RESULT_TABLES = ("test_results.json", "results.json")  # train.py (test of the best checkpoint), evaluate.py


def _rank() -> int:
    """This process's rank when several processes run one job (SLURM tasks, torchrun); 0 otherwise."""
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def _write_json(path: Path, obj: dict) -> None:
    from cassi.io import write_text_atomic  # imported when a job runs, not when Hydra loads the callback

    write_text_atomic(path, json.dumps(obj, indent=1, default=str))


def _sqlite_path(url: Any) -> Path | None:
    """The file of an ``sqlite:///<path>`` storage URL (None for other URLs and in-memory databases)."""
    if isinstance(url, str) and url.startswith("sqlite:///") and url[len("sqlite:///"):] not in ("", ":memory:"):
        return Path(url[len("sqlite:///"):])
    return None


class JobRecord(_HydraCallback):
    """Hydra callback: writes ``job.json`` in every job's output folder (rank 0 only).

    Args:
        metric: the name of the value the task function returns (``train.py``: ``${monitor}``), or None.
        mode: ``max`` or ``min``: how that value is optimised (``${monitor_mode}``).
    """

    def __init__(self, metric: str | None = None, mode: str = "max", filename: str = RECORD):
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.metric, self.mode, self.filename = metric, mode, filename
        self._start: float | None = None
        self._started: str | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        """Creates the folder of an sqlite storage (Optuna), which sqlite does not create itself."""
        storage = _sqlite_path(config.hydra.sweeper.get("storage")) if "sweeper" in config.hydra else None
        if storage is not None:
            storage.parent.mkdir(parents=True, exist_ok=True)

    def _path(self, config) -> Path:
        return Path(config.hydra.runtime.output_dir) / self.filename

    def _base(self, config) -> dict:
        job = config.hydra.job
        return {"job": {"name": job.name, "num": job.get("num"), "id": job.get("id")},
                "overrides": list(config.hydra.overrides.task),
                "metric": self.metric, "mode": self.mode, "host": socket.gethostname(), "start": self._started}

    def on_job_start(self, config, **kwargs) -> None:
        self._start, self._started = time.time(), _now()
        if _rank() == 0:
            path = self._path(config)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_json(path, {**self._base(config), "status": "running"})

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if _rank() != 0:
            return
        from hydra.core.utils import JobStatus

        record = {**self._base(config), "end": _now(),
                  "time_s": None if self._start is None else round(time.time() - self._start, 3)}
        if "torch" in sys.modules:  # the threads the job ended with (cassi.threads: its share of the cores)
            record["threads"] = sys.modules["torch"].get_num_threads()
        record["jobs_sharing_cores"] = os.environ.get("CASSI_JOBS", "1")  # ThreadShare's count
        record["overrides"] = list(job_return.overrides or record["overrides"])
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            try:
                value = None if value is None else float(value)
            except (TypeError, ValueError):
                value = str(value)
            record.update(status="completed", value=value)
        else:
            error = job_return._return_value  # the exception (reading .return_value would raise it)
            record.update(status="failed", value=None, error=_one_line(error),
                          traceback="".join(traceback.format_exception(error))[-8000:]
                          if isinstance(error, BaseException) else None)
        _write_json(self._path(config), record)


class ThreadShare(_HydraCallback):
    """Hydra callback: before a multirun starts its jobs, tells them how many of them run at once on this
    machine (``CASSI_JOBS``, inherited by the job processes of the joblib and submitit-local launchers), so
    that each job takes its share of the cores (``cassi.threads.default_threads``: cores // jobs) instead of
    all of them. A value the user set is kept; launchers that run jobs one at a time (the basic one) or on other
    machines (SLURM) set nothing."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from cassi.threads import JOBS_ENV, cores

        n = parallel_jobs(config, cores())
        if n > 1 and JOBS_ENV not in os.environ:
            os.environ[JOBS_ENV] = str(n)


def parallel_jobs(config, cores: int) -> int:
    """Jobs of a multirun that run at once on this machine: the jobs of a batch (the grid of the sweep
    overrides, capped by the basic sweeper's ``max_batch_size``; an Optuna sweeper's ``n_jobs``), at most the
    launcher's concurrency: joblib's ``n_jobs`` (negative: cores + 1 + n_jobs), all of them for submitit's
    local launcher, 1 for any other (the basic launcher runs them in turn; SLURM elsewhere)."""
    hydra = config.hydra
    target = str(hydra.launcher.get("_target_", "")) if "launcher" in hydra else ""
    sweeper = hydra.get("sweeper") or {}
    if "n_jobs" in sweeper:  # Optuna: trials per batch
        batch = int(sweeper.n_jobs)
    else:
        batch = _grid_size(list(hydra.overrides.task))
        if sweeper.get("max_batch_size"):
            batch = min(batch, int(sweeper.max_batch_size))
    if target.endswith("JoblibLauncher"):
        n_jobs = int(hydra.launcher.get("n_jobs") or 1)
        concurrency = n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)
    elif target.endswith("submitit_launcher.LocalLauncher"):
        concurrency = batch
    else:
        concurrency = 1
    return max(1, min(batch, concurrency))


def _grid_size(overrides: list[str]) -> int:
    """Jobs in the grid of Hydra command-line overrides (choice and range sweeps; 1 without any)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    n = 1
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_choice_sweep() or o.is_range_sweep():
            n *= len(list(o.sweep_string_iterator()))
    return n


def _one_line(error: Any) -> str:
    if isinstance(error, BaseException):
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
    return str(error)


# ---------------------------------------------------------------------------------------------- collect


def _yaml_list(path: Path) -> list[str]:
    """The overrides Hydra saved in ``.hydra/overrides.yaml`` (a YAML list of strings)."""
    try:
        from omegaconf import OmegaConf

        return [str(o) for o in OmegaConf.load(path)]
    except Exception:  # noqa: BLE001 - an unreadable file must not stop the table
        return []


def find_jobs(sweep_dir: Path) -> list[Path]:
    """Every job folder (holding ``.hydra/`` or a ``job.json``) under ``sweep_dir``, by job number then path."""
    sweep_dir = Path(sweep_dir)
    found = {p.parent for p in sweep_dir.rglob(".hydra") if p.is_dir()} | {p.parent for p in sweep_dir.rglob(RECORD)}
    if not (sweep_dir / ".hydra").is_dir():
        found.discard(sweep_dir)

    def key(p: Path):
        rel = p.relative_to(sweep_dir).parts
        return [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in rel]

    return sorted(found, key=key)


def _mean_metrics(job: Path) -> dict:
    for name in RESULT_TABLES:
        path = job / name
        if path.is_file():
            try:
                mean = json.loads(path.read_text()).get("mean", {})
            except (OSError, ValueError):
                continue
            prefix = "test/" if name.startswith("test_") else ""
            return {f"{prefix}{k}": v for k, v in mean.items() if k != "name" and isinstance(v, (int, float))}
    return {}


def _log_tail(job: Path) -> str:
    """The last non-empty line of the job's Hydra log (``<task>.log``), for jobs without an end record."""
    for log in sorted(job.glob("*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1][-300:]
    return ""


def job_row(job: Path, sweep_dir: Path) -> dict:
    """One row: job, status, overrides, the returned value, the mean result metrics, time, error."""
    record: dict = {}
    if (job / RECORD).is_file():
        try:
            record = json.loads((job / RECORD).read_text())
        except (OSError, ValueError) as e:
            record = {"status": "unreadable", "error": f"{RECORD}: {e}"}
    overrides = record.get("overrides") or _yaml_list(job / ".hydra" / "overrides.yaml")
    status = record.get("status", "unknown")
    error = record.get("error")
    if status in ("running", "unknown"):  # killed, timed out, or run without the JobRecord callback
        finished = any((job / t).is_file() for t in RESULT_TABLES)
        if status == "unknown" and finished:
            status = "completed"
        else:
            status = "incomplete"
            error = error or f"no end record (still running, killed or timed out?); log: {_log_tail(job)}".rstrip()
    return {"job": str(job.relative_to(sweep_dir)) if job != sweep_dir else ".", "status": status,
            "overrides": [o for o in overrides if not o.startswith(("hydra.", "paths."))],
            "metric": record.get("metric"), "mode": record.get("mode"), "value": record.get("value"),
            "metrics": _mean_metrics(job), "time_s": record.get("time_s"), "error": error}


def _parse(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return float(v)


def collect(sweep_dir, out=None, sort: str | None = None, mode: str | None = None) -> dict:
    """Gathers the jobs of a sweep into ``<out>.{md,csv,json}`` (default ``<sweep_dir>/sweep``).

    Args:
        sweep_dir: the sweep folder (``hydra.sweep.dir``; the jobs are its sub-folders).
        out: the output stem; None: ``<sweep_dir>/sweep``.
        sort: the column to sort on: None (the value the jobs returned, e.g. best ``val/psnr`` of train.py,
            else ``test/psnr`` or ``psnr`` of the result tables), or a metric column name.
        mode: ``max`` (best first) or ``min``; None: the jobs' recorded mode, else ``max``.

    Returns the table as a dict (``columns``, ``rows``, ``sort``, ``mode``, ``fixed`` overrides, ``best``,
    ``optuna`` when the sweep was an Optuna search, ``paths`` written). Failed and unfinished jobs are kept
    as rows with their error, after the others.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder {sweep_dir} does not exist")
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"no job folders (with .hydra/ or {RECORD}) under {sweep_dir}")
    rows = [job_row(j, sweep_dir) for j in jobs]
    # overrides shared by every job are shown once (``fixed``); those that vary become columns
    parsed = [dict(_parse(o) for o in r["overrides"]) for r in rows]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    varying = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    fixed = [f"{k}={parsed[0][k]}" for k in keys if k not in varying and all(k in p for p in parsed)]
    metric = next((r["metric"] for r in rows if r["metric"]), None)
    value_col = metric or "value"
    metric_cols = list(dict.fromkeys(k for r in rows for k in r["metrics"]))
    for r, p in zip(rows, parsed):
        r.update({k: p.get(k, "") for k in varying})
        r[value_col] = r.pop("value")
        r.update(r.pop("metrics"))
    has_value = any(_number(r[value_col]) is not None for r in rows)
    if sort is None:
        sort = value_col if has_value else next((c for c in ("test/psnr", "psnr") if c in metric_cols), value_col)
    mode = mode or next((r["mode"] for r in rows if r["mode"]), None) or "max"
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    sign = -1.0 if mode == "max" else 1.0

    def order(r: dict):
        v = _number(r.get(sort))
        return (r["status"] != "completed", v is None, sign * v if v is not None else 0.0)

    rows.sort(key=order)
    columns = ["job", "status", *varying, value_col, *metric_cols, "time_s", "error"]
    if not any(r["error"] for r in rows):
        columns.remove("error")
    if not has_value:
        columns.remove(value_col)
    table = {"sweep_dir": str(sweep_dir), "sort": sort, "mode": mode, "fixed": fixed, "varying": varying,
             "columns": columns,
             "rows": [{**{c: r.get(c) for c in columns}, "overrides": r["overrides"]} for r in rows]}
    table["best"] = next((r for r in table["rows"] if r["status"] == "completed" and _number(r.get(sort)) is not None),
                         None)
    optuna = sweep_dir / "optimization_results.yaml"
    if optuna.is_file():
        from omegaconf import OmegaConf

        table["optuna"] = OmegaConf.to_container(OmegaConf.load(optuna))
    table["paths"] = [str(p) for p in _write(table, Path(out) if out else sweep_dir / "sweep")]
    return table


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _write(table: dict, stem: Path) -> list[Path]:
    from cassi.io import write_text_atomic

    cols, rows = table["columns"], table["rows"]
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    md = [f"# Sweep {table['sweep_dir']}", "",
          f"{len(rows)} jobs ({', '.join(f'{n} {s}' for s, n in counts.items())}), sorted by {table['sort']} "
          f"({'highest' if table['mode'] == 'max' else 'lowest'} first)."]
    if table["fixed"]:
        md += ["", "Common overrides: " + " ".join(f"`{o}`" for o in table["fixed"])]
    if "optuna" in table and "best_value" in table["optuna"]:
        md += ["", f"Optuna: best value {_fmt(table['optuna']['best_value'])} with {table['optuna']['best_params']}"]
    md += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*cols, "overrides"], restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows([{**r, "overrides": " ".join(r["overrides"])} for r in rows])
    stem.parent.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in table.items() if k != "paths"}
    outputs = {".md": "\n".join(md) + "\n", ".csv": buf.getvalue(), ".json": json.dumps(body, indent=1, default=str)}
    return [write_text_atomic(stem.with_suffix(ext), text) for ext, text in outputs.items()]


def latest_sweep(root) -> Path:
    """The newest sweep folder under ``root`` (e.g. ``multirun/``): one holding ``multirun.yaml`` (a grid sweep:
    Hydra's basic sweeper writes it first) or ``optimization_results.yaml`` (an Optuna search, at its end)."""
    sweeps = sorted([*Path(root).rglob("multirun.yaml"), *Path(root).rglob("optimization_results.yaml")],
                    key=lambda p: p.stat().st_mtime)
    if not sweeps:
        raise FileNotFoundError(f"no sweep folder (with multirun.yaml or optimization_results.yaml) under {root}")
    return sweeps[-1].parent
