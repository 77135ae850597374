"""``geodbk demo``: ingest -> train -> predict -> service -> summarize -> report -> export -> places.

Builds a complete run directory from the embedded synthetic Ookla-style region in ``data/``
(the ingest call is :data:`pipelines.ingest.DEMO_INGEST`), training all three targets with
small-but-real settings (:func:`pipelines.config.demo_config`: DBK-RBF dPPGP, r=256, h=64,
batch 256, lr 3e-3, up to 60 epochs, patience 10, CPU) so that the dashboard has something real to show
in a few minutes on a laptop CPU. The grid uses the default resolution (zoom-16 tiles, at most
1,000,000 cells). With all three targets trained it writes the service classes; each target
is summarised over the synthetic counties (``data/census/synthetic_counties.geojson``), and
predicted (``predict --at``, ``service --at``) at 300 places drawn in the region
(:func:`write_demo_places`, a stand-in for a list of serviceable locations).

``quick=True`` (tests) uses r=32, h=16, 3 epochs and a grid capped at 2,500 cells.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from geodbk.atomic import atomic_path, atomic_write_json
from geodbk.errors import DataError
from geodbk.geo.contract import TARGETS
from geodbk.geo.table import read_table_metadata
from geodbk.geo.timeaxis import quarter_index
from pipelines.cli import stage_parser
from pipelines.config import TrainConfig, check_epochs_flag, demo_config
from pipelines.export import run_export
from pipelines.ingest import DEMO_INGEST, run_ingest
from pipelines.predict import run_predict
from pipelines.predict_at import run_predict_at
from pipelines.report import run_report
from pipelines.run_inputs import read_region
from pipelines.rundir import RunDir
from pipelines.service import run_service
from pipelines.summarize import run_summarize
from pipelines.train import run_train

log = logging.getLogger("geodbk")

#: Repository root (``data/`` lives there).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: What ``geodbk demo --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Run every stage on the embedded synthetic region: ingest, train, predict, service classes,
county summaries, report, export and predictions at a list of places.

Builds a complete run directory (default runs/demo) from the synthetic Ookla-style region in
data/, training download, upload and latency with small but real settings (DBK-RBF, rank 256,
hidden 64, up to 60 epochs with early stopping, CPU), so that the dashboard has something real
to show within minutes on a laptop. The counties of the summaries are
data/census/synthetic_counties.geojson; the places, 300 points drawn in the region as a
stand-in for a list of serviceable locations, are RUN/places/demo_locations.csv. --quick
uses tiny settings (seconds) for smoke tests.
"""

EPILOG = """\
examples:
  geodbk demo                       # writes runs/demo
  geodbk demo --run /tmp/demo --epochs 10
  geodbk demo --quick               # tiny settings (seconds), for smoke tests

then: geodbk dashboard --run RUN   (opens the demo run; plain `geodbk dashboard` opens runs/demo)
exit codes: 0 ok, 3 bad data (data/ missing), 5 run directory problem.
"""


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    p = stage_parser(
        subparsers,
        "demo",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="run directory")
    p.add_argument("--epochs", type=int, default=None, help="override the demo's 60 epochs")
    p.add_argument("--quick", action="store_true", help="tiny settings for smoke tests")
    p.add_argument(
        "--format", choices=["gtiff", "cog"], default="cog", help="export format (default cog)"
    )


def _main(args: argparse.Namespace) -> int:
    run_demo(args.run, epochs=args.epochs, quick=args.quick, fmt=args.format)
    return 0


def _ingest_kwargs() -> dict[str, Any]:

    kwargs = dict(DEMO_INGEST)
    for key in ("states_file", "urban_areas", "region", "tracts", "rural_tracts"):
        if kwargs.get(key):
            kwargs[key] = REPO_ROOT / kwargs[key]
    kwargs["tiles"] = [REPO_ROOT / t for t in kwargs["tiles"]]
    for t in kwargs["tiles"]:
        if not Path(t).exists():
            raise DataError(
                f"demo data {t} not found; the demo needs the repository's data/ folder"
            )
    return kwargs


#: The synthetic region's counties, the areas the demo summarises each target over.
DEMO_COUNTIES = Path("data/census/synthetic_counties.geojson")


def demo_counties() -> Path:
    """Absolute path of the synthetic counties file; DataError when data/ lacks it."""
    path = REPO_ROOT / DEMO_COUNTIES
    if not path.is_file():
        raise DataError(f"demo data {path} not found; the demo needs the repository's data/ folder")
    return path


#: Where the demo writes its list of places (``geodbk predict --at``'s input), in the run.
DEMO_PLACES = Path("places") / "demo_locations.csv"


