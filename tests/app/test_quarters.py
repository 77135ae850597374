"""Time as an input (issue 10): quarter slider, trend layers, per-quarter calibration, and the
kernel and inspect tabs at the selected quarter of a time-aware model."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from apptest_helpers import AppFactory, assert_clean, element_types, open_tab, tab, texts
from synthetic_run import TIME_QUARTERS

from app import loaders, maps
from app.colormaps import format_value, legend_ticks
from app.context import RunContext
from app.quarters import QuarterGrid, describe_quarter, quarter_key, sort_quarter_grids
from app.runs import inventory, resolve_run

MAP_SLIDER = "quarter_map_download"


def _legends(node: Any) -> list[str]:
    return [m for m in texts(node, "markdown") if "geodbk-legend" in m]


def _deck_json(node: Any) -> str:
    charts = node.get("deck_gl_json_chart")
    assert len(charts) == 1
    return str(charts[0].proto.json)


def _ctx(root: Path, name: str) -> RunContext:
    run = resolve_run(root, name)
    return RunContext(root, inventory(run), "download", True, True)


def _in_region_point(path: Path) -> tuple[float, float]:
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    rows, cols = grid.in_region.nonzero()
    mid = len(rows) // 2
    return float(grid.lon[cols[mid]]), float(grid.lat[rows[mid]])


# ------------------------------------------------------------------------------ pure pieces


def test_quarter_grids_sort_by_attribute_and_keep_the_current_file() -> None:
    grids = [
        QuarterGrid("2023Q4", "extrapolation beyond 2023Q3", Path("a/download.nc"), True),
        QuarterGrid("2021Q1", "observed", Path("a/download_2021Q1.nc"), False),
        QuarterGrid("2023Q4", "observed", Path("a/download_2023Q4.nc"), False),
        QuarterGrid("2022Q3", "observed", Path("a/download_2022Q3.nc"), False),
    ]
    out = sort_quarter_grids(grids)
    assert [g.quarter for g in out] == ["2021Q1", "2022Q3", "2023Q4"]
    assert out[-1].current and out[-1].label == "2023Q4 (extrapolation)"
    assert quarter_key("2020Q1") < quarter_key("2020Q4") < quarter_key("2021Q1")
    assert describe_quarter("pooled 2019Q1:2023Q4", "pooled").startswith("pooled 2019Q1:2023Q4")
    tile = describe_quarter("pooled 2019Q1:2023Q4", "pooled; tile offsets at 2023Q4")
    assert tile == "pooled 2019Q1:2023Q4 (one surface for all quarters; tile offsets at 2023Q4)"
    assert describe_quarter("2023Q2", "observed") == "quarter 2023Q2 (observed)"


def test_trend_scale_is_centred_on_no_change(time_root: Path) -> None:
    path = time_root / "timed" / "grids" / "download_trend_2023Q1_2023Q4.nc"
    grid = loaders.load_trend(str(path), loaders.stamp(path), "download")
    scale = maps.trend_scale(grid, "trend_change")
    assert scale.log and math.isclose(scale.vmin * scale.vmax, 1.0, rel_tol=1e-9)
    inside = grid.in_region
    change = grid.arrays["change_per_year"][inside]
    assert scale.vmax == pytest.approx(10 ** np.quantile(np.abs(change), 0.98))
    ratio = maps.trend_values(grid, "trend_change")
    assert np.allclose(ratio[inside], 10**change, rtol=1e-5)
    # Blue (the high end of coolwarm_r) is an improvement: ratio > 1 for speeds ...
    assert scale.cmap == "coolwarm_r" and scale.normalise(np.array([1.0]))[0] == pytest.approx(0.5)
    legend = maps.trend_legend(grid, "trend_change", scale)
    positions = [p for p, _ in legend_ticks(legend)]
    values = [v for _, v in legend_ticks(legend)]
    assert 1.0 in [round(v, 12) for v in values] and positions[len(positions) // 2] == 0.5
    assert legend.unit == "× per year" and "2023Q1 → 2023Q4" in legend.title
    # ... and a ratio < 1 for latency (the colour map is flipped).
    latency = loaders.Grid("latency", grid.lon, grid.lat, grid.arrays, grid.attrs, grid.primary)
    assert maps.trend_scale(latency, "trend_change").cmap == "coolwarm"


# ------------------------------------------------------------------------------ pooled runs


def test_a_run_without_quarter_grids_is_unchanged(
    make_app: AppFactory, synthetic_root: Path
) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    assert_clean(at)
    map_tab = tab(at, "Map")
    assert not map_tab.get("select_slider")
    assert not any("trend" in o for o in at.selectbox(key="layer").options)
    assert element_types(map_tab)["deck_gl_json_chart"] == 1
    # An old grid (no quarter attribute) of a pooled model: the tile table's quarter range.
    assert any("Shows pooled 2023Q3:2023Q4" in c for c in texts(map_tab, "caption"))
    for label in ("Kernel slices", "Inspect a point"):
        assert not open_tab(at, label).get("select_slider"), label
    report = open_tab(at, "Coverage report")
    assert element_types(report)["vega_lite_chart"] == 1  # reliability only
    assert not any("per quarter" in m for m in texts(report, "markdown"))


# ------------------------------------------------------------------------------ time-aware run


def test_map_quarter_slider_switches_the_grid(make_app: AppFactory, time_root: Path) -> None:
    at = make_app(time_root, "timed")
    at.run()
    assert_clean(at)
    slider = at.select_slider(key=MAP_SLIDER)
    # Ordered by the grids' quarter attribute; the extrapolated quarter is labelled.
    assert slider.options == ["2023Q2", "2023Q4 (extrapolation)"]
    assert slider.value == "2023Q4"  # grids/download.nc, the current map
    assert any("extrapolation beyond 2023Q3" in w for w in texts(at, "warning"))
    caption = " ".join(texts(tab(at, "Map"), "caption"))
    assert "Shows quarter 2023Q4 (extrapolation beyond 2023Q3)" in caption
    deck_q4 = _deck_json(tab(at, "Map"))
    legend_q4 = _legends(tab(at, "Map"))

    slider.set_value("2023Q2").run()
    assert_clean(at)
    assert not at.warning
    caption = " ".join(texts(tab(at, "Map"), "caption"))
    assert "Shows quarter 2023Q2 (observed)" in caption
    deck_q2 = _deck_json(tab(at, "Map"))
    grids = time_root / "timed" / "grids"
    shared = maps.shared_grids([grids / "download_2023Q2.nc", grids / "download.nc"])
    q2 = grids / "download_2023Q2.nc"
    url, scale, _legend = maps.grid_layer_png(
        str(q2), loaders.stamp(q2), "download", maps.LayerSpec("median"), shared
    )
    assert url in deck_q2 and url not in deck_q4  # the 2023Q2 file is the one drawn
    # One colour range for both quarters (2023Q2 is 0.45 log10 below 2023Q4 everywhere) ...
    assert _legends(tab(at, "Map")) == legend_q4
    q2_grid = loaders.load_grid(str(q2), loaders.stamp(q2), "download")
    q2_median = q2_grid.natural("mean")[q2_grid.in_region]
    assert scale.vmax > np.quantile(q2_median, 0.99) * 2  # ... which covers 2023Q4's values
    assert at.session_state["selected_quarter_download"] == "2023Q2"
    # Other layers keep the chosen quarter.
    at.selectbox(key="layer").set_value("pi_width").run()
    assert_clean(at)
    assert at.select_slider(key=MAP_SLIDER).value == "2023Q2"


def test_trend_layers(make_app: AppFactory, time_root: Path) -> None:
    at = make_app(time_root, "timed")
    at.run()
    options = at.selectbox(key="layer").options
    assert "Change per year (trend)" in options and "P(improved) (trend)" in options
    at.selectbox(key="layer").set_value("trend_change").run()
    assert_clean(at)
    map_tab = tab(at, "Map")
    assert not map_tab.get("select_slider")  # a trend spans two quarters
    legend = _legends(map_tab)
    assert len(legend) == 1 and "(× per year)" in legend[0] and "2023Q1 → 2023Q4" in legend[0]
    caption = " ".join(texts(map_tab, "caption"))
    assert "from 2023Q1 to 2023Q4" in caption and "latent mean" in caption
    assert "noise excluded" in caption and "as a factor per year" in caption
    path = time_root / "timed" / "grids" / "download_trend_2023Q1_2023Q4.nc"
    url, _s, _l = maps.trend_layer_png(str(path), loaders.stamp(path), "download", "trend_change")
    assert url in _deck_json(map_tab)
    # A selected point reports the change there, with its interval and P(improved).
    point = _in_region_point(time_root / "timed" / "grids" / "download.nc")
    at.session_state["inspect_point"] = point
    at.run()
    grid = loaders.load_trend(str(path), loaders.stamp(path), "download")
    cell = grid.cell_of(*point)
    assert cell is not None
    ratio = float(grid.arrays["ratio_per_year"][cell])
    summary = [c for c in texts(tab(at, "Map"), "caption") if c.startswith("Selected point")]
    assert summary and f"×{format_value(ratio)} per year" in summary[0]
    at.selectbox(key="layer").set_value("trend_p").run()
    assert_clean(at)
    legend = _legends(tab(at, "Map"))
    assert "P(improved)" in legend[0] and "2023Q4" in legend[0]


def test_trend_caption_status_and_licence_come_from_the_trend_grid(
    make_app: AppFactory, time_root: Path, tmp_path: Path
) -> None:
    """The trend map's caption reads the grid's attributes (quantity, quarters, units), a
    trend reaching outside the training quarters is flagged, and the licence is credited."""
    import xarray as xr
    from synthetic_run import _write_nc

    root = tmp_path / "runs"
    run = shutil.copytree(time_root / "timed", root / "timed")
    path = run / "grids" / "download_trend_2023Q1_2023Q4.nc"
    with xr.open_dataset(path, engine=loaders.grid_engine(path)) as ds:
        data = ds.load()
    data.attrs |= {
        "quantity": "latent mean f(x) (noise excluded)",
        "quarter_status": "2023Q4: extrapolation beyond 2023Q3",
        "source": "a synthetic test region",
        "license": "CC0",
    }
    path.unlink()
    _write_nc(data, path)
    at = make_app(root, "timed")
    at.run()
    at.selectbox(key="layer").set_value("trend_change").run()
    assert_clean(at)
    map_tab = tab(at, "Map")
    caption = " ".join(texts(map_tab, "caption"))
    assert "Change per year of download's latent mean f(x) (noise excluded)" in caption
    assert "from 2023Q1 to 2023Q4 (0.75 years), as a factor per year" in caption
    assert "change_per_year holds it in log10 units per year" in caption
    assert "Data: a synthetic test region. Licence: CC0." in caption
    warnings = texts(map_tab, "warning")
    assert any("2023Q4: extrapolation beyond 2023Q3" in w for w in warnings)


def test_coverage_tab_charts_calibration_per_quarter(make_app: AppFactory, time_root: Path) -> None:
    at = make_app(time_root, "timed")
    at.run()
    report = open_tab(at, "Coverage report")
    assert element_types(report)["vega_lite_chart"] == 3  # reliability + coverage, NLL per quarter
    assert any("Calibration per quarter" in m for m in texts(report, "markdown"))
    metrics = json.loads((time_root / "timed/report/download/metrics.json").read_text())
    table = next(d.value for d in report.dataframe if "quarter" in d.value.columns)
    assert list(table["quarter"]) == list(TIME_QUARTERS)
    for _, row in table.iterrows():
        entry = metrics["by_quarter"][row["quarter"]]
        # the tab shows fractions as percentages (one decimal, as in report.md)
        assert row["95% coverage"] == pytest.approx(100.0 * entry["coverage95"])
        assert row["urban coverage"] == pytest.approx(100.0 * entry["urban"]["coverage95"])
        assert row["rural n"] == entry["rural"]["n"]
    labels = [b.label for b in report.get("download_button")]
    assert "download.tif (GeoTIFF)" in labels


def test_kernel_slices_use_the_selected_quarter(make_app: AppFactory, time_root: Path) -> None:
    from app.kernel import RefPoint
    from app.tabs.kernel_tab import features, slice_image
    from geodbk.geo.timeaxis import TimeScaling

    at = make_app(time_root, "timed")
    at.run()
    at.select_slider(key=MAP_SLIDER).set_value("2023Q2").run()
    kernel = open_tab(at, "Kernel slices")
    slider = at.select_slider(key="quarter_kernel_download")
    assert slider.value == "2023Q2"  # shared with the Map tab
    assert slider.options[-1] == "2023Q4 (extrapolation)"
    assert list(slider.options[:3]) == ["2023Q1", "2023Q2", "2023Q3"]
    assert any("At quarter 2023Q2 (t = 0.00)" in c for c in texts(kernel, "caption"))
    slider.set_value("2023Q4").run()
    assert_clean(at)
    assert any(
        "At quarter 2023Q4 (t = 2.00)" in c for c in texts(tab(at, "Kernel slices"), "caption")
    )
    assert element_types(tab(at, "Kernel slices"))["deck_gl_json_chart"] == 3
    # The map has no 2023Q4-only grid issue: back on the map, 2023Q4 is download.nc.
    at.session_state["view"] = "Map"
    at.run()
    assert at.select_slider(key=MAP_SLIDER).value == "2023Q4"

    # The slice is k((x, t), (x_ref, t)) of the estimator with t = TimeScaling.scale(quarter).
    ctx = _ctx(time_root, "timed")
    model = ctx.model()
    ts = TimeScaling.from_dict(model.metadata_["time_scaling"])
    ref = RefPoint("ref", *_in_region_point(ctx.files.grid))
    images = {}
    for q in ("2023Q1", "2023Q4"):
        t = float(ts.scale(q))
        feats = features(ctx, t)
        image = slice_image(ctx, feats, ref, t)
        X = loaders.scale_lonlat(feats.lon[feats.cols], feats.lat[feats.rows], ctx.scaling())
        X3 = np.column_stack([X, np.full(len(X), t)])
        x_ref = loaders.scale_lonlat(np.array([ref.lon]), np.array([ref.lat]), ctx.scaling())
        k = model.kernel(X3, np.column_stack([x_ref, [t]]))[:, 0]
        assert np.allclose(image[feats.rows, feats.cols], k / k.max(), atol=1e-4)
        images[q] = image
    assert not np.allclose(images["2023Q1"], images["2023Q4"], equal_nan=True, atol=1e-6)


def test_inspect_evaluates_the_model_at_the_selected_quarter(
    make_app: AppFactory, time_root: Path
) -> None:
    from geodbk.geo.timeaxis import TimeScaling

    ctx = _ctx(time_root, "timed")
    model = ctx.model()
    ts = TimeScaling.from_dict(model.metadata_["time_scaling"])
    point = _in_region_point(ctx.files.grid)
    x = loaders.scale_lonlat(np.array([point[0]]), np.array([point[1]]), ctx.scaling())

    at = make_app(time_root, "timed")
    at.run()
    at.session_state["inspect_point"] = point
    open_tab(at, "Inspect a point")
    medians = {}
    for q in ("2023Q1", "2023Q4"):
        at.select_slider(key="quarter_inspect_download").set_value(q).run()
        assert_clean(at)
        inspect = tab(at, "Inspect a point")
        pred = model.predict_dist(np.column_stack([x, [float(ts.scale(q))]]))
        medians[q] = 10 ** float(np.asarray(pred.mean)[0]) / 1000.0
        assert inspect.metric[0].value == format_value(medians[q]), q
        caption = " ".join(texts(inspect, "caption"))
        assert f"for {q} (t = {float(ts.scale(q)):.2f})" in caption
        assert any(q in s.value for s in inspect.subheader)
    assert medians["2023Q1"] != medians["2023Q4"]
    # The inspect map draws the chosen quarter's grid when there is one.
    at.select_slider(key="quarter_inspect_download").set_value("2023Q2").run()
    assert any(
        "Predicted median of 2023Q2" in c for c in texts(tab(at, "Inspect a point"), "caption")
    )


def test_single_grid_of_a_time_aware_model(
    make_app: AppFactory, time_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    run = shutil.copytree(time_root / "timed", root / "one")
    (run / "grids" / "download_2023Q2.nc").unlink()
    (run / "exports" / "download_2023Q2.tif").write_bytes(b"II*\x00fake")
    (run / "exports" / "download_trend_2023Q1_2023Q4.tif").write_bytes(b"II*\x00fake")
    (run / "report" / "download" / "metrics.json").write_text(
        json.dumps({k: v for k, v in json.loads(
            (run / "report" / "download" / "metrics.json").read_text()
        ).items() if k != "by_quarter"})
    )  # fmt: skip
    at = make_app(root, "one")
    at.run()
    assert_clean(at)
    slider = at.select_slider(key=MAP_SLIDER)
    assert slider.disabled and slider.value == "2023Q4"
    assert any("--quarter" in c for c in texts(tab(at, "Map"), "caption"))
    report = open_tab(at, "Coverage report")
    assert element_types(report)["vega_lite_chart"] == 1  # no by_quarter: no chart, no error
    labels = [b.label for b in report.get("download_button")]
    assert "download_2023Q2.tif (GeoTIFF)" in labels
    assert "download_trend_2023Q1_2023Q4.tif (GeoTIFF)" in labels


def test_time_input_follows_the_models_extrapolation_policy() -> None:
    """The dashboard evaluates a quarter outside the trained range like the pipelines do:
    held at the nearest trained quarter under ``hold``, extrapolated under ``trend``."""
    from app.quarters import time_input

    md = {"inputs": ["x1", "x2", "t"], "time_scaling": {"first": "2022Q1", "last": "2023Q1"}}
    assert time_input({**md, "time_extrapolation": {"policy": "hold"}}, "2024Q1") == 1.0
    assert time_input({**md, "time_extrapolation": {"policy": "trend"}}, "2024Q1") == 3.0
    assert time_input(md, "2022Q3") == 0.0


def test_observed_tiles_open_at_the_quarter_the_map_shows(
    make_app: AppFactory, time_root: Path
) -> None:
    at = make_app(time_root, "timed")
    at.run()
    at.select_slider(key=MAP_SLIDER).set_value("2023Q2").run()
    at.selectbox(key="layer").set_value("tiles").run()
    assert_clean(at)
    assert at.selectbox(key="tiles_quarter").value == "2023Q2"
    assert any("tiles observed in 2023Q2" in c for c in texts(tab(at, "Map"), "caption"))


def test_a_single_quarter_grid_suggests_the_models_own_quarters(
    make_app: AppFactory, demo_root: tuple[Path, str], tmp_path: Path
) -> None:
    root, name = demo_root
    run = shutil.copytree(root / name, tmp_path / "runs" / name)
    for extra in (run / "grids").glob("download_2023Q*.nc"):
        extra.unlink()  # only grids/download.nc (2023Q4) is left
    at = make_app(run.parent, name)
    at.run()
    assert_clean(at)
    hint = [c for c in texts(tab(at, "Map"), "caption") if "only quarter with a grid" in c]
    assert hint, texts(tab(at, "Map"), "caption")
    assert "--quarter 2023Q1:2023Q4`" in hint[0], hint[0]  # the demo model's quarters
    assert "2019Q1" not in hint[0]
