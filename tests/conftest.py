from pathlib import Path

import pytest

REAL_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "real_traces"


@pytest.fixture(scope="session")
def real_traces() -> Path:
    if not REAL_TRACES.is_dir():
        pytest.fail(f"real traces not found at {REAL_TRACES}: the repo must sit beside shared/")
    return REAL_TRACES
