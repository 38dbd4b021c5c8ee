"""Thread counts that fit the machine as it is: the cores this process may use, the jobs it shares them with,
and the other processes that keep cores busy now.

cassi runs torch's OpenMP pool and numba's (a second OpenMP runtime), hundreds of short parallel regions per
reconstruction. An idle OpenMP thread spins for a while after each region, which makes back-to-back regions
cheap on idle cores (sleeping instead, ``OMP_WAIT_POLICY=PASSIVE``, is slower there); but beside a busy process
a spinning thread takes a core someone needs, and every region waits for a descheduled thread. So:

* :func:`cores` — the CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (v1 or v2).
* :func:`default_threads` — ``cores() // jobs()``, ``jobs()`` being the jobs started together that share
  those cores (``CASSI_JOBS``, set by the sweep callback :class:`cassi.workflows.sweeps.ThreadShare` and by
  the test suite for its workers), never more than torch's own default.
* :func:`adapt` — while on ``auto``, one thread fewer for each other task that wants a CPU now
  (:func:`others`), at least one: called at every solver iteration and training or reconstruction step. Under
  ``OMP_WAIT_POLICY=PASSIVE`` (set before Python starts) idle threads sleep instead, and all threads are kept:
  slower on idle cores, the fastest beside busy processes (docs/performance.md).

:func:`configure` applies a setting (``"auto"`` or a count) to torch; numba's kernels follow torch's count
(``cassi.physics.backends.numba``). ``import cassi`` caps torch's threads at :func:`default_threads` unless the user
set ``OMP_NUM_THREADS`` (then the count is theirs); every script takes ``threads=`` (``auto`` or a number).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cores", "jobs", "default_threads", "configure", "adapt", "others", "report", "quota"]

#: jobs started together that share this machine's cores (an integer ≥ 1; unset: 1)
JOBS_ENV = "CASSI_JOBS"

#: seconds between two looks at the machine's load (:func:`adapt`)
INTERVAL = 0.5

_torch_default: int | None = None  # torch's thread count before cassi changed it (recorded by ``cap``)
_passive = os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"  # idle OpenMP threads sleep
_auto = True  # threads follow the load (:func:`adapt`) until a count is configured
_looked = 0.0  # when adapt() last looked at the machine
_set: int | None = None  # the count cassi set last
_others: float | None = None  # other runnable tasks, averaged over adapt()'s looks


def quota(root: str | os.PathLike = "/") -> float | None:
    """The CPU quota of this process's cgroup in cores (quota / period, the smallest along its path: v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), or None when there is none. ``root``
    replaces ``/`` (for tests)."""
    root = Path(root)
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = Path(path.lstrip("/"))
        if controllers == "":  # cgroup v2
            base = root / "sys/fs/cgroup"
            limits += [_v2(base / p / "cpu.max") for p in _ancestors(rel)]
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                base = root / "sys/fs/cgroup" / name
                if base.is_dir():
                    limits += [_v1(base / p) for p in _ancestors(rel)]
                    break
    limits = [q for q in limits if q is not None]
    return min(limits) if limits else None


def _ancestors(rel: Path) -> list[Path]:
    """rel and every folder above it, up to the hierarchy's root (Path(""))."""
    return [rel, *rel.parents]


def _v2(path: Path) -> float | None:
    try:
        q, *period = path.read_text().split()
    except (OSError, ValueError):
        return None
    if q == "max":
        return None
    return int(q) / int(period[0] if period else 100000)


def _v1(folder: Path) -> float | None:
    try:
        q = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if q <= 0 or period <= 0 else q / period


def cores(root: str | os.PathLike = "/") -> int:
    """CPUs this process may use: its affinity mask (``os.sched_getaffinity``), capped by the cgroup quota
    rounded up (:func:`quota`); at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    q = quota(root)
    if q is not None:
        n = min(n, math.ceil(q - 1e-9))
    return max(1, n)


def jobs() -> int:
    """Jobs started together that share this machine's cores: ``CASSI_JOBS`` (≥ 1), else 1. A value that is
    not a positive integer raises ValueError naming it."""
    text = os.environ.get(JOBS_ENV, "").strip()
    if not text:
        return 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{JOBS_ENV} must be a positive integer (the jobs sharing the cores), got {text!r}")
    return n


def default_threads() -> int:
    """This process's share of the cores: ``cores() // jobs()``, at least 1, at most torch's own default."""
    share = max(1, cores() // jobs())
    return share if _torch_default is None else max(1, min(share, _torch_default))


def configure(threads: int | str | None = "auto") -> int:
    """Set torch's intra-op threads (numba's kernels follow them): ``"auto"`` (or None) gives
    :func:`default_threads`, a positive integer that count. Returns the count set. A bad value raises
    ValueError naming ``threads``."""
    import torch

    global _auto, _set, _others
    auto = threads is None or (isinstance(threads, str) and threads.strip().lower() == "auto")
    if auto:
        n = default_threads()
    else:
        try:
            n = int(threads)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or isinstance(threads, bool) or (isinstance(threads, float) and not float(threads).is_integer()):
            raise ValueError(f"threads must be 'auto' or a positive integer, got {threads!r}")
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _auto, _set, _others = auto, n, None
    return n


def _runnable(root: Path) -> int | None:
    """Tasks runnable on the machine now: /proc/stat's ``procs_running``; None where it cannot be read."""
    try:
        lines = (root / "proc/stat").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("procs_running ")), None)


