"""Speed on a shared machine: GAP-TV and a learned model timed quiet and beside busy processes, under several
thread settings, and a local sweep of two jobs against the same jobs run one after the other.

Every timing runs in a fresh process (:func:`worker`), so that each setting starts its OpenMP runtimes with its
own environment; the settings of one round run back to back beside the same busy processes, and rounds repeat
the whole grid (min / median / max over the rounds' medians). A busy process is ``python -c "while True: pass"``.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: thread settings: name -> (environment added to the worker's, its ``threads`` setting)
SETTINGS = {
    "default": ({}, "auto"),
    "one thread": ({}, 1),
    "all threads": ({}, "cores"),
    "all threads, passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, "cores"),
}
NOTE = ("`default`: `threads=auto` (this process's share of the cores, less one per other runnable task); "
        "`all threads`: a fixed count of all cores (cassi before `auto` followed the load); `all threads, "
        "passive`: the same with idle OpenMP threads sleeping (`OMP_WAIT_POLICY=PASSIVE`) instead of spinning.")


@contextlib.contextmanager
def busy(n: int):
    """``n`` busy-loop processes while inside (killed on exit)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def worker(spec: dict) -> dict:
    """Time GAP-TV (``spec["iters"]`` iterations) and the model ``spec["ckpt"]`` (None: none) on one
    (1, bands, size, size) cube through ``spec["mask"]`` (a file; None: Bernoulli(0.5)), ``spec["repeats"]``
    calls each after one warm-up call, with ``spec["threads"]`` (``"auto"``, ``"cores"`` or a count).
    Returns {"threads", "gap_tv": [s...], "model": [s...]}. Run in a fresh process (:func:`run_worker`)."""
    import torch

    from cassi import CASSI, threads
    from cassi.data.synthetic import synthetic_cube
    from cassi.physics.masks import bernoulli_mask
    from cassi.solvers import GAPTV

    n = threads.cores() if spec["threads"] == "cores" else spec["threads"]
    threads.configure(n)
    size, bands = spec["size"], spec["bands"]
    if spec.get("mask"):
        from cassi.io import load_mask

        mask = load_mask(spec["mask"])[..., :size, :size]
    else:
        mask = bernoulli_mask(size, size, 0.5, seed=0)
    x = synthetic_cube(size, size, bands, seed=0)[None]
    op = CASSI(mask, bands=bands, step=2)
    y = op(x)
    calls = {"gap_tv": lambda: GAPTV(iters=spec["iters"])(op, y)}
    if spec.get("ckpt"):
        from cassi.models import load_model

        model = load_model(spec["ckpt"])
        calls["model"] = lambda: model(op, y)
    out = {}
    with torch.no_grad():
        for name, fn in calls.items():
            fn()
        for name in calls:
            out[name] = []
        for _ in range(spec["repeats"]):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                out[name].append(time.perf_counter() - t0)
    return {**out, "threads": torch.get_num_threads(), "report": threads.report()}  # as the last call ended


