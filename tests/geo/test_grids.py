"""Regular grids: bounds, resolution, tile zoom, region masks and row blocks."""

from __future__ import annotations

import numpy as np
import pytest
import shapely
from geo_helpers import SQUARE, TRIANGLE

from geodbk.geo.grids import block_rows_for, make_grid, region_mask, tile_size_deg


def test_grid_covers_bounds_north_up() -> None:
    g = make_grid(SQUARE.bounds, resolution=0.1)
    assert g.shape == (10, 10)
    assert np.allclose(g.x[[0, -1]], [10.05, 10.95])
    assert np.allclose(g.y[[0, -1]], [20.95, 20.05])
    assert np.all(np.diff(g.y) < 0) and np.all(np.diff(g.x) > 0)


def test_default_resolution_is_zoom16_capped() -> None:
    small = make_grid((10.0, 20.0, 10.05, 20.05))
    dx, dy = tile_size_deg(16, 20.025)
    assert small.dx == pytest.approx(dx) and small.dy == pytest.approx(dy)
    big = make_grid((0.0, 0.0, 10.0, 10.0), max_cells=10_000)
    assert 10_000 * 0.95 <= big.size <= 10_000
    assert big.dx / big.dy == pytest.approx(dx / tile_size_deg(16, 5.0)[1] * dy / dy, rel=0.05)


@pytest.mark.parametrize("max_cells", [1, 100, 1000, 5000, 13_000])
def test_the_default_grid_never_exceeds_max_cells(max_cells: int) -> None:
    """Whole cells round the counts up; the coarsening keeps the grid within ``max_cells``."""
    g = make_grid((-158.3, 21.2, -157.6, 21.8), max_cells=max_cells)
    assert g.size <= max_cells and g.size >= 0.8 * max_cells


def test_tile_zoom_and_resolution_exclusive() -> None:
    g = make_grid(SQUARE.bounds, tile_zoom=10)
    assert g.dx == pytest.approx(360 / 1024)
    with pytest.raises(ValueError):
        make_grid(SQUARE.bounds, resolution=0.1, tile_zoom=10)


def test_rasterised_mask_equals_testing_each_centre() -> None:
    """The rasterised mask marks exactly the cells whose centre lies in the polygons (a
    multipolygon with a hole and an island), whole and by row blocks."""
    outer = shapely.Polygon(
        [(0, 0), (4, 0.3), (3.7, 3), (0.4, 2.6)], holes=[[(1, 1), (2, 1.2), (1.6, 2)]]
    )
    island = shapely.Polygon([(5, 1), (5.9, 1.4), (5.3, 2.2)])
    geom = shapely.MultiPolygon([outer, island])
    g = make_grid((0.0, 0.0, 6.0, 3.0), resolution=0.0731)
    lon, lat = np.meshgrid(g.x, g.y)
    expected = shapely.intersects_xy(geom, lon, lat)
    assert 0 < expected.sum() < expected.size
    assert np.array_equal(region_mask(geom, g), expected)
    rows = slice(7, 19)
    assert np.array_equal(region_mask(geom, g, rows), expected[rows])


def test_region_mask_blockwise_equals_whole() -> None:
    g = make_grid(TRIANGLE.bounds, resolution=0.05)
    whole = region_mask(TRIANGLE, g)
    blocks = np.vstack([region_mask(TRIANGLE, g, r) for r in g.row_blocks(3)])
    assert np.array_equal(whole, blocks)
    # cell centres below the diagonal x + y < 31 are inside; centres exactly on it (this
    # grid puts some there) may fall either way, as in any rasteriser
    lon, lat = np.meshgrid(g.x, g.y)
    side = (lon - 10) + (lat - 20) - 1
    off = np.abs(side) > 1e-9
    assert np.array_equal(whole[off], side[off] < 0)
    assert 0.4 < whole.mean() < 0.6


def test_block_rows_bound_cells() -> None:
    assert block_rows_for(1000, max_block_cells=10_000) == 10
    assert block_rows_for(10**6, max_block_cells=10) == 1


def test_a_grid_across_the_meridian_masks_both_halves_of_a_split_region() -> None:
    halves = [shapely.box(179.5, 51.0, 180.0, 52.0), shapely.box(-180.0, 51.0, -179.5, 52.0)]
    grid = make_grid((179.5, 51.0, 180.5, 52.0), resolution=0.1)
    assert grid.x.max() > 180.0 and grid.frame_west == pytest.approx(0.0)
    mask = region_mask(shapely.MultiPolygon(halves), grid)
    assert mask.all()  # every centre lies in one of the halves
    west_only = region_mask(halves[0], grid)
    np.testing.assert_array_equal(west_only.any(axis=0), grid.x < 180.0)
