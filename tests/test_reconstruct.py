"""scripts/reconstruct.py end to end, run as a user runs it (a subprocess, or in this process as ``__main__``;
everything under tmp_path): outputs that open again, the report page, resuming, exit status, real measurements
and bad files."""
import html.parser
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
from PIL import Image

from cassi.io import TSA_WAVELENGTHS, load_cube, load_mask, load_measurement, save_mask, save_measurement

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trainer.accelerator=cpu", "operator.backend=strided"]  # (auto would time the backends first)
SMALL = [*FAST, "data.test.n=2", "data.test.height=32", "data.test.width=40", "solver.iters=5"]
SCENES = ["synthetic_2000000", "synthetic_2000001"]


def reconstruct(tmp_path: Path, out: Path, *overrides, address_space: int | None = None) -> subprocess.CompletedProcess:
    """Runs the script; COLUMNS=200, as rich wraps lines at the terminal width (a long tmp path splits phrases);
    `address_space`: a limit in bytes (RLIMIT_AS), as a user's job limits (a huge allocation then fails at once)."""
    limit = None if address_space is None else (
        lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.getrlimit(resource.RLIMIT_AS)[1])))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "reconstruct.py"), f"output_dir={out}", *overrides],
                          cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200"),
                          capture_output=True, text=True, timeout=600, preexec_fn=limit)


def reconstruct_here(monkeypatch, out: Path, *overrides) -> int:
    """Runs the script in this process as `python scripts/reconstruct.py output_dir=<out> ...` runs it (as
    ``__main__``, its arguments in sys.argv) and returns its exit status: a subprocess would pay the imports and
    Hydra's start-up, several seconds, for each run. Hydra re-raises a failure instead of exiting with 1 under a
    debugger or a tracer (coverage) and with HYDRA_FULL_ERROR set: neither here. Logging is left as pytest has it;
    the environment variables, Hydra's config, torch's thread count and the random state that the run sets are
    restored."""
    import runpy

    import hydra._internal.utils as hydra_utils
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)  # the run sets it: put back after
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal's width
    monkeypatch.setattr(hydra_utils, "is_under_debugger", lambda: False)
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # set by seed_everything: unset again afterwards
        monkeypatch.setenv(name, "0")
    script = ROOT / "scripts" / "reconstruct.py"
    monkeypatch.setattr(sys, "argv", [str(script), f"output_dir={out}", "hydra/job_logging=none",
                                      "hydra/hydra_logging=none", *overrides])
    monkeypatch.chdir(out.parent)
    threads = torch.get_num_threads()  # a script may set its own count
    with torch.random.fork_rng(devices=[]):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:
            return 0 if e.code is None else e.code if isinstance(e.code, int) else 1  # as the interpreter exits
        finally:
            torch.set_num_threads(threads)
    return 0


class Links(html.parser.HTMLParser):
    def __init__(self, page: str):
        super().__init__()
        self.rows, self.refs = 0, []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.rows += tag == "tr"
        self.refs += [v for k, v in attrs if k in ("src", "href")]


def summary(out: Path) -> dict:
    return {r["name"]: r for r in json.loads((out / "summary.json").read_text())["scenes"]}


