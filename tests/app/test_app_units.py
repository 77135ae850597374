"""Unit tests of the dashboard's pure pieces: paths, colours, legends, kernel slices, points."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.colormaps import (
    ColorScale,
    Legend,
    auto_scale,
    colorize,
    format_value,
    legend_html,
    lut,
    mercator_rows,
    png_data_url,
    ticks,
)
from app.kernel import kernel_slice, normalise_slice, preset_points
from app.layers import NO_BASE_MAP, bitmap_layer, deck, fit_view, outline_paths, outlines_layer
from app.points import PointSummary, nearest_tiles, point_from_selection, prob_threshold
from app.runs import (
    UnsafePathError,
    discover_runs,
    inventory,
    natural_to_log10,
    resolve_run,
    runs_root_from,
    to_natural,
)

# ------------------------------------------------------------------------------ safe paths


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    (root / "demo" / "grids").mkdir(parents=True)
    (root / "nested" / "inner").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "escape")
    return root


def test_resolve_run_accepts_names_and_paths_inside(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_run(runs, "demo") == (runs / "demo").resolve()
    assert resolve_run(runs, " demo ") == (runs / "demo").resolve()
    assert resolve_run(runs, "nested/inner") == (runs / "nested" / "inner").resolve()
    assert resolve_run(runs, str(runs / "demo")) == (runs / "demo").resolve()
    assert resolve_run(runs, "nested/../demo") == (runs / "demo").resolve()
    monkeypatch.chdir(runs.parent)
    assert resolve_run(runs, "runs/demo") == (runs / "demo").resolve()  # relative to the cwd
    assert resolve_run(runs, "not-yet-built") == (runs / "not-yet-built").resolve()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "..",
        "../outside",
        "demo/../..",
        "/etc",
        "/etc/passwd",
        "escape",
        "escape/x",
        "a\x00b",
        ".",
    ],
)
def test_resolve_run_refuses_everything_outside(runs: Path, value: str) -> None:
    with pytest.raises(UnsafePathError):
        resolve_run(runs, value)


def test_resolve_run_refuses_absolute_path_outside_even_if_it_exists(
    runs: Path, tmp_path: Path
) -> None:
    with pytest.raises(UnsafePathError, match="not inside the runs folder"):
        resolve_run(runs, str(tmp_path / "outside"))


def test_discover_runs_lists_safe_subdirectories_runs_first(runs: Path) -> None:
    assert discover_runs(runs) == ["demo", "nested"]  # no hidden dir, no symlink escaping
    assert discover_runs(runs / "missing") == []


def test_runs_root_precedence(tmp_path: Path) -> None:
    assert runs_root_from(["--runs-dir", "x"], {"GEODBK_RUNS_DIR": "y"}) == Path("x")
    assert runs_root_from(["--runs-dir=z"], {}) == Path("z")
    assert runs_root_from([], {"GEODBK_RUNS_DIR": "y"}) == Path("y")
    assert runs_root_from([], {}) == Path.cwd() / "runs"


def test_inventory_and_commands(runs: Path) -> None:
    inv = inventory(runs / "demo")
    assert inv.exists and not inv.has_tiles and inv.available_targets() == []
    assert inv.command("predict", "upload").startswith("geodbk predict --run ")
    assert inv.command("predict", "upload").endswith("--target upload")


def test_units_round_trip() -> None:
    assert to_natural(np.log10(25_000.0), "download") == pytest.approx(25.0)
    assert to_natural(2.0, "latency") == pytest.approx(100.0)
    assert natural_to_log10(25.0, "download") == pytest.approx(math.log10(25_000))


# ------------------------------------------------------------------------------ colours, legends


def test_colorize_maps_ends_to_colormap_ends_and_nan_to_transparent() -> None:
    scale = ColorScale("viridis", 0.0, 10.0)
    rgba = colorize(np.array([[0.0, 10.0], [np.nan, 20.0]]), scale)
    table = lut("viridis")
    assert rgba.shape == (2, 2, 4) and rgba.dtype == np.uint8
    assert tuple(rgba[0, 0, :3]) == tuple(table[0, :3])
    assert tuple(rgba[0, 1, :3]) == tuple(table[255, :3])
    assert tuple(rgba[1, 1, :3]) == tuple(table[255, :3])  # clipped above vmax
    assert rgba[1, 0, 3] == 0 and rgba[0, 0, 3] > 200


def test_log_scale_normalises_in_log10_and_is_chosen_for_wide_positive_ranges() -> None:
    scale = ColorScale("viridis", 1.0, 100.0, log=True)
    assert np.allclose(scale.normalise(np.array([1.0, 10.0, 100.0])), [0.0, 0.5, 1.0])
    assert auto_scale(np.geomspace(1, 1000, 50), "viridis").log
    assert not auto_scale(np.linspace(5, 20, 50), "viridis").log
    assert not auto_scale(np.linspace(-1, 1, 50), "viridis").log
    fixed = auto_scale(np.array([0.3]), "YlGnBu", limits=(0.0, 1.0))
    assert (fixed.vmin, fixed.vmax, fixed.log) == (0.0, 1.0, False)


@pytest.mark.parametrize(
    "scale",
    [
        ColorScale("viridis", 3.2, 180.0, log=True),
        ColorScale("magma", 0.05, 0.61),
        ColorScale("YlGnBu", 0.0, 1.0),
        ColorScale("viridis", 40.0, 41.0),
    ],
)
def test_ticks_lie_inside_the_bar_at_their_value(scale: ColorScale) -> None:
    tk = ticks(scale)
    assert len(tk) >= 2
    for pos, value in tk:
        assert 0.0 <= pos <= 1.0
        assert scale.vmin * (1 - 1e-9) <= value <= scale.vmax * (1 + 1e-9)
        assert pos == pytest.approx(float(scale.normalise(np.array([value]))[0]))


def test_legend_html_names_title_unit_and_ticks() -> None:
    html = legend_html(
        Legend("Predicted download, median", ColorScale("viridis", 1.0, 100.0, True), "Mbps")
    )
    assert "Predicted download, median (Mbps)" in html
    assert "log scale" in html and "linear-gradient" in html
    for label in (">1<", ">10<", ">100<"):
        assert label in html


def test_format_value() -> None:
    assert format_value(123.456, "Mbps") == "123 Mbps"
    assert format_value(12.34) == "12.3"
    assert format_value(0.5) == "0.5"
    assert format_value(float("nan")) == "–"
    assert format_value(25000.0, "ms") == "25,000 ms"


def test_mercator_rows_keep_order_and_shift_towards_the_pole_rows() -> None:
    lats = np.linspace(60.0, 20.0, 200)  # north-up
    rows = mercator_rows(lats)
    assert rows[0] == 0 and rows[-1] == 199
    assert np.all(np.diff(rows) >= 0)
    # Mercator stretches the north: the top half of the image covers fewer latitude rows.
    assert rows[100] < 100
    small = np.linspace(21.6, 21.25, 70)
    assert np.abs(mercator_rows(small) - np.arange(70)).max() <= 1


def test_png_data_url_and_bitmap_layer_keep_the_url_as_a_string() -> None:
    url = png_data_url(np.zeros((3, 4, 4), dtype=np.uint8))
    assert url.startswith("data:image/png;base64,")
    layer = bitmap_layer(url, (-1.0, -2.0, 3.0, 4.0))
    js = deck([layer], (-1.0, -2.0, 3.0, 4.0)).to_json()
    doc = json.loads(js)
    assert doc["layers"][0]["image"] == url  # not turned into a "@@=" accessor expression
    assert doc["layers"][0]["bounds"] == [-1.0, -2.0, 3.0, 4.0]
    assert doc["mapStyle"] == NO_BASE_MAP  # Streamlit then draws no (network) base map
    assert "\n" not in js and ", " not in js.replace(url, "")  # compact JSON


def test_outlines_are_one_path_layer_with_rings_and_holes() -> None:
    square = [[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]
    hole = [[0.2, 0.2], [0.4, 0.2], [0.4, 0.4], [0.2, 0.2]]
    fc = {
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [square, hole]}},
            {
                "type": "Feature",
                "geometry": {"type": "MultiPolygon", "coordinates": [[square], [square]]},
            },
            {"type": "Feature", "geometry": None},
            {"type": "Feature", "geometry": {"type": "Point", "coordinates": [0, 0]}},
        ],
    }
    paths = outline_paths(fc)
    assert len(paths) == 4 and paths[1] == [[0.2, 0.2], [0.4, 0.2], [0.4, 0.4], [0.2, 0.2]]
    layer = outlines_layer([(paths[:1], (255, 255, 255, 200), 3.0), (paths, (0, 0, 0, 255), 1.0)])
    doc = json.loads(deck([layer], (0.0, 0.0, 1.0, 1.0)).to_json())["layers"][0]
    assert doc["@@type"] == "PathLayer" and doc["widthUnits"] == "pixels"
    assert len(doc["data"]) == 5 and doc["data"][0]["width"] == 3.0  # the halo first
    assert doc["data"][-1]["color"] == [0, 0, 0, 255]


def test_fit_view_centres_and_zooms_out_for_bigger_regions() -> None:
    small = fit_view((-158.0, 21.2, -157.6, 21.6))
    big = fit_view((-160.0, 18.0, -154.0, 23.0))
    assert small.longitude == pytest.approx(-157.8) and small.latitude == pytest.approx(21.4)
    assert small.zoom > big.zoom > 0


# ------------------------------------------------------------------------------ kernel slices


def test_normalise_slice_has_max_one_keeps_nan_and_rejects_degenerate() -> None:
    k = np.array([[2.0, 4.0], [np.nan, 1.0]])
    out = normalise_slice(k)
    assert np.nanmax(out) == 1.0 and np.isnan(out[1, 0])
    assert np.allclose(out[np.isfinite(out)], [0.5, 1.0, 0.25])
    assert np.isnan(normalise_slice(np.array([0.0, -1.0]))).all()
    assert np.isnan(normalise_slice(np.array([np.nan]))).all()


def test_kernel_slice_is_phi_times_phi_ref() -> None:
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(50, 8))
    ref = rng.normal(size=8)
    assert np.allclose(kernel_slice(phi.astype(np.float32), ref), phi @ ref, atol=1e-4)


def test_preset_points_pick_dense_urban_typical_rural_and_isolated() -> None:
    rng = np.random.default_rng(1)
    town = rng.normal(0, 0.002, size=(60, 2)) + np.array([-157.8, 21.3])
    country = np.column_stack([rng.uniform(-157.75, -157.5, 40), rng.uniform(21.3, 21.5, 40)])
    lonely = np.array([[-157.2, 21.9]])
    xy = np.vstack([town, country, lonely])
    tiles = pd.DataFrame(
        {
            "quadkey": [str(i) for i in range(len(xy))],
            "lon": xy[:, 0],
            "lat": xy[:, 1],
            "x1": xy[:, 0],
            "x2": xy[:, 1],
            "urban": [True] * 60 + [False] * 41,
            "tests": 5,
        }
    )
    pts = {p.name: p for p in preset_points(tiles)}
    assert set(pts) == {"Urban", "Rural", "Remote"}
    assert abs(pts["Urban"].lon + 157.8) < 0.01
    assert pts["Remote"].lon == pytest.approx(-157.2) and pts["Remote"].lat == pytest.approx(21.9)
    assert -157.75 <= pts["Rural"].lon <= -157.2


# ------------------------------------------------------------------------------ points


def test_point_from_selection_reads_streamlit_selection_state() -> None:
    state = {
        "selection": {
            "indices": {"click-grid": [3]},
            "objects": {"click-grid": [{"lon": -157.1, "lat": 21.2}]},
        }
    }
    assert point_from_selection(state, ("tiles", "click-grid")) == (-157.1, 21.2)
    assert point_from_selection(state["selection"], ("click-grid",)) == (-157.1, 21.2)
    assert (
        point_from_selection({"selection": {"indices": {}, "objects": {}}}, ("click-grid",)) is None
    )
    assert point_from_selection(None, ("click-grid",)) is None
    bad = {"selection": {"objects": {"click-grid": [{"lon": "x"}]}}}
    assert point_from_selection(bad, ("click-grid",)) is None


def test_point_summary_lognormal() -> None:
    s = PointSummary.from_log10(1.0, 0.1)
    assert s.median == pytest.approx(10.0)
    assert s.lower == pytest.approx(10 ** (1 - 1.959964 * 0.1), rel=1e-5)
    assert s.upper == pytest.approx(10 ** (1 + 1.959964 * 0.1), rel=1e-5)
    rng = np.random.default_rng(0)
    draws = 10 ** rng.normal(1.0, 0.1, 400_000)
    assert s.mean == pytest.approx(draws.mean(), rel=5e-3)
    assert s.sd == pytest.approx(draws.std(), rel=2e-2)


def test_prob_threshold_is_gaussian_in_log10() -> None:
    m = np.array([np.log10(25.0), 2.0, np.nan])
    s = np.array([0.2, 0.1, 0.1])
    below = prob_threshold(m, s, 25.0, above=False)
    above = prob_threshold(m, s, 25.0, above=True)
    assert below[0] == pytest.approx(0.5) and above[1] > 0.999
    assert np.isnan(below[2])
    assert np.allclose(below[:2] + above[:2], 1.0)


def test_nearest_tiles_sorted_by_distance() -> None:
    tiles = pd.DataFrame(
        {"lon": [0.0, 1.0, 0.1, 5.0], "lat": [0.0, 0.0, 0.0, 0.0], "tests": [1, 2, 3, 4]}
    )
    near = nearest_tiles(tiles, 0.05, 0.0, k=2)
    assert list(near["tests"]) == [1, 3] or list(near["tests"]) == [3, 1]
    assert near["distance_km"].is_monotonic_increasing
    assert near["distance_km"].iloc[0] == pytest.approx(5.56, rel=0.01)


# ------------------------------------------------------------------------------ warm-up


def test_warmup_runs_a_job_once_per_key_and_retries_after_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from app import warmup

    monkeypatch.setenv("GEODBK_APP_WARMUP", "1")
    done = threading.Event()
    calls: list[int] = []

    def job() -> None:
        calls.append(1)
        done.set()

    assert warmup.start("unit-test-key", job)
    assert done.wait(10)
    assert not warmup.start("unit-test-key", job)
    assert calls == [1]

    failed = threading.Event()

    def bad() -> None:
        failed.set()
        raise RuntimeError("boom")

    assert warmup.start("unit-test-bad", bad)
    assert failed.wait(10)
    for _ in range(100):  # the failed key is released so a later page can retry
        if "unit-test-bad" not in warmup._started:
            break
        threading.Event().wait(0.01)
    assert "unit-test-bad" not in warmup._started
    monkeypatch.setenv("GEODBK_APP_WARMUP", "0")
    assert not warmup.start("unit-test-off", job)


def test_first_frame_raster_is_capped_and_sampled_from_block_middles() -> None:
    import base64
    import io

    from PIL import Image

    from app.colormaps import ColorScale
    from app.maps import raster_url, thin

    ny, nx = 1200, 900
    values = np.arange(ny * nx, dtype=np.float64).reshape(ny, nx)
    lats = np.linspace(22.0, 18.0, ny)
    small, small_lats = thin(values, lats, 512)
    assert max(small.shape) <= 512 and small.shape == (ny // 3, nx // 3)  # step 3
    assert small[0, 0] == values[1, 1] and small_lats[0] == lats[1]  # middle of a 3 x 3 block
    same, same_lats = thin(values[:100, :80], lats[:100], 512)
    assert same.shape == (100, 80) and same_lats.size == 100  # small grids are left alone
    url = raster_url(small, small_lats, ColorScale("viridis", 0.0, float(values.max())))
    png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert png.size == (nx // 3, ny // 3)


def test_value_cmap_draws_the_better_service_yellow_for_every_target() -> None:
    from app.colormaps import lut, value_cmap

    fast = lut(value_cmap("download"))[-1]  # the top of the speed scale
    low_latency = lut(value_cmap("latency"))[0]  # the bottom of the latency scale
    assert value_cmap("download") == value_cmap("upload") != value_cmap("latency")
    np.testing.assert_array_equal(fast, low_latency)
    assert fast[0] > 200 and fast[1] > 200 and fast[2] < 100  # yellow


def test_deck_draws_a_base_map_only_when_given_a_style() -> None:
    from app.basemap import BASEMAP_STYLE, reachable

    layers = [bitmap_layer("data:image/png;base64,AAAA", (0.0, 0.0, 1.0, 1.0))]
    assert json.loads(deck(layers, (0.0, 0.0, 1.0, 1.0)).to_json())["mapStyle"] == NO_BASE_MAP
    styled = deck(layers, (0.0, 0.0, 1.0, 1.0), basemap=BASEMAP_STYLE)
    assert json.loads(styled.to_json())["mapStyle"] == BASEMAP_STYLE
    assert reachable("127.0.0.1", port=9, timeout_s=0.5) is False  # nothing listens there


def test_basemap_is_off_without_a_network_check_when_the_environment_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.basemap as bm

    monkeypatch.setenv("GEODBK_BASEMAP", "off")
    monkeypatch.setattr(bm, "reachable", lambda *a, **k: pytest.fail("network was checked"))
    bm.basemap_available.clear()
    assert bm.basemap_available() is False