def write_demo_places(run: Path, *, count: int, seed: int = 0) -> Path:
    """Write ``count`` places drawn uniformly in the run's region (``seed``) to
    ``RUN/places/demo_locations.csv`` (``location_id``, ``lon``, ``lat``: a stand-in for a
    list of serviceable locations) and return its path."""
    import geopandas as gpd
    import numpy as np

    area = gpd.GeoSeries([read_region(RunDir(run))], crs=4326)
    drawn = area.sample_points(count, rng=np.random.default_rng(seed))
    xy = np.asarray([(p.x, p.y) for p in drawn.explode(index_parts=False)])
    frame = pd.DataFrame(
        {
            "location_id": [f"LOC{i + 1:04d}" for i in range(len(xy))],
            "lon": xy[:, 0].round(6),
            "lat": xy[:, 1].round(6),
        }
    )
    path = run / DEMO_PLACES
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return path


def _table_quarters(run: Path) -> list[str]:
    """The quarters of the run's tile table (from its metadata), oldest first."""

    quarters = read_table_metadata(run / "tiles.parquet").get("quarters") or []
    return sorted((str(q) for q in quarters), key=quarter_index)


def run_demo(
    run: str | Path = Path("runs/demo"),
    *,
    epochs: int | None = None,
    quick: bool = False,
    targets: Sequence[str] = tuple(TARGETS),
    fmt: str = "cog",
    config: TrainConfig | None = None,
    progress: bool = True,
) -> Path:
    """Run every stage into ``run`` and return it.

    Parameters
    ----------
    run
        Run directory (created; existing stage outputs are replaced).
    epochs
        Override the demo's maximum epochs.
    quick
        Tiny variant for tests (few epochs, small rank, coarse grid).
    targets
        Targets to train (default all three).
    fmt
        Export format (``cog`` or ``gtiff``).
    config
        Training config (default :func:`pipelines.config.demo_config` with ``time: true``:
        the embedded region's speeds improve every quarter, and the dashboard's quarter slider
        and trend layers need a time-aware model).
    progress
        Progress bars during training.
    """

    run = Path(run)
    check_epochs_flag(epochs)
    cfg = (config or demo_config(quick=quick).replace(time=True)).replace(epochs=epochs)
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        timings[name] = round(time.perf_counter() - t0, 2)
        log.info("demo: %s done in %.1f s", name, timings[name])
        return out

    cells = 2_500 if quick else 1_000_000
    t_all = time.perf_counter()
    timed("ingest", run_ingest, run=run, **_ingest_kwargs())
    for target in targets:
        timed(f"train_{target}", run_train, run, target=target, config=cfg, progress=progress)
        # a time-aware model: every quarter's map (the latest is grids/TARGET.nc) and the trend
        every = "all" if cfg.time else None
        timed(f"predict_{target}", run_predict, run, target=target, quarter=every, max_cells=cells)
        if cfg.time:
            quarters = _table_quarters(run)
            if len(quarters) > 1:
                timed(
                    f"trend_{target}",
                    run_predict,
                    run,
                    target=target,
                    trend=f"{quarters[0]}:{quarters[-1]}",
                    max_cells=cells,
                )
    if set(targets) >= set(TARGETS):
        timed(
            "service",
            run_service,
            run,
            fmt=fmt,
            max_cells=cells,
            headline_samples=100 if quick else 500,
        )
    for target in targets:
        timed(
            f"summarize_{target}",
            run_summarize,
            run,
            target=target,
            areas=demo_counties(),
            id_column="GEOID",
            samples=200 if quick else 1000,
            max_cells=cells,
        )
    for target in targets:
        timed(f"report_{target}", run_report, run, target=target)
    # after the reports: each tile map's export and predictions at places carry its report's
    # held-out check
    timed("export", run_export, run, fmt=fmt)
    places = write_demo_places(run, count=40 if quick else 300)
    for target in targets:
        timed(f"predict_at_{target}", run_predict_at, run, places, target=target)
    if set(targets) >= set(TARGETS):
        timed("service_at", run_service, run, at=places, progress=progress)
    timings["total"] = round(time.perf_counter() - t_all, 2)
    atomic_write_json(
        run / "demo_timings.json", {"config": cfg.to_dict(), "quick": quick, "seconds": timings}
    )
    log.info("demo run ready in %s (%.0f s); next: %s", run, timings["total"], dashboard_hint(run))
    return run


def dashboard_hint(run: Path) -> str:
    """The command that opens ``run`` in the dashboard: ``geodbk dashboard --run PATH`` (a run
    directory's path makes its folder the runs folder, wherever it is)."""
    return f"geodbk dashboard --run {shlex.quote(str(run))}"
