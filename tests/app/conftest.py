"""Fixtures for the dashboard tests: run folders for AppTest (demo, synthetic, broken, policy)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[2]
APP_FILE = str(REPO / "app" / "streamlit_app.py")
# `app` is a top-level package of the repository; make sure it (not the `tests/app` folder) is
# what `import app` finds, also when pytest is started without the repository on sys.path.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(autouse=True)
def _restore_main_module() -> Iterator[None]:
    """Put ``sys.modules["__main__"]`` back after each test: AppTest runs its script as
    ``__main__`` and leaves it there, and a later ``multiprocessing`` spawn (the benchmark's
    worker, the DDP tests) would re-run that temporary script in its children."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder with a complete synthetic run ``synth`` (tiny real model, download only)."""
    import synthetic_run

    root = tmp_path_factory.mktemp("app_runs")
    synthetic_run.build(root / "synth")
    return root


@pytest.fixture(scope="session")
def time_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder with ``timed``: a time-aware model (inputs x1, x2, t; trained on
    2023Q1–2023Q3), grids of 2023Q4 (``download.nc``, an extrapolation) and 2023Q2, a trend
    grid 2023Q1 → 2023Q4 and ``by_quarter`` metrics (see ``synthetic_run.build_time_aware``)."""
    import synthetic_run

    root = tmp_path_factory.mktemp("time_runs")
    synthetic_run.build_time_aware(root / "timed")
    return root


@pytest.fixture(scope="session")
def broken_root(tmp_path_factory: pytest.TempPathFactory, synthetic_root: Path) -> Path:
    """A runs folder with broken runs: ``partial`` (tiles only), ``corrupt`` (garbage files),
    ``empty`` (an empty directory), ``nomodel`` (grid and report but no model) and
    ``badoverlay`` (complete, but a truncated ``urban_areas.geojson``)."""
    root = tmp_path_factory.mktemp("broken_runs")
    src = synthetic_root / "synth"
    partial = root / "partial"
    partial.mkdir()
    for name in ("tiles.parquet", "region.geojson"):
        shutil.copy(src / name, partial / name)
    corrupt = shutil.copytree(src, root / "corrupt")
    (corrupt / "grids" / "download.nc").write_bytes(b"not a netcdf file")
    (corrupt / "report" / "download" / "metrics.json").write_text("{not json")
    (corrupt / "models" / "download" / "model.json").write_text("[1, 2")
    (corrupt / "models" / "download" / "history.csv").write_text('"unterminated\n')
    (corrupt / "urban_areas.geojson").write_text("<html>")
    (root / "empty").mkdir()
    bad_overlay = shutil.copytree(src, root / "badoverlay")
    (bad_overlay / "urban_areas.geojson").write_text('{"type": "FeatureCollection", "feat')
    nomodel = shutil.copytree(src, root / "nomodel")
    shutil.rmtree(nomodel / "models")
    return root


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> Callable[..., AppTest]:
    """Build an AppTest of the dashboard for a runs folder (and optionally a run to open)."""

    def build(root: Path, run: str | None = None) -> AppTest:
        monkeypatch.setenv("GEODBK_RUNS_DIR", str(root))
        monkeypatch.setenv("GEODBK_APP_WARMUP", "0")  # deterministic: no background threads
        # The full map at once (the progressive first paint is tested on its own).
        monkeypatch.setenv("GEODBK_APP_REFINE_S", "0")
        if run is None:
            monkeypatch.delenv("GEODBK_RUN", raising=False)
        else:
            monkeypatch.setenv("GEODBK_RUN", run)
        monkeypatch.setattr("sys.argv", ["streamlit_app.py"])
        return AppTest.from_file(APP_FILE, default_timeout=120)

    return build


@pytest.fixture(scope="session")
def demo_root(tiny_run: Path) -> tuple[Path, str]:
    """The pipelines' quick demo run as (runs folder, run name)."""
    return tiny_run.parent, tiny_run.name


@pytest.fixture(scope="session")
def policy_root(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder with ``policy``: the demo run (with its ``geodbk service`` outputs) and
    ``geodbk summarize`` of three districts (``districts.geojson`` beside it). Read-only."""
    import geopandas as gpd
    import shapely

    from pipelines import cli

    root = tmp_path_factory.mktemp("policy_runs")
    run = shutil.copytree(tiny_run, root / "policy")
    w, s, e, n = gpd.read_file(run / "region.geojson").total_bounds
    xm, ym = (w + e) / 2, (s + n) / 2
    boxes = [shapely.box(w, s, xm, ym), shapely.box(xm, s, e, ym), shapely.box(w, ym, e, n)]
    areas = root / "districts.geojson"
    gpd.GeoDataFrame({"GEOID": ["01", "02", "03"]}, geometry=boxes, crs=4326).to_file(areas)
    assert (run / "service" / "headline.json").is_file()  # the demo ran geodbk service
    argv = ["summarize", "--run", str(run), "--target", "download", "--areas", str(areas)]
    assert cli.main([*argv, "--samples", "50"]) == 0
    return root
