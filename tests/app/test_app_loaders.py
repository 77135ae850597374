"""The dashboard's tile-table reader: tile bounds from the geometry and from the quadkey agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from app.loaders import _tile_bounds


def test_quadkey_bounds_match_the_geometry(tiny_run: Path) -> None:
    frame = pq.read_table(tiny_run / "tiles.parquet").to_pandas().head(500)
    geometry = frame.pop("geometry")
    from_geometry = _tile_bounds(frame, geometry)
    from_quadkey = _tile_bounds(frame, None)
    np.testing.assert_allclose(from_quadkey.to_numpy(), from_geometry.to_numpy(), atol=1e-9)
    assert (from_quadkey["east"] > from_quadkey["west"]).all()
    assert (from_quadkey["north"] > from_quadkey["south"]).all()
