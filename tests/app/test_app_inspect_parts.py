"""The Inspect tab shows the parts of what a place gets: area, tile, test, offset, pull."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from apptest_helpers import AppFactory, assert_clean, open_tab, texts

from app import loaders


def test_inspect_shows_the_three_quantities_and_the_tiles_offset(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    path = root / name / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    # a cell whose tile has measured history
    rows, cols = np.nonzero(np.nan_to_num(grid.arrays["tile_history"]) == 1.0)
    assert rows.size
    point = (float(grid.lon[cols[0]]), float(grid.lat[rows[0]]))
    at = make_app(root, name)
    at.session_state["inspect_point"] = point
    at.run()
    inspect = open_tab(at, "Inspect a point")
    assert_clean(at)
    assert any(m.startswith("**What this place gets**") for m in texts(inspect, "markdown"))
    frames = [d.value for d in inspect.dataframe]
    parts = next(f for f in frames if "quantity" in f.columns)
    names = parts["quantity"].tolist()
    assert names[:3] == [
        "area: neighbourhood level f(x)",
        "tile: what a tile here typically gets",
        "test: one speed test",
    ]
    assert names[3] == "tile's offset (measured history)"
    assert names[4] == "of which its neighbours' pull"
    offset = float(grid.arrays["tile_offset"][rows[0], cols[0]])
    assert parts["median"].iloc[3] == f"×{10**offset:.2f}"