def run_worker(spec: dict, env: dict) -> dict:
    """:func:`worker` in a fresh Python process with ``env`` added to this one's environment."""
    code = f"import json, sys; from cassi.bench_shared import worker; print(json.dumps(worker({spec!r})))"
    full = {**os.environ, **env}
    for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CASSI_JOBS"):  # from cassi's defaults
        if k not in env:
            full.pop(k, None)
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark worker failed ({env}, {spec}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def contention(spec: dict, loads=(0, 1, 2), settings=tuple(SETTINGS), rounds: int = 3, log=print) -> list[dict]:
    """Rows {"busy", "setting", "threads", "gap_tv": [median per round], "model": [...]} for every number of
    busy processes and setting, ``rounds`` times over the whole grid."""
    rows = {(b, s): {"busy": b, "setting": s, "gap_tv": [], "model": []} for b in loads for s in settings}
    for r in range(rounds):
        for b in loads:
            with busy(b):
                for s in settings:
                    env, th = SETTINGS[s]
                    res = run_worker({**spec, "threads": th}, env)
                    row = rows[(b, s)]
                    row["threads"] = res["threads"]
                    for k in ("gap_tv", "model"):
                        if res.get(k):
                            row[k].append(statistics.median(res[k]))
                    log(f"round {r + 1}/{rounds}, {b} busy, {s} ({res['threads']} threads): gap_tv "
                        f"{statistics.median(res['gap_tv']):.2f} s" + (
                            f", model {statistics.median(res['model']):.2f} s" if res.get("model") else ""))
    return list(rows.values())


def _span(v: list[float]) -> str:
    return "–" if not v else f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"


def contention_markdown(rows: list[dict], model: str | None) -> str:
    """One table: rows = busy processes, columns = settings (median over rounds, min–max), then the default
    against the better of one thread and all threads."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    loads = list(dict.fromkeys(r["busy"] for r in rows))
    at = {(r["busy"], r["setting"]): r for r in rows}
    kinds = ["gap_tv"] + (["model"] if model else [])
    lines = []
    for kind in kinds:
        name = "GAP-TV" if kind == "gap_tv" else f"`{model}`"
        lines += [f"**{name}**, seconds per call, median over rounds (min–max):", "",
                  "| busy processes | " + " | ".join(f"{s} ({at[(loads[0], s)]['threads']})" for s in settings)
                  + " | default ÷ better of one and all |",
                  "|---|" + "---|" * (len(settings) + 1)]
        for b in loads:
            med = {s: statistics.median(at[(b, s)][kind]) for s in settings if at[(b, s)][kind]}
            best = min(med[s] for s in ("one thread", "all threads") if s in med) if (
                "one thread" in med or "all threads" in med) else None
            ratio = f"{med['default'] / best:.2f}×" if best and "default" in med else "–"
            lines.append(f"| {b} | " + " | ".join(_span(at[(b, s)][kind]) for s in settings) + f" | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def sweep(command: list[str], launchers: dict[str, dict], cwd: str | os.PathLike, sweep_root: Path,
          log=print) -> list[dict]:
    """Wall time of ``command`` (a multirun, e.g. two jobs) under each launcher (name -> {"overrides": [...],
    "env": {...}}; ``threads=cores`` becomes this machine's core count), one launcher after the other, each
    sweep into ``sweep_root``/<n>; rows {"launcher", "seconds", "threads": per job, from its job.json}."""
    from cassi.threads import cores

    rows = []
    for i, (name, spec) in enumerate(launchers.items()):
        extra = [f"threads={cores()}" if o == "threads=cores" else o for o in spec.get("overrides", [])]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CASSI_JOBS")}
        env.update(spec.get("env") or {})
        folder = Path(sweep_root) / str(i)
        t0 = time.perf_counter()
        done = subprocess.run([*command, *extra, f"hydra.sweep.dir={folder}"], cwd=cwd, env=env,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"sweep with launcher {name} failed:\n{done.stderr[-2000:]}")
        used = [json.loads(p.read_text()).get("threads") for p in sorted(folder.glob("*/job.json"))]
        rows.append({"launcher": name, "seconds": seconds, "threads": used})
        log(f"sweep, {name}: {seconds:.1f} s, threads per job {used}")
    return rows


def sweep_markdown(rows: list[dict], jobs: int, what: str) -> str:
    seq = next(r["seconds"] for r in rows if r["launcher"] == "one after the other")
    lines = [f"**A local sweep of {jobs} jobs** ({what}), wall seconds for the whole sweep:", "",
             "| launcher | threads per job | seconds | throughput against one after the other |", "|---|---|---|---|"]
    lines += [f"| {r['launcher']} | {', '.join(map(str, r['threads']))} | {r['seconds']:.1f} | {seq / r['seconds']:.2f}× |"
              for r in rows]
    return "\n".join(lines) + "\n"


def save(out_dir: Path, name: str, obj, md: str) -> None:
    """``name``.json and ``name``.md in ``out_dir``, written atomically."""
    from cassi.io import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / f"{name}.json", json.dumps(obj, indent=1))
    write_text_atomic(out_dir / f"{name}.md", md)
