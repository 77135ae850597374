"""The dashboard's readers: tile bounds from the geometry and from the quadkey agree; a report
written with the old metric names still loads and shows under the new ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from apptest_helpers import AppFactory, open_tab
from synthetic_run import write_old_metric_keys

from app import loaders
from app.loaders import _tile_bounds


def test_quadkey_bounds_match_the_geometry(tiny_run: Path) -> None:
    frame = pq.read_table(tiny_run / "tiles.parquet").to_pandas().head(500)
    geometry = frame.pop("geometry")
    from_geometry = _tile_bounds(frame, geometry)
    from_quadkey = _tile_bounds(frame, None)
    np.testing.assert_allclose(from_quadkey.to_numpy(), from_geometry.to_numpy(), atol=1e-9)
    assert (from_quadkey["east"] > from_quadkey["west"]).all()
    assert (from_quadkey["north"] > from_quadkey["south"]).all()


def test_an_old_style_report_loads_and_shows_under_the_new_names(
    make_app: AppFactory, time_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    run = shutil.copytree(time_root / "timed", root / "old")
    write_old_metric_keys(run)
    path = run / "report" / "download" / "metrics.json"
    raw = json.loads(path.read_text())
    assert {"coverage", "pi_width", "coverage_std"} <= set(raw["all"])
    assert not {"coverage95", "width95"} & set(raw["all"])

    loaded = loaders.load_metrics(str(path), loaders.stamp(path))
    assert loaded["all"]["coverage95"] == raw["all"]["coverage"]
    assert loaded["all"]["width95"] == raw["all"]["pi_width"]
    assert loaded["all"]["coverage95_std"] == raw["all"]["coverage_std"]
    first = loaded["by_quarter"]["2023Q1"]
    assert first["urban"]["coverage95"] == raw["by_quarter"]["2023Q1"]["urban"]["coverage"]
    assert not {"coverage", "pi_width"} & set(first)
    summary = run / "report" / "download" / "summary.json"
    curve = loaders.load_metrics(str(summary), loaders.stamp(summary))["reliability"]["all"]
    assert "coverage" in curve  # a reliability curve, not a metric: left alone

    at = make_app(root, "old")
    at.run()
    assert not at.exception
    frames = [d.value for d in open_tab(at, "Coverage report").dataframe]
    table = next(f for f in frames if "CRPS" in f.columns)
    # the tab shows fractions as percentages
    assert table["95% coverage"].tolist() == pytest.approx([100.0 * raw["all"]["coverage"]] * 3)
    assert table["mean 95% PI width"].tolist() == pytest.approx([raw["all"]["pi_width"]] * 3)
    quarters = next(f for f in frames if "quarter" in f.columns)
    expected = [100.0 * raw["by_quarter"][q]["coverage"] for q in quarters["quarter"]]
    assert quarters["95% coverage"].tolist() == pytest.approx(expected)
    baseline = next(f for f in frames if "model" in f.columns)
    assert not baseline["95% coverage"].isna().any()
