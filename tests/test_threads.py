"""Thread counts that fit the machine (cassi.threads, issue 87): cores from the affinity mask and a cgroup quota,
the jobs sharing them, the load-following count, the sweep launchers' per-job share, and results that do not
depend on the thread count."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from cassi import CASSI, threads
from cassi.data.synthetic import synthetic_cube
from cassi.workflows.sweeps import ThreadShare, parallel_jobs
from cassi.physics.masks import bernoulli_mask
from cassi.solvers import GAPTV

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keep_threads(monkeypatch):
    """Restores torch's thread count and cassi.threads' state after the test."""
    before = torch.get_num_threads()
    for name in ("_auto", "_set", "_others", "_looked", "_passive"):
        monkeypatch.setattr(threads, name, getattr(threads, name))
    yield
    torch.set_num_threads(before)


def python(code: str, env: dict | None = None) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter with a clean thread environment."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", threads.JOBS_ENV)}
    r = subprocess.run([sys.executable, "-c", code], env={**base, **(env or {})}, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def cgroup(root: Path, v2: str | None = None, v1: tuple[int, int] | None = None, path: str = "job/step") -> Path:
    """A fake / with /proc/self/cgroup at ``path`` and a CPU limit at its parent: v2 ``cpu.max`` or v1 quota."""
    (root / "proc/self").mkdir(parents=True)
    if v2 is not None:
        (root / "proc/self/cgroup").write_text(f"0::/{path}\n")
        d = root / "sys/fs/cgroup" / path
        d.mkdir(parents=True)
        (d / "cpu.max").write_text("max 100000\n")
        (d.parent / "cpu.max").write_text(v2 + "\n")
    else:
        (root / "proc/self/cgroup").write_text(f"4:memory:/{path}\n2:cpu,cpuacct:/{path}\n")
        d = root / "sys/fs/cgroup/cpu,cpuacct" / path
        d.mkdir(parents=True)
        for folder, (q, p) in ((d, (-1, 100000)), (d.parent, v1)):
            (folder / "cpu.cfs_quota_us").write_text(f"{q}\n")
            (folder / "cpu.cfs_period_us").write_text(f"{p}\n")
    return root


def test_the_cgroup_quota_is_read_v1_and_v2_and_the_tightest_level_wins(tmp_path):
    assert threads.quota(cgroup(tmp_path / "a", v2="150000 100000")) == 1.5
    assert threads.quota(cgroup(tmp_path / "b", v1=(300000, 100000))) == 3.0
    assert threads.quota(cgroup(tmp_path / "c", v2="max 100000")) is None
    assert threads.quota(tmp_path / "nothing") is None
    affinity = len(os.sched_getaffinity(0))
    assert threads.cores(cgroup(tmp_path / "d", v2="50000 100000")) == 1  # half a core: one thread
    assert threads.cores(cgroup(tmp_path / "e", v2="150000 100000")) == min(affinity, 2)  # rounded up
    assert threads.cores(tmp_path / "nothing") == affinity


def test_jobs_share_the_cores_and_a_bad_count_is_named(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda root="/": 8)
    monkeypatch.setattr(threads, "_torch_default", 8)
    monkeypatch.delenv(threads.JOBS_ENV, raising=False)
    assert threads.default_threads() == 8
    monkeypatch.setenv(threads.JOBS_ENV, "3")
    assert threads.default_threads() == 2
    monkeypatch.setenv(threads.JOBS_ENV, "20")
    assert threads.default_threads() == 1
    monkeypatch.setattr(threads, "_torch_default", 4)  # never above torch's own default
    monkeypatch.setenv(threads.JOBS_ENV, "1")
    assert threads.default_threads() == 4
    monkeypatch.setenv(threads.JOBS_ENV, "two")
    with pytest.raises(ValueError, match="CASSI_JOBS"):
        threads.default_threads()


@pytest.mark.parametrize("bad", [0, -2, "many", 1.5, True])
def test_configure_refuses_a_bad_setting(bad):
    with pytest.raises(ValueError, match="threads must be 'auto' or a positive integer"):
        threads.configure(bad)


def test_configure_sets_torch_and_an_explicit_count_is_kept(monkeypatch, keep_threads):
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    monkeypatch.setattr(threads, "others", lambda root="/": 5)
    assert threads.configure(1) == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "default_threads", lambda: 2)
    assert threads.adapt() == 1  # an explicit count is kept
    assert threads.configure("auto") == 2 and torch.get_num_threads() == 2


def test_adapt_leaves_a_core_to_each_other_task(monkeypatch, keep_threads):
    """k other runnable tasks: the share P less k threads, at least one; a count set by someone else ends the
    adapting."""
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    monkeypatch.setattr(threads, "default_threads", lambda: 4)
    seen = []
    monkeypatch.setattr(threads, "others", lambda root="/": seen[-1])
    threads.configure("auto")
    got = []
    for k in (0, 1, 1, 3, 3, 6, 6, 0, 0):
        seen.append(k)
        got.append(threads.adapt())
        assert torch.get_num_threads() == got[-1]
    # the mean of the looks, halving weights: 0 -> 4 threads; 1 (.5 rounds to 0) -> 4, 1 (.75) -> 3;
    # 3 (1.9) -> 2, 3 (2.4) -> 2; 6 (4.2) -> 1, 6 (5.1) -> 1; 0 (2.6) -> 1, 0 (1.3) -> 3
    assert got == [4, 4, 3, 2, 2, 1, 1, 1, 3]
    torch.set_num_threads(2)  # the user's own count
    seen.append(0)
    assert threads.adapt() == 2 and torch.get_num_threads() == 2
    threads.configure("auto")  # until auto is asked for again
    assert threads.adapt() == 4
    monkeypatch.setattr(threads, "_passive", True)  # idle threads sleep: all of them are kept
    seen.append(6)
    assert threads.adapt() == 4


def test_others_weighs_other_runnable_threads_by_priority(tmp_path):
    """Runnable threads of other processes count 1 each at nice 0 and 1.25^−nice when niced; this process's own
    threads and sleeping ones do not; nothing runnable but us: 0 without looking further."""
    proc = tmp_path / "proc"

    def task(pid, tid, state, nice=0):
        d = proc / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        fields = [state, *["0"] * 15, str(nice)]  # field 19 of stat: nice
        (d / "stat").write_text(f"{tid} (py (x) y) {' '.join(fields)} 0 0\n")

    task("self", 1, "R")
    task(os.getpid(), os.getpid(), "R")  # ours, under its pid too: not another process
    task(111, 111, "R")
    task(111, 112, "R")  # a second runnable thread of the same process
    task(222, 222, "R", nice=19)
    task(333, 333, "S")
    (proc / "stat").write_text("cpu 1 2 3 4\ncpu0 1 2 3 4\nprocs_running 5\nprocs_blocked 0\n")
    assert threads.others(tmp_path) == pytest.approx(2 + 1.25 ** -19)
    (proc / "stat").write_text("cpu 1 2 3 4\nprocs_running 1\n")  # only this process's thread
    assert threads.others(tmp_path) == 0.0
    assert threads.others(tmp_path / "none") is None


def test_affinity_caps_the_threads_at_import_unless_omp_num_threads_is_set():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    code = ("import os, json; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); import cassi, torch; "
            "from cassi import threads; print(json.dumps([threads.cores(), torch.get_num_threads()]))")
    assert python(code) == [1, 1]
    # the user's OMP_NUM_THREADS is theirs, and so is CASSI_JOBS's share
    assert python(code, {"OMP_NUM_THREADS": "2"}) == [1, 2]
    code2 = "import json, cassi, torch; print(json.dumps(torch.get_num_threads()))"
    assert python(code2, {threads.JOBS_ENV: str(len(os.sched_getaffinity(0)))}) == 1


def test_results_do_not_depend_on_the_thread_count(keep_threads):
    op = CASSI(bernoulli_mask(48, 40, seed=3), bands=6, step=2)
    y = op(synthetic_cube(48, 40, 6, seed=3)[None])
    out = []
    for n in (1, 2, 3):
        threads.configure(n)
        out.append(GAPTV(iters=6)(op, y).x)
    for x in out[1:]:
        torch.testing.assert_close(x, out[0], rtol=1e-6, atol=1e-6)


def sweep_config(launcher: dict, overrides: list[str], sweeper: dict | None = None):
    return OmegaConf.create({"hydra": {"launcher": launcher, "sweeper": sweeper or {"max_batch_size": None},
                                       "overrides": {"task": overrides}}})


@pytest.mark.parametrize("launcher, overrides, sweeper, want", [
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 2},
     ["seed=1,2,3", "solver=gap_tv"], None, 2),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 4},
     ["seed=1,2,3", "lr=1e-4,4e-4"], None, 4),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": -1},
     ["seed=range(0,10)"], None, 7),  # cores + 1 + n_jobs, cores = 7
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 8},
     ["seed=1,2,3"], {"max_batch_size": 2}, 2),
    ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"},
     ["seed=1,2,3"], None, 3),
    ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"},
     ["lr=interval(0,1)"], {"n_jobs": 5}, 5),  # an Optuna batch
    ({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, ["seed=1,2,3"], None, 1),
    ({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"}, ["seed=1,2"], None, 1),
])
def test_parallel_jobs_of_each_launcher(launcher, overrides, sweeper, want):
    assert parallel_jobs(sweep_config(launcher, overrides, sweeper), cores=7) == want


def test_thread_share_tells_the_jobs_and_keeps_a_users_value(monkeypatch):
    cfg = sweep_config({"_target_": "x.JoblibLauncher", "n_jobs": 2}, ["seed=1,2"])
    monkeypatch.delenv(threads.JOBS_ENV, raising=False)
    ThreadShare().on_multirun_start(cfg)
    assert os.environ[threads.JOBS_ENV] == "2"
    monkeypatch.setenv(threads.JOBS_ENV, "5")
    ThreadShare().on_multirun_start(cfg)
    assert os.environ[threads.JOBS_ENV] == "5"