def _stat(path: Path) -> list[bytes] | None:
    """The fields of a /proc task ``stat`` file after the command name (state first, nice at index 16); None
    when the task has gone or the file does not parse."""
    try:
        with open(path, "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _own_running(root: Path) -> int:
    """Threads of this process that are running or runnable now (state R in /proc/self/task/*/stat)."""
    n = sum((f := _stat(p)) is not None and f[:1] == [b"R"] for p in (root / "proc/self/task").glob("*/stat"))
    return max(1, n)  # at least the thread asking


def _weighed_others(proc: Path) -> float:
    """Runnable threads of other processes (/proc/<pid>/task/<tid>/stat in state R), each weighed by its CFS
    share against a nice-0 thread (1.25^−nice, at most 1): a niced background job takes little from us."""
    me, total = str(os.getpid()), 0.0
    with os.scandir(proc) as entries:
        for e in entries:
            if not e.name.isdigit() or e.name == me:
                continue
            try:
                tasks = list(os.scandir(proc / e.name / "task"))
            except OSError:
                continue
            for t in tasks:
                f = _stat(proc / e.name / "task" / t.name / "stat")
                if f is not None and f[:1] == [b"R"] and len(f) > 16 and f[16].lstrip(b"-").isdigit():
                    total += min(1.0, 1.25 ** -int(f[16]))
    return total


def others(root: str | os.PathLike = "/") -> float | None:
    """Other threads that want a CPU now, weighed by priority (a nice-19 thread counts about 0.015): 0 at once
    when the machine runs nothing but this process (/proc/stat's ``procs_running``), else the runnable threads
    of the other processes this process can see (:func:`_weighed_others`); None without /proc."""
    root = Path(root)
    running = _runnable(root)
    if running is None:
        return None
    if running - _own_running(root) <= 0:
        return 0.0
    return _weighed_others(root / "proc")


def adapt() -> int:
    """While threads are on ``auto``: at most every :data:`INTERVAL` seconds, count the other tasks that want
    a CPU (:func:`others`, averaged over the last looks) and set torch's threads (numba's kernels follow) to
    this process's share (:func:`default_threads`) less one per other task, at least 1: no thread then waits
    on a core that another process holds, and no idle thread spins on one. Returns the count in force. Cheap:
    call it at every step."""
    global _set, _auto, _others, _looked
    import time

    import torch

    n = torch.get_num_threads()
    if not _auto:
        return n
    if _set is not None and n != _set:  # someone else set a count: theirs from now on
        _auto = False
        return n
    now = time.monotonic()
    if now - _looked < INTERVAL:
        return n
    _looked = now
    k = others()
    if k is None:
        return n
    _others = k if _others is None else (_others + k) / 2  # the last looks, halving weights
    busy = round(_others)
    want = default_threads() if _passive else max(1, default_threads() - busy)
    if want != n:
        torch.set_num_threads(want)
    _set = want
    return want


def cap() -> None:
    """At ``import cassi``: remember torch's default thread count, and lower it to :func:`default_threads`
    unless the user set ``OMP_NUM_THREADS``."""
    global _torch_default, _auto, _set
    import torch

    if _torch_default is None:
        _torch_default = torch.get_num_threads()
    if "OMP_NUM_THREADS" in os.environ:
        _auto = False
    elif torch.get_num_threads() > default_threads():
        torch.set_num_threads(default_threads())
    _set = torch.get_num_threads()


def report() -> str:
    """One line: threads in use, how they are chosen, cores, jobs sharing them, other tasks seen."""
    import torch

    how = "auto, following the load" if _auto else "fixed"
    seen = "" if _others is None else f", other runnable tasks {_others:.1f}"
    return f"threads {torch.get_num_threads()} ({how}; cores {cores()}, jobs sharing them {jobs()}{seen})"
