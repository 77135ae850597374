"""AppTest drives every tab and widget of the dashboard on the demo run and on broken runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from apptest_helpers import AppFactory, assert_clean, element_types, open_tab, tab, texts

from app.maps import LAYERS

TABS = ["Map", "Kernel slices", "Inspect a point", "Service", "Areas", "Coverage report", "Model"]


def _legend_titles(node: object) -> list[str]:
    return [m for m in texts(node, "markdown") if "geodbk-legend" in m]


def _centre(run: Path) -> tuple[float, float]:
    """An in-region grid cell centre of the run's download grid."""
    from app.loaders import load_grid, stamp

    path = run / "grids" / "download.nc"
    grid = load_grid(str(path), stamp(path), "download")
    rows, cols = grid.in_region.nonzero()
    mid = len(rows) // 2
    return float(grid.lon[cols[mid]]), float(grid.lat[rows[mid]])


# ------------------------------------------------------------------------------ the demo run


def test_demo_opens_on_the_map_with_a_legend(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    assert_clean(at)
    assert [t.label for t in at.tabs] == TABS
    assert at.sidebar.selectbox(key="run").value == name
    assert at.sidebar.selectbox(key="target").value == "download"
    map_tab = tab(at, "Map")
    assert element_types(map_tab)["deck_gl_json_chart"] == 1
    legends = _legend_titles(map_tab)
    assert len(legends) == 1 and "Predicted download, median" in legends[0]
    assert "tile: what a tile here typically gets" in legends[0] and "(Mbps)" in legends[0]
    # the data's licence under the map (the demo region is geodbk's own synthetic data)
    assert any("Licence: no third-party licence" in c for c in texts(map_tab, "caption"))


def test_demo_map_every_layer_target_and_overlay(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    for target, unit in (("download", "Mbps"), ("upload", "Mbps"), ("latency", "ms")):
        at.sidebar.selectbox(key="target").set_value(target).run()
        assert_clean(at)
        for kind in LAYERS:
            at.selectbox(key="layer").set_value(kind).run()
            assert_clean(at)
            map_tab = tab(at, "Map")
            assert element_types(map_tab)["deck_gl_json_chart"] == 1, (target, kind)
            legend = _legend_titles(map_tab)
            assert len(legend) == 1, (target, kind)
            if kind in ("median", "pi_width", "pi_lower", "pi_upper", "tiles"):
                assert f"({unit})" in legend[0], (target, kind, legend[0])
    # Threshold probability: type a threshold and flip the direction.
    at.sidebar.selectbox(key="target").set_value("download").run()
    at.selectbox(key="layer").set_value("prob").run()
    at.number_input(key="threshold_download").set_value(50.0).run()
    assert_clean(at)
    assert "P(download ≥ 50 Mbps)" in _legend_titles(tab(at, "Map"))[0]
    at.radio(key="direction_download").set_value("below").run()
    assert_clean(at)
    assert "P(download ≤ 50 Mbps)" in _legend_titles(tab(at, "Map"))[0]
    # Observed tiles of each quarter.
    at.selectbox(key="layer").set_value("tiles").run()
    quarters = at.selectbox(key="tiles_quarter").options
    assert quarters
    at.selectbox(key="tiles_quarter").set_value(quarters[0]).run()
    assert_clean(at)
    assert any("tiles observed in" in c for c in texts(tab(at, "Map"), "caption"))
    # Overlays off and on.
    at.sidebar.checkbox(key="show_region").uncheck().run()
    at.sidebar.checkbox(key="show_urban").uncheck().run()
    assert_clean(at)
    at.sidebar.checkbox(key="show_region").check().run()
    assert_clean(at)


def test_demo_clicked_point_is_summarised(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    from app.loaders import load_grid, stamp

    grid = load_grid(
        str(root / name / "grids" / "download.nc"),
        stamp(root / name / "grids" / "download.nc"),
        "download",
    )
    rows, cols = grid.in_region.nonzero()
    point = (float(grid.lon[cols[len(cols) // 2]]), float(grid.lat[rows[len(rows) // 2]]))
    at.session_state["inspect_point"] = point
    at.run()
    assert_clean(at)
    assert any("Selected point" in c for c in texts(tab(at, "Map"), "caption"))
    inspect = open_tab(at, "Inspect a point")
    assert at.selectbox(key="inspect_source").value == "Clicked point"
    kinds = element_types(inspect)
    # the nearest tiles, and the cell's parts (area / tile / test, offset, neighbours' pull)
    assert kinds["metric"] == 3 and kinds["dataframe"] == 2 and kinds["deck_gl_json_chart"] == 1
    labels = [m.label for m in inspect.metric]
    assert labels == ["Median (Mbps)", "95% interval (Mbps)", "sd (Mbps)"]
    assert any("Model evaluated at this exact point" in c for c in texts(inspect, "caption"))
    area = [m for m in texts(inspect, "markdown") if m.startswith("**Area:**")]
    assert area and ("urban" in area[0] or "rural" in area[0])


def test_demo_inspect_presets_and_coordinates(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    inspect = open_tab(at, "Inspect a point")
    options = at.selectbox(key="inspect_source").options
    assert options[0] == "Clicked point" and options[-1] == "Coordinates"
    assert {"Urban (preset)", "Rural (preset)", "Remote (preset)"} <= set(options)
    for option in options[1:-1]:
        at.selectbox(key="inspect_source").set_value(option).run()
        assert_clean(at)
        inspect = tab(at, "Inspect a point")
        assert element_types(inspect)["metric"] == 3, option
    at.selectbox(key="inspect_source").set_value("Coordinates").run()
    lon0 = float(at.number_input(key="inspect_lon").value or 0.0)
    at.number_input(key="inspect_lon").set_value(lon0 + 0.01).run()
    at.number_input(key="inspect_lat").set_value(at.number_input(key="inspect_lat").value).run()
    assert_clean(at)
    assert element_types(tab(at, "Inspect a point"))["metric"] == 3
    # A point far outside the region is flagged as an extrapolation, not an error.
    at.number_input(key="inspect_lon").set_value(0.0).run()
    assert_clean(at)
    area = [m for m in texts(tab(at, "Inspect a point"), "markdown") if m.startswith("**Area:**")]
    assert "outside the modelled region" in area[0]


def test_demo_kernel_slices_presets_clicks_and_clear(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    kernel = open_tab(at, "Kernel slices")
    assert element_types(kernel)["deck_gl_json_chart"] == 3
    titles = [m for m in texts(kernel, "markdown") if m.startswith("**")]
    assert [t.split("**")[1] for t in titles] == ["Urban", "Rural", "Remote"]
    assert any("k(x, x_ref) / max over the region" in m for m in _legend_titles(kernel))
    assert any("Each slice:" in c for c in texts(kernel, "caption"))
    # A click adds a slice (the chart callback stores clicks in session state).
    at.session_state["kernel_clicks"] = [
        (at.session_state["inspect_point"] if "inspect_point" in at.session_state else (0.0, 0.0))
    ]
    presets = at.multiselect(key="kernel_presets_download")
    presets.set_value(["Urban"]).run()
    assert_clean(at)
    assert element_types(tab(at, "Kernel slices"))["deck_gl_json_chart"] == 2
    at.button(key="kernel_clear").click().run()
    assert_clean(at)
    assert element_types(tab(at, "Kernel slices"))["deck_gl_json_chart"] == 1
    at.multiselect(key="kernel_presets_download").set_value([]).run()
    assert_clean(at)
    kernel = tab(at, "Kernel slices")
    assert element_types(kernel)["deck_gl_json_chart"] == 1  # the map to click on
    assert texts(kernel, "info")


def test_demo_coverage_report_and_model_tabs(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    report = open_tab(at, "Coverage report")
    kinds = element_types(report)
    assert kinds["dataframe"] >= 2  # metrics table + service coverage
    import json

    metrics = json.loads((root / name / "report" / "download" / "metrics.json").read_text())
    # reliability, plus coverage and NLL per quarter when the report has `by_quarter`
    assert kinds["vega_lite_chart"] == 1 + 2 * bool(metrics.get("by_quarter"))
    assert kinds["image"] == 3  # violin, service coverage, sd maps (reliability is interactive)
    labels = [b.label for b in report.get("download_button")]
    for t in ("download", "upload", "latency"):
        assert f"{t}.tif (GeoTIFF)" in labels
    assert "download report.html" in labels
    table = report.dataframe[0].value
    assert list(table["group"]) == ["urban", "rural", "all"]
    assert {"MAE", "NLL", "95% coverage"} <= set(table.columns)
    # the map's own calibration and the quantity that judged service coverage are named
    frames = [d.value for d in report.dataframe]
    cal = next(f for f in frames if "median |error| (log10)" in f.columns)
    assert list(cal["quantity"])[:3] == ["tile"] * 3 and "area" in set(cal["quantity"])
    svc = next(f for f in frames if "served when" in f.columns)
    assert "tiles (%), tile" in svc.columns and "area (%), tile" in svc.columns
    assert any(c.startswith("Data: geodbk's synthetic") for c in texts(report, "caption"))
    model = open_tab(at, "Model")
    kinds = element_types(model)
    assert kinds["metric"] == 6 and kinds["vega_lite_chart"] == 2 and kinds["code"] == 1
    assert kinds["dataframe"] == 1  # the demo's per-stage pipeline timings
    for target in ("upload", "latency"):
        at.sidebar.selectbox(key="target").set_value(target).run()
        assert_clean(at)
        assert element_types(tab(at, "Model"))["vega_lite_chart"] == 2


def test_no_run_given_opens_demo_by_default(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(tiny_run, root / "demo", ignore=shutil.ignore_patterns("checkpoints", "*.tif"))
    (root / "other").mkdir()
    at = make_app(root)
    at.run()
    assert_clean(at)
    assert at.sidebar.selectbox(key="run").value == "demo"
    assert at.sidebar.selectbox(key="run").options == ["demo", "other"]


# ------------------------------------------------------------------------------ broken runs


def test_no_runs_at_all_tells_the_one_command(make_app: AppFactory, tmp_path: Path) -> None:
    at = make_app(tmp_path / "nothing-here")
    at.run()
    assert not at.exception
    info = " ".join(texts(at, "info"))
    assert "make demo" in info and "geodbk demo --run runs/demo" in info


def test_typed_path_outside_the_runs_folder_is_refused(
    make_app: AppFactory, synthetic_root: Path
) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    for bad in ("../../etc", "/etc", str(synthetic_root.parent)):
        at.sidebar.text_input(key="run_path").input(bad).run()
        assert not at.exception
        assert any("not inside the runs folder" in e for e in texts(at, "error")), bad
        assert not at.tabs
    at.sidebar.text_input(key="run_path").input("synth").run()
    assert_clean(at)
    assert at.tabs


def test_missing_run_directory(make_app: AppFactory, synthetic_root: Path) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    at.sidebar.text_input(key="run_path").input("does-not-exist").run()
    assert not at.exception
    assert any("does not exist" in e for e in texts(at, "error"))
    assert any("geodbk demo --run" in i for i in texts(at, "info"))


@pytest.mark.parametrize("run", ["partial", "corrupt", "empty", "nomodel"])
def test_broken_runs_show_messages_never_tracebacks(
    make_app: AppFactory, broken_root: Path, run: str
) -> None:
    at = make_app(broken_root, run)
    at.run()
    assert not at.exception
    if run == "empty":
        assert any("is not a geodbk run" in e for e in texts(at, "error"))
        assert any("geodbk demo --run" in i for i in texts(at, "info"))
        return
    messages: list[str] = []
    for label in TABS:
        at.session_state["view"] = label
        at.run()
        assert not at.exception, (run, label, [e.value for e in at.exception])
        node = tab(at, label)
        msgs = texts(node, "error") + texts(node, "info")
        messages += msgs
        if run == "partial" and label != "Model":
            assert any("geodbk" in m for m in texts(node, "info")), (label, msgs)
    if run == "partial":
        joined = " ".join(messages)
        for stage in ("predict", "train", "report"):
            assert f"geodbk {stage} --run" in joined
    if run == "corrupt":
        errors = " ".join(m for m in messages if "Could not read" in m or "could not be shown" in m)
        assert "download.nc" in errors and "metrics.json" in errors and "model.json" in errors
    if run == "nomodel":
        assert any("geodbk train --run" in m for m in messages)
        at.session_state["view"] = "Map"
        at.run()
        assert element_types(tab(at, "Map"))["deck_gl_json_chart"] == 1  # the grid still shows


def test_a_corrupt_overlay_is_a_warning_and_the_map_still_draws(
    make_app: AppFactory, broken_root: Path
) -> None:
    at = make_app(broken_root, "badoverlay")
    at.run()
    assert not at.exception and not at.error
    assert any("urban_areas.geojson" in w for w in texts(at, "warning"))
    assert element_types(tab(at, "Map"))["deck_gl_json_chart"] == 1
    inspect = open_tab(at, "Inspect a point")
    area = [m for m in texts(inspect, "markdown") if m.startswith("**Area:**")]
    assert area and "nearest tile" in area[0]


def test_synthetic_run_every_tab_is_clean(make_app: AppFactory, synthetic_root: Path) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    assert_clean(at)
    for label in TABS[1:]:
        open_tab(at, label)


def test_report_tab_says_when_the_tile_effect_scored_the_tiles(
    make_app: AppFactory, synthetic_root: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    root = tmp_path / "runs"
    run = shutil.copytree(synthetic_root / "synth", root / "tiled")
    path = run / "report" / "download" / "metrics.json"
    metrics = json.loads(path.read_text())
    tau2 = {"rural": 0.1234, "urban": 0.2345}  # one offset variance per class
    params = {"tau2": tau2, "rho": 0.97, "val_nll": 0.66, "val_nll_without": 0.79}
    path.write_text(json.dumps({**metrics, "tile_effect": params}))
    at = make_app(root, "tiled")
    at.run()
    captions = texts(open_tab(at, "Coverage report"), "caption")
    note = [c for c in captions if "tile effect" in c]
    assert note and "τ² = 0.1234 rural, 0.2345 urban log10²" in note[0]
    assert "0.790 without, 0.660 with" in note[0]
    at = make_app(synthetic_root, "synth")
    at.run()
    assert not [c for c in texts(open_tab(at, "Coverage report"), "caption") if "tile effect" in c]


def test_a_page_load_paints_the_raster_first_then_the_full_map(
    make_app: AppFactory, synthetic_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from app.tabs import map_tab

    at = make_app(synthetic_root, "synth")
    monkeypatch.setenv("GEODBK_APP_REFINE_S", "0.01")
    calls: list[tuple[bool, list[str]]] = []
    draw = map_tab._draw

    def spy(url: str, bounds: object, extras: object, light: bool, **kw: object) -> None:
        calls.append((light, [] if light else [lyr.id for lyr in extras()]))  # type: ignore[operator]
        draw(url, bounds, extras, light, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(map_tab, "_draw", spy)
    at.run()
    assert_clean(at)
    # First run: the raster alone; the automatic rerun: click targets and outlines too.
    assert [light for light, _ in calls] == [True, False]
    assert {"click-grid", "outlines"} <= set(calls[1][1])
    deck = json.loads(tab(at, "Map").get("deck_gl_json_chart")[0].proto.json)
    assert [layer["id"] for layer in deck["layers"]] == ["raster", "click-grid", "outlines"]
    # Later reruns of the session draw the full map directly.
    at.selectbox(key="layer").set_value("pi_width").run()
    assert_clean(at)
    assert [light for light, _ in calls] == [True, False, False]


def test_tile_effect_note_reads_one_tau2_or_one_per_group() -> None:
    """Reports written before the groups hold one float; ``{"all": x}`` reads the same."""
    from app.tabs.report_tab import tile_effect_note

    base = {"rho": 0.9, "val_nll": 0.6, "val_nll_without": 0.7}
    for tau2 in (0.25, {"all": 0.25}):
        note = tile_effect_note({"tile_effect": {**base, "tau2": tau2}})
        assert note is not None and "τ² = 0.2500 log10²" in note
