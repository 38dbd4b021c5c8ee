"""Shared fixtures: where the real test data live (../shared/data beside the project)."""
import os
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
