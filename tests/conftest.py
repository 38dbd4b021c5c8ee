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
