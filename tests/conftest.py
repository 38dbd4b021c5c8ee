"""Shared fixtures: where the real test data live (../shared/data beside the project); a memory guard."""
import contextlib
import os

# pytest-xdist's workers share the cores: each takes its share (cassi.threads), and so do the scripts they start
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit():
    os.environ.setdefault("CASSI_JOBS", os.environ["PYTEST_XDIST_WORKER_COUNT"])
import re
import resource
import time
import tracemalloc
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data; skips the test when absent (fails instead when $CI is set)."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"shared test data missing in CI: {SHARED_DATA}")
        pytest.skip(f"shared test data not found at {SHARED_DATA}")
    return SHARED_DATA



ROOT = Path(__file__).resolve().parents[1]


def _runs() -> set[Path]:
    """Hydra run folders (holding .hydra/) under the repository's outputs/ and multirun/, and Lightning's
    default log folders (lightning_logs/version_*)."""
    hydra = {p.parent for top in ("outputs", "multirun") for p in (ROOT / top).rglob(".hydra")}
    return hydra | set((ROOT / "lightning_logs").glob("version_*"))


@pytest.fixture(scope="session", autouse=True)
def nothing_written_into_the_repository(tmp_path_factory):
    """Fails the session when its tests left a run folder in the repository: every script test must write
    under pytest's temporary directory. Other people may run scripts in the same checkout meanwhile, so a
    new Hydra run folder counts as this session's when its recorded overrides mention this session's
    temporary directory, as every test's do."""
    before = _runs()
    yield
    base = str(tmp_path_factory.getbasetemp())

    def ours(run: Path) -> bool:
        overrides = run / ".hydra" / "overrides.yaml"
        return not overrides.parent.is_dir() or (overrides.is_file() and base in overrides.read_text(errors="replace"))

    new = sorted(str(p.relative_to(ROOT)) for p in _runs() - before if ours(p))
    if new:
        pytest.fail(f"tests wrote into the repository: {new}; run scripts with cwd=tmp_path and "
                    "hydra.run.dir / output_dir under tmp_path")


@contextlib.contextmanager
def _small_memory(extra=2**30):
    """While inside: the address space limited to what the process maps now plus `extra` (Linux), so that a
    huge allocation fails at once with MemoryError instead of taking the machine (the code under test being
    wrong), and tracemalloc tracing (numpy's array buffers included). Yields a dict: "limited" (whether the
    limit is set); on exit "peak" holds the largest traced memory (bytes) and "seconds" the time spent inside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status")
    out = {"limited": status.is_file()}
    if out["limited"]:
        mapped = int(re.search(r"VmSize:\s*(\d+) kB", status.read_text()).group(1)) * 1024
        limit = mapped + extra if hard == resource.RLIM_INFINITY else min(mapped + extra, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - start
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if out["limited"]:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def small_memory():
    """``with small_memory() as used:`` runs its body under an address-space limit (what the process maps now
    plus 1 GiB: a huge allocation fails at once with MemoryError) and tracemalloc; afterwards ``used["peak"]``
    is the largest traced memory in bytes and ``used["seconds"]`` the time taken (see ``_small_memory``)."""
    return _small_memory


def pytest_collection_modifyitems(config, items):
    """Long tests (marked ``slow``) first, so that pytest-xdist's workers start on them together and the short
    ones fill in at the end, instead of one long test running alone at the end. Tests that use a module- or
    class-scoped fixture stay in their module's run, where that fixture is set up once."""
    def movable(item) -> bool:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        return item.get_closest_marker("slow") is not None and all(
            d.scope in ("function", "session") for ds in defs.values() for d in ds)

    items[:] = [i for i in items if movable(i)] + [i for i in items if not movable(i)]


# ----------------------------------------------------------------------------- content beyond CAVE, stood in

def _record(folder: Path, name: str) -> None:
    import json

    (folder / "SOURCE.json").write_text(json.dumps({"source": name, "files": {}}))


@pytest.fixture(scope="session")
def content(tmp_path_factory):
    """A content root with stand-ins: earthlib (an ENVI library of 3 spectra in micrometres), psychtoolbox (two
    sets, one uint16 scaled by 4096), skimage (three colour photographs, one grey texture), mate (three photographs)."""
    import numpy as np
    from PIL import Image
    from scipy.io import savemat

    root = tmp_path_factory.mktemp("content")
    el = root / "earthlib"
    el.mkdir()
    wl_um = np.arange(0.40, 0.80, 0.01)
    values = np.stack([np.full(len(wl_um), 0.2), np.linspace(0.1, 0.9, len(wl_um)), np.full(len(wl_um), 0.6)])
    values.astype("<f4").tofile(el / "spectra.sli")
    (el / "spectra.sli.hdr").write_text(
        "ENVI\nsamples = %d\nlines = 3\nbands = 1\ndata type = 4\nbyte order = 0\n"
        "spectra names = { a , b , c }\nwavelength units = Micrometers\nwavelength = { %s }\n"
        % (len(wl_um), " , ".join(f"{w:.2f}" for w in wl_um)))
    _record(el, "earthlib")
    ptb = root / "psychtoolbox"
    ptb.mkdir()
    for name in ("nickerson", "vrhel", "krinov", "macbeth"):
        savemat(ptb / f"sur_{name}.mat", {f"sur_{name}": np.full((81, 2), 0.5), f"S_{name}": np.array([[380, 5, 81]])})
    savemat(ptb / "sur_koivisto.mat", {"sur_koivisto": np.full((61, 1), 2048, np.uint16),
                                       "S_koivisto": np.array([[400, 5, 61]], np.uint16)})
    _record(ptb, "psychtoolbox")
    g = np.random.default_rng(0)
    sk = root / "skimage"
    sk.mkdir()
    for name in ("astronaut.png", "coffee.png", "chelsea.png"):
        Image.fromarray((g.random((48, 64, 3)) * 255).astype(np.uint8)).save(sk / name)
    Image.fromarray((g.random((40, 40)) * 255).astype(np.uint8)).save(sk / "brick.png")
    _record(sk, "skimage")
    mate = root / "mate"
    mate.mkdir()
    for name in ("Wood.jpg", "LadyBird.jpg", "Garden.jpg"):
        Image.fromarray((g.random((50, 70, 3)) * 255).astype(np.uint8)).save(mate / name)
    _record(mate, "mate")
    return root
