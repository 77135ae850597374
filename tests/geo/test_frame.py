"""Longitudes across the 180° meridian: the shortest arc, frames, boxes and the scaling."""

from __future__ import annotations

import numpy as np
import pytest
import shapely

from geodbk.geo import quadkey as qk
from geodbk.geo.frame import (
    Scaling,
    frame_bounds,
    geometry_in_frame,
    longitude_arc,
    native_box,
    tile_polygons,
)

#: Alaska's shape as Census files hold it: split at 180°, the far Aleutians east of it.
ALASKA = shapely.MultiPolygon(
    [shapely.box(172.4, 51.2, 180.0, 53.0), shapely.box(-180.0, 51.2, -129.9, 71.4)]
)


def test_the_shortest_arc_crosses_the_meridian_only_when_that_is_shorter() -> None:
    assert longitude_arc([-160.2, -155.0, -157.0]) == (-160.2, -155.0)
    assert longitude_arc([170.0, -170.0]) == (170.0, 190.0)
    assert longitude_arc([-180.0, -130.0, 172.4, 180.0]) == (172.4, 230.0)
    assert longitude_arc([5.0]) == (5.0, 5.0)
    with pytest.raises(ValueError, match="no finite longitude"):
        longitude_arc([np.nan])


def test_frame_bounds_and_geometry_in_frame() -> None:
    hawaii = shapely.box(-178.4, 18.9, -154.8, 28.5)
    assert frame_bounds(hawaii) == hawaii.bounds
    assert geometry_in_frame(hawaii, west=-337.0) is hawaii  # nothing moves
    w, s, e, n = frame_bounds(ALASKA)
    assert (w, s, e, n) == pytest.approx((172.4, 51.2, 230.1, 71.4))
    whole = geometry_in_frame(ALASKA, west=0.5 * (w + e) - 180.0)
    assert whole.bounds == pytest.approx((172.4, 51.2, 230.1, 71.4))
    assert whole.area == pytest.approx(ALASKA.area)
    parts = np.array([*ALASKA.geoms, shapely.Point(-150.0, 60.0)], dtype=object)
    assert frame_bounds(parts) == pytest.approx((172.4, 51.2, 230.1, 71.4))  # arrays too


def test_native_box_splits_at_the_meridian() -> None:
    assert native_box(-10.0, 0.0, 10.0, 1.0).equals(shapely.box(-10.0, 0.0, 10.0, 1.0))
    split = native_box(170.0, 0.0, 190.0, 1.0)
    assert split.bounds == (-180.0, 0.0, 180.0, 1.0) and split.area == pytest.approx(20.0)
    assert split.contains(shapely.Point(-175.0, 0.5)) and split.contains(shapely.Point(175.0, 0.5))
    assert not split.contains(shapely.Point(0.0, 0.5))


def test_the_scaling_is_the_affine_map_and_continuous_across_the_meridian() -> None:
    plain = Scaling.from_bounds((-160.0, 18.0, -154.0, 23.0))
    lon = np.array([-160.0, -157.37, -154.0])
    x1, x2 = plain.scale(lon, [18.0, 20.0, 23.0])
    np.testing.assert_array_equal(x1, 2.0 * (lon - -160.0) / 6.0 - 1.0)
    np.testing.assert_allclose(x2, [-1.0, -0.2, 1.0])
    alaska = Scaling.from_bounds(frame_bounds(ALASKA))
    x1, _ = alaska.scale([172.4, 179.999, -179.999, -129.9], [60.0] * 4)
    assert x1[0] == pytest.approx(-1.0) and x1[-1] == pytest.approx(1.0)
    assert 0.0 < x1[2] - x1[1] < 1e-4  # neighbours either side of 180° stay neighbours
    assert Scaling.from_dict(alaska.to_dict()) == alaska


def test_tile_polygons_are_the_tiles_boxes_counter_clockwise() -> None:
    west, south, east, north = qk.tile_bounds(np.array([0, 65535]), np.array([0, 40000]), 16)
    polys = tile_polygons(west, south, east, north)
    np.testing.assert_allclose(
        np.array([p.bounds for p in polys]), np.column_stack([west, south, east, north])
    )
    assert all(p.exterior.is_ccw for p in polys)
