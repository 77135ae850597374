"""Probes of Ookla tile files whose quadkeys were damaged on the way: stored as numbers (leading
zeros lost) or cut to fewer digits. Neither may pass as "outside the region" or as coarser
tiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from geo_helpers import make_tiles

from geodbk.errors import DataError
from geodbk.geo import ookla

NAME = "2023-01-01_performance_mobile_tiles"


def test_integer_quadkeys_get_their_leading_zeros_back(tmp_path: Path) -> None:
    tiles = make_tiles(40)  # near Honolulu: every quadkey starts with 0
    assert tiles["quadkey"].str.startswith("0").all()
    damaged = tiles.assign(quadkey=tiles["quadkey"].astype("int64"))
    path = tmp_path / f"{NAME}.parquet"
    damaged.to_parquet(path)
    read = ookla.read_tiles([path])
    assert sorted(read.frame["quadkey"]) == sorted(tiles["quadkey"])
    assert not read.dropped  # nothing lost, nothing called "outside"


def test_csv_quadkeys_without_their_zeros_are_padded_and_cut_ones_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CSV's quadkeys are text whatever wrote them: 14-15 digits are numbers that lost their
    leading zeros (padded, logged, as in a parquet column of numbers); 13 or fewer were cut."""
    tiles = make_tiles(30)
    path = tmp_path / f"{NAME}.csv"
    tiles.assign(quadkey=tiles["quadkey"].str.lstrip("0")).drop(columns="tile").to_csv(
        path, index=False
    )
    read = ookla.read_tiles([path])
    assert sorted(read.frame["quadkey"]) == sorted(tiles["quadkey"]) and not read.dropped
    assert "zero-padded back to 16 digits" in caplog.text
    tiles.assign(quadkey=tiles["quadkey"].str[:13]).drop(columns="tile").to_csv(path, index=False)
    with pytest.raises(DataError, match="13-digit quadkeys") as info:
        ookla.read_tiles([path])
    assert str(path) in str(info.value) and "'quadkey'" in str(info.value)


def test_quadkeys_cut_to_zoom_10_are_refused(tmp_path: Path) -> None:
    tiles = make_tiles(30)
    path = tmp_path / f"{NAME}.parquet"
    tiles.assign(quadkey=tiles["quadkey"].str[:10]).to_parquet(path)
    with pytest.raises(DataError, match="zoom 10"):
        ookla.read_tiles([path])


def test_a_few_short_quadkeys_are_dropped_and_counted(tmp_path: Path) -> None:
    tiles = make_tiles(30)
    keys = tiles["quadkey"].to_numpy(dtype=object)
    keys[:3] = [k[:12] for k in keys[:3]]
    path = tmp_path / f"{NAME}.parquet"
    tiles.assign(quadkey=keys).to_parquet(path)
    read = ookla.read_tiles([path])
    assert read.dropped == {"quadkey_not_zoom16": 3}
    assert len(read.frame) == 27 and np.all(read.frame["quadkey"].str.len() == 16)
