"""Longitudes moved by whole turns (pure numpy, importable without shapely)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from geodbk.geo.longitude import native_longitude, wrap_longitude, wrap_near


def test_wrapping_moves_only_longitudes_outside_the_turn() -> None:
    lon = np.array([-157.3, 0.1, 179.99, -180.0])
    np.testing.assert_array_equal(wrap_longitude(lon, west=-180.0), lon)  # bit for bit
    moved = wrap_longitude(np.array([-170.0, 175.0, 190.0]), west=172.0)
    np.testing.assert_allclose(moved, [190.0, 175.0, 190.0])
    np.testing.assert_allclose(
        native_longitude([190.0, -190.0, 180.0, 540.5]), [-170, 170, 180, -179.5]
    )
    np.testing.assert_allclose(wrap_near([-170.0, 10.0], centre=180.0), [190.0, 10.0])


def test_longitudes_and_quadkeys_import_without_shapely() -> None:
    """The model code (the tile effect, the local layer) imports quadkeys and longitudes on
    machines without the geo stack."""
    code = (
        "import sys; sys.modules['shapely'] = None\n"
        "import geodbk.geo.quadkey, geodbk.geo.longitude, geodbk.tile_effect, geodbk.local_layer\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
