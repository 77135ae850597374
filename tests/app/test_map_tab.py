"""The map tab: every layer, target and overlay, a clicked point, and the raster painted first."""

from __future__ import annotations

from pathlib import Path

import pytest
from apptest_helpers import (
    AppFactory,
    assert_clean,
    element_types,
    legend_titles,
    open_tab,
    tab,
    texts,
)

from app.maps import LAYERS


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
            legend = legend_titles(map_tab)
            assert len(legend) == 1, (target, kind)
            if kind in ("median", "pi_width", "pi_lower", "pi_upper", "tiles"):
                assert f"({unit})" in legend[0], (target, kind, legend[0])
    # Threshold probability: type a threshold and flip the direction.
    at.sidebar.selectbox(key="target").set_value("download").run()
    at.selectbox(key="layer").set_value("prob").run()
    at.number_input(key="threshold_download").set_value(50.0).run()
    assert_clean(at)
    assert "P(download ≥ 50 Mbps)" in legend_titles(tab(at, "Map"))[0]
    at.radio(key="direction_download").set_value("below").run()
    assert_clean(at)
    assert "P(download ≤ 50 Mbps)" in legend_titles(tab(at, "Map"))[0]
    # at a threshold the report checked, the map says how its sure calls fared on held-out tiles
    captions = texts(tab(at, "Map"), "caption")
    assert not any(c.startswith("Held-out check at ") for c in captions)  # 50: not checked
    at.number_input(key="threshold_download").set_value(25.0).run()
    captions = texts(tab(at, "Map"), "caption")
    assert any(c.startswith("Held-out check at ≥ 25 Mbps (geodbk report)") for c in captions)
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
    # the headline is the Map tab's quantity at the cell (the tile quantity by default), and
    # the GP alone at the exact point is named beside it
    assert "**tile: what the tile here typically gets**" in texts(inspect, "markdown")
    assert any("The GP alone at this exact point" in c for c in texts(inspect, "caption"))
    area = [m for m in texts(inspect, "markdown") if m.startswith("**Area:**")]
    assert area and ("urban" in area[0] or "rural" in area[0])


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