@pytest.mark.slow
def test_synthetic_default_outputs_reopen_and_a_second_run_resumes(tmp_path):
    out = tmp_path / "run"
    r = reconstruct(tmp_path, out, *SMALL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / ".hydra" / "config.yaml").is_file()  # output_dir is Hydra's run folder
    for name in SCENES:
        cube = load_cube(out / "reconstructions" / f"{name}.tif")
        assert cube.data.shape == (28, 32, 40) and cube.wavelengths == list(TSA_WAVELENGTHS)
        assert cube.meta["step"] == 2 and cube.meta["axis"] == "w"
        for suffix in ("", "_bands", "_spectra", "_compare"):  # preview, mosaic, spectra, truth|recon|error
            Image.open(out / "previews" / f"{name}{suffix}.png").load()
    rows = summary(out)
    assert sorted(rows) == SCENES
    for row in rows.values():
        assert row["status"] == "reconstructed" and row["psnr"] > 10 and 0 < row["residual"] < 1
        assert row["iterations"] == 5 and row["time"] > 0
    assert (out / "summary.csv").read_text().splitlines()[0].startswith("name,psnr,psnr_table,ssim,ssim_table,sam,residual,time")
    page = (out / "index.html").read_text()
    links = Links(page)
    assert links.rows >= 1 + len(SCENES) and all(n in page for n in SCENES) and "residual" in page
    assert links.refs and all(not ref.startswith(("http", "/")) and (out / ref).is_file() for ref in links.refs)
    assert {f"previews/{n}.png" for n in SCENES} <= set(links.refs)
    assert {f"previews/{n}_spectra.png" for n in SCENES} <= set(links.refs)

    outputs = [*out.glob("reconstructions/*.tif"), *out.glob("previews/*.png")]
    assert len(outputs) == 2 * 5
    mtimes = {p: p.stat().st_mtime_ns for p in outputs}
    r = reconstruct(tmp_path, out, *SMALL)  # again: nothing to do
    assert r.returncode == 0 and "(2 complete from an earlier run, kept)" in r.stdout
    assert {p: p.stat().st_mtime_ns for p in outputs} == mtimes
    assert {n: row["status"] for n, row in summary(out).items()} == dict.fromkeys(SCENES, "complete: kept")
    assert summary(out)[SCENES[0]]["psnr"] == rows[SCENES[0]]["psnr"]  # the kept row comes from the first run
    cubes = {p: t for p, t in mtimes.items() if p.suffix == ".tif"}
    r = reconstruct(tmp_path, out, *SMALL, "overwrite=true", "preview=false", "wavelengths=null")
    assert r.returncode == 0
    assert all(p.stat().st_mtime_ns != t for p, t in cubes.items())  # recomputed: new cubes ...
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items() if p not in cubes)  # ... and no pictures
    assert {n: row["status"] for n, row in summary(out).items()} == dict.fromkeys(SCENES, "reconstructed")
    assert load_cube(out / "reconstructions" / f"{SCENES[0]}.tif").wavelengths is None


