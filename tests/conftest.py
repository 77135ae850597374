"""Shared pytest configuration: thread limits, marker-based skips, shared data paths."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

# The reference machine has 2 cores; keep torch to them (set before torch is imported anywhere).
# Under pytest -n (make test: one worker per core) each worker takes one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")
# No network check for the dashboard's base map in tests (app/basemap.py).
os.environ.setdefault("GEODBK_BASEMAP", "off")

import torch

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
HAWAII = SHARED_DATA / "hawaii"


#: The dashboard's tests need streamlit, which `make install-dev` installs; a GPU machine that
#: carries only the model's dependencies collects the rest of the suite (``pytest -m gpu tests``).
def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAVE_STREAMLIT = _installed("streamlit")
collect_ignore = [] if HAVE_STREAMLIT else ["app", "robustness/test_app_escaping.py"]


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when the dashboard's tests were left out, so that a missing install is seen."""
    return None if HAVE_STREAMLIT else "streamlit is not installed: tests/app not collected"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip marked tests whose requirement is absent, with the reason in the report."""
    skip_real = pytest.mark.skip(reason=f"real data not found at {HAWAII}")
    skip_gpu = pytest.mark.skip(reason="CUDA is not available")
    skip_browser = pytest.mark.skip(reason="headless Chromium (Debian 'chromium') not installed")
    have_browser = shutil.which("chromium") is not None or shutil.which("chromium-browser")
    for item in items:
        if "realdata" in item.keywords and not HAWAII.is_dir():
            item.add_marker(skip_real)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "browser" in item.keywords and not have_browser:
            item.add_marker(skip_browser)


@pytest.fixture(scope="session")
def hawaii_dir() -> Path:
    """Path to ``../shared/data/hawaii`` (tests using it carry the ``realdata`` marker)."""
    return HAWAII


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete quick demo run directory (every stage, all targets), built once per session.

    Built by ``pipelines.demo.run_demo(..., quick=True)`` on the synthetic region in ``data/``:
    ``tiles.parquet``, ``region.geojson``, ``models/*``, ``grids/*.nc``, ``exports/*.tif``,
    ``report/*``. Treat it as read-only (copy it before modifying).
    """
    from pipelines.demo import run_demo

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return run_demo(tmp_path_factory.mktemp("tiny_run") / "run", quick=True, progress=False)
    # pytest -n: the workers share one build (the first builds it, the others wait for it)
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "tiny_run"
    with FileLock(str(shared) + ".lock"):
        if not (shared / "built").is_file():
            run_demo(shared / "run", quick=True, progress=False)
            (shared / "built").touch()
    return shared / "run"
