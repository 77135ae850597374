"""Colours and legends: colour scales (linear and log), ticks, legend HTML, value formats,
Mercator rows and the value colour maps."""

from __future__ import annotations

import numpy as np
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
    ticks,
)


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


def test_value_cmap_draws_the_better_service_yellow_for_every_target() -> None:
    from app.colormaps import lut, value_cmap

    fast = lut(value_cmap("download"))[-1]  # the top of the speed scale
    low_latency = lut(value_cmap("latency"))[0]  # the bottom of the latency scale
    assert value_cmap("download") == value_cmap("upload") != value_cmap("latency")
    np.testing.assert_array_equal(fast, low_latency)
    assert fast[0] > 200 and fast[1] > 200 and fast[2] < 100  # yellow


def test_lonlat_text_reads_in_minus_180_to_180() -> None:
    from app.colormaps import format_lonlat

    assert format_lonlat(180.0632, 51.57884) == "-179.9368, 51.5788"
    assert format_lonlat(-157.81234, 21.3, 3) == "-157.812, 21.300"
