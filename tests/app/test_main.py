"""The page (app/main.py): AppTest opens the demo run on the map, every tab of a synthetic run,
and broken runs with messages, never tracebacks; every tab has its renderer and rebuild stage."""

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

TABS = [
    "Map",
    "Kernel slices",
    "Inspect a point",
    "Service",
    "Areas",
    "Places",
    "Coverage report",
    "Model",
]


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
    legends = legend_titles(map_tab)
    assert len(legends) == 1 and "Predicted download, median" in legends[0]
    assert "tile: what the tile here typically gets" in legends[0] and "(Mbps)" in legends[0]
    # the data's licence under the map (the demo region is geodbk's own synthetic data)
    assert any("Licence: no third-party licence" in c for c in texts(map_tab, "caption"))


# ------------------------------------------------------------------------------ broken runs


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


def test_every_tab_has_a_renderer_and_a_stage_that_rebuilds_it() -> None:
    from app import main
    from pipelines.cli import STAGES

    assert list(main.TABS) == TABS
    for label, (module, stage) in main.TABS.items():
        render = main.renderer(module)
        assert callable(render) and render.__module__ == f"app.tabs.{module}", label
        assert stage in STAGES, label
