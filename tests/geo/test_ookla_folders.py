"""Scans of ``--tiles`` folders holding more than tiles: geodbk run directories (skipped) and
other tables (named, with the folder they were found in)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from geo_helpers import write_hive

from geodbk.errors import DataError
from geodbk.geo import ookla


def test_run_directories_and_excluded_folders_are_left_out(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    tile_file = write_hive(tmp_path, tiles_df, kind="mobile", year=2023, q=4)
    run = tmp_path / "old_run"
    (run / "models" / "download").mkdir(parents=True)
    tiles_df.to_parquet(run / "tiles.parquet")
    (run / "region.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    (run / "models" / "download" / "history.csv").write_text("epoch,train_loss\n0,1.0\n")
    new = tmp_path / "new_run"
    new.mkdir()
    (new / "points.csv").write_text("lon,lat\n0,0\n")
    found = ookla.discover_tile_files([tmp_path], exclude=[new])
    assert [f.path for f in found] == [tile_file] and found[0].folder == tmp_path
    assert len(ookla.read_tiles([tmp_path], exclude=[new]).frame) == len(tiles_df)


def test_a_table_that_is_not_tiles_names_the_folder_it_was_found_in(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    write_hive(tmp_path, tiles_df, kind="mobile", year=2023, q=4)
    other = tmp_path / "notes_2023Q4.csv"
    other.write_text("epoch,train_loss\n0,1.0\n")
    with pytest.raises(DataError, match="missing column") as info:
        ookla.read_tiles([tmp_path])
    message = str(info.value)
    assert str(other) in message and f"--tiles folder {tmp_path}" in message
    assert "move it out of that folder" in message
    with pytest.raises(DataError, match="missing column") as info:
        ookla.read_tiles([other])  # given itself: no folder to speak of
    assert "--tiles folder" not in str(info.value)


def test_a_run_directory_given_as_tiles_is_refused(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    tiles_df.to_parquet(tmp_path / "tiles.parquet")
    (tmp_path / "region.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    with pytest.raises(DataError, match="a geodbk run directory") as info:
        ookla.discover_tile_files([tmp_path])
    assert str(tmp_path) in str(info.value)
