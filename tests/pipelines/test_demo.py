"""The quick demo run (``tiny_run`` fixture) holds every file the dashboard reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import xarray as xr

from geodbk import DBKRegressor
from geodbk.geo.contract import TARGETS
from geodbk.geo.table import read_tile_table
from pipelines.rundir import model_inputs


def test_run_directory_is_complete(tiny_run: Path) -> None:
    for name in ("tiles.parquet", "region.geojson", "ingest_report.json", "demo_timings.json"):
        assert (tiny_run / name).is_file(), name
    for t in TARGETS:
        for rel in (
            f"models/{t}/model.json",
            f"models/{t}/weights.safetensors",
            f"models/{t}/config.yaml",
            f"models/{t}/history.csv",
            f"grids/{t}.nc",
            f"exports/{t}.tif",
            f"exports/{t}.json",
            f"report/{t}/predictions.parquet",
            f"report/{t}/metrics.json",
            f"report/{t}/summary.json",
            f"report/{t}/report.md",
            f"report/{t}/report.html",
            f"report/{t}/figures/reliability.png",
            f"summaries/{t}_synthetic_counties.parquet",
            f"summaries/{t}_synthetic_counties.csv",
        ):
            assert (tiny_run / rel).is_file(), rel
    for rel in ("classes.nc", "copula.json", "service_class.tif", "p_unserved.tif"):
        assert (tiny_run / "service" / rel).is_file(), rel


def test_demo_summarises_every_county(tiny_run: Path) -> None:
    import geopandas as gpd

    from pipelines.demo import demo_counties

    counties = gpd.read_file(demo_counties())
    for t in TARGETS:
        summary = gpd.read_parquet(tiny_run / f"summaries/{t}_synthetic_counties.parquet")
        assert sorted(summary["id"]) == sorted(counties["GEOID"])
        covered = summary["n_cells"] > 0
        assert covered.sum() >= 4  # the counties hold the tiles' extent, not only the margins
        inside = summary.loc[covered]
        assert (inside["lower_natural"] <= inside["mean_natural"]).all()
        assert (inside["mean_natural"] <= inside["upper_natural"]).all()


@pytest.mark.parametrize(
    ("target", "names"),
    [
        ("download", ["p_below_25mbps", "p_below_100mbps"]),
        ("upload", ["p_below_3mbps", "p_below_20mbps"]),
        ("latency", ["p_above_100ms"]),
    ],
)
def test_grids_have_thresholds_and_units(tiny_run: Path, target: str, names: list[str]) -> None:
    with xr.open_dataset(tiny_run / "grids" / f"{target}.nc") as ds:
        for n in names:
            assert n in ds
            v = ds[n].values
            assert (v[~ds["in_region"].values] != v[~ds["in_region"].values]).all()
        assert ds.attrs["natural_units"] == ("ms" if target == "latency" else "Mbps")
        assert 0 < ds.sizes["x"] * ds.sizes["y"] <= 2_600


def test_models_load_and_predict_tiles(tiny_run: Path) -> None:
    table, _ = read_tile_table(tiny_run / "tiles.parquet")
    model = DBKRegressor.load(tiny_run / "models" / "download")
    # the demo trains time-aware models: inputs x1, x2 and the quarter's t
    assert model.metadata_["inputs"] == ["x1", "x2", "t"]
    X = model_inputs(
        table[["x1", "x2"]].to_numpy()[:10],
        model.metadata_,
        quarter=table["quarter"].astype(str).to_numpy()[:10],
    )
    pred = model.predict_dist(X)
    assert pred.mean.shape == (10,)
    metrics = json.loads((tiny_run / "report" / "download" / "metrics.json").read_text())
    assert metrics["all"]["n"] == int((table["split"] == "test").sum())


def test_demo_ends_with_the_command_that_opens_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`geodbk demo --run OTHER` names `geodbk dashboard --run OTHER`, not the default run's
    `geodbk dashboard` (the stages are stubbed: only the closing line is under test)."""
    from pipelines import demo
    from pipelines.config import TrainConfig

    stages = ("run_ingest", "run_train", "run_predict", "run_export", "run_summarize")
    for stage in (*stages, "run_predict_at", "write_demo_places"):
        monkeypatch.setattr(demo, stage, lambda *a, **k: None)
    monkeypatch.setattr(demo, "run_report", lambda *a, **k: None)
    run = tmp_path / "other runs" / "quick"
    run.mkdir(parents=True)
    caplog.set_level("INFO", logger="geodbk")
    demo.run_demo(run, targets=("download",), config=TrainConfig(epochs=1))
    ready = [r.getMessage() for r in caplog.records if "demo run ready" in r.getMessage()]
    assert len(ready) == 1
    assert ready[0].endswith(f"next: geodbk dashboard --run '{run}'")
    # that command opens this run: its folder becomes the runs folder
    from pipelines import dashboard

    launched: list[list[str]] = []

    class FakeServer:
        def __init__(self, cmd: list[str]) -> None:
            launched.append(cmd)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(dashboard.subprocess, "Popen", FakeServer)
    (run / "tiles.parquet").write_bytes(b"")
    assert dashboard.run_dashboard(run=str(run)) == 0
    (cmd,) = launched
    assert cmd[cmd.index("--runs-dir") + 1] == str(run.parent.resolve())
    assert cmd[cmd.index("--run") + 1] == "quick"


def test_the_demo_run_has_predictions_and_classes_at_its_places(tiny_run: Path) -> None:
    """The demo draws its places in the region and predicts every target and the service
    classes there (``predict --at``, ``service --at``), every place inside the region."""
    places = pd.read_csv(tiny_run / "places" / "demo_locations.csv")
    assert list(places.columns) == ["location_id", "lon", "lat"] and len(places) == 40
    assert places["location_id"].is_unique and not places.duplicated(["lon", "lat"]).any()
    for target in ("download", "upload", "latency"):
        out = pd.read_parquet(tiny_run / "predictions" / f"{target}_demo_locations.parquet")
        assert list(out["location_id"]) == list(places["location_id"])
        assert not out["outside_region"].any() and out["median"].notna().all()
    classes = pd.read_parquet(tiny_run / "service" / "classes_demo_locations.parquet")
    assert classes["service_class"].notna().all()