def test_real_measurement_and_bad_files_in_one_folder(tmp_path, shared_data):
    """A cropped real TSA measurement (tiled), a corrupt file, one of the wrong size, a 1.4 KB compressed HDF5
    file declaring a 200000×200000 float32 measurement (149 GiB once read; the job runs under a 16 GiB
    address-space limit) and one whose data hold a NaN: the good scene is written, each bad file gets one line
    at the end and in the summary, and the exit status is 3."""
    inputs = tmp_path / "in"
    y = load_measurement(shared_data / "real" / "tsa_real_scene3.mat").data
    mask = load_mask(shared_data / "masks" / "tsa_real_mask_660.mat")
    rows, cols = slice(300, 340), slice(250, 450)  # 40×200 pixels: y is 40×(200 + 27·2)
    save_measurement(inputs / "scene3_crop.mat", y[:, rows, cols.start:cols.stop + 54])
    save_measurement(inputs / "too_wide.mat", y[:, rows, cols.start:cols.stop + 60])
    (inputs / "broken.mat").write_bytes(b"MATLAB 5.0 MAT-file, truncated")
    with h5py.File(inputs / "huge.h5", "w") as f:  # refused from its header, before any data are read
        f.create_dataset("x", shape=(200_000, 200_000), dtype="f4", compression="gzip", chunks=(500, 500))
    nan = y[:, rows, cols.start:cols.stop + 54].clone()
    nan[0, 5, 5] = float("nan")
    save_measurement(inputs / "with_nan.mat", nan)  # passes the header checks: fails when its data are read
    save_mask(tmp_path / "mask.mat", mask[rows, cols])
    out = tmp_path / "run"
    r = reconstruct(tmp_path, out, "data=measurements", f"data.predict.entries={inputs}",
                    f"data.predict.mask={tmp_path / 'mask.mat'}", "solver=gap_tv_real", "solver.iters=10",
                    "tile.size=160", "tile.overlap=16", *FAST, address_space=16 * 2**30)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    cube = load_cube(out / "reconstructions" / "scene3_crop.tif")
    assert cube.data.shape == (28, 40, 200) and cube.wavelengths == list(TSA_WAVELENGTHS)
    for suffix in ("", "_bands", "_spectra"):
        Image.open(out / "previews" / f"scene3_crop{suffix}.png").load()
    assert not (out / "previews" / "scene3_crop_compare.png").exists()  # no ground truth
    last = r.stdout.strip().splitlines()[-4:]  # those refused from their headers, then those that failed later
    assert last[0].startswith(f"FAILED broken: {inputs / 'broken.mat'}: cannot read MATLAB file")
    assert last[1] == (f"FAILED huge: {inputs / 'huge.h5'}: measurement of size 200000×200000 does not fit a 40×200 "
                       "mask with 28 bands dispersed by 54 px along 'w': expected 40×254")
    assert last[2].startswith(f"FAILED too_wide: {inputs / 'too_wide.mat'}: measurement of size 40×260 does not")
    assert last[2].endswith("it would fit step=2.22222 with 28 bands or bands=31 with step 2")
    assert last[3] == f"FAILED with_nan: {inputs / 'with_nan.mat'}: measurement contains 1 NaN/Inf values"
    assert r.stdout.count("FAILED ") == 4
    rows = summary(out)
    assert rows["scene3_crop"]["status"] == "reconstructed" and 0 < rows["scene3_crop"]["residual"] < 1
    assert {rows[n]["status"] for n in ("broken", "huge", "too_wide", "with_nan")} == {"failed"}
    assert "Tiled(" in (out / "summary.md").read_text().splitlines()[0]
    assert "cannot read MATLAB file" in (out / "index.html").read_text()


def test_exit_status_tells_failed_inputs_from_a_failed_run(tmp_path, monkeypatch, capsys):
    """The README's exit status, on files made here: 3 when some inputs failed (the others are written, one
    `FAILED <name>: <reason>` line each), 1 when the run itself failed (the same inputs, a mask file that does not
    exist: nothing reconstructed). (0: test_synthetic_default_outputs_reopen_and_a_second_run_resumes)"""
    mask = (torch.rand(16, 16, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    save_mask(tmp_path / "mask.npy", mask)
    inputs = tmp_path / "in"
    save_measurement(inputs / "good.npy", torch.rand(1, 16, 16 + 54, generator=torch.Generator().manual_seed(1)))
    (inputs / "broken.npy").write_bytes(b"\x93NUMPY truncated")

    def run(out: str, entries: Path, mask: Path) -> tuple[int, str, str]:
        status = reconstruct_here(monkeypatch, tmp_path / out, "data=measurements", f"data.predict.entries={entries}",
                                  f"data.predict.mask={mask}", *FAST, "solver=pinv", "preview=false")
        said = capsys.readouterr()
        return status, said.out, said.err

    status, out, err = run("some", inputs, tmp_path / "mask.npy")
    assert status == 3, out[-3000:] + err[-3000:]
    assert out.count("FAILED ") == 1
    assert out.strip().splitlines()[-1].startswith(f"FAILED broken: {inputs / 'broken.npy'}: ")
    rows = summary(tmp_path / "some")
    assert {n: r["status"] for n, r in rows.items()} == {"good": "reconstructed", "broken": "failed"}
    assert (tmp_path / "some" / "reconstructions" / "good.tif").is_file()

    status, out, err = run("none", inputs, tmp_path / "none.npy")
    assert status == 1 and "none.npy" in err and "FAILED" not in out, out[-3000:] + err[-3000:]
    assert not (tmp_path / "none" / "reconstructions").exists()
