"""The tile table: splits, write/read round trip, validation errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from geo_helpers import make_tiles

from geodbk.errors import DataError, RunDirectoryError
from geodbk.geo import ookla, table
from geodbk.geo.frame import Scaling


def test_random_split_exact_and_seeded() -> None:
    a = table.random_split(1000, seed=0)
    assert [(a == s).sum() for s in table.SPLITS] == [800, 100, 100]
    assert (a == table.random_split(1000, seed=0)).all()
    assert (a != table.random_split(1000, seed=1)).any()
    with pytest.raises(DataError):
        table.random_split(10, fractions=(0.5, 0.5, 0.5))


def test_block_split_holds_out_whole_blocks() -> None:
    rng = np.random.default_rng(0)
    lon = rng.uniform(0, 1, 5000)
    lat = rng.uniform(0, 1, 5000)
    labels, info = table.block_split(lon, lat, seed=3, block_size=0.1)
    blocks = np.floor(lon / 0.1) * 1000 + np.floor(lat / 0.1)
    for b in np.unique(blocks):
        assert len(set(labels[blocks == b])) == 1
    frac = {s: (labels == s).mean() for s in table.SPLITS}
    assert 0.08 < frac["test"] < 0.16 and 0.08 < frac["val"] < 0.16
    assert info["blocks"]["train"] > 50


def test_tile_split_holds_out_every_quarter_of_a_tile() -> None:
    rng = np.random.default_rng(0)
    keys = np.array([f"{i:016d}" for i in rng.integers(0, 2000, 9000)])  # ~4.5 rows per tile
    labels, info = table.tile_split(keys, seed=5)
    for key in np.unique(keys)[:300]:
        assert len(set(labels[keys == key])) == 1
    tiles = np.unique(keys).size
    assert sum(info["tiles"].values()) == tiles
    assert info["tiles"]["test"] == round(0.1 * tiles) == info["tiles"]["val"]
    again, _ = table.tile_split(keys, seed=5)
    other, _ = table.tile_split(keys, seed=6)
    assert (labels == again).all() and (labels != other).any()
    test_tiles = set(keys[labels == "test"])
    assert not test_tiles & set(keys[labels == "train"])


def test_prepare_tile_table_with_the_tile_split(tmp_path: Path) -> None:
    _, meta = _prepared(tmp_path, split="tile")
    info = meta["split"]
    assert info["kind"] == "tile" and info["unit"] == "tile"
    assert sum(info["counts"].values()) == 200 and info["tiles"]["test"] == 20


def _prepared(tmp_path: Path, split: str = "random") -> tuple[Path, dict]:
    path = tmp_path / "2023-01-01_performance_mobile_tiles.parquet"
    make_tiles(200).to_parquet(path)
    tiles = ookla.read_tiles([path]).frame
    scaling = Scaling.from_bounds(tiles.total_bounds)
    t, info = table.prepare_tile_table(
        tiles, scaling=scaling, urban=np.arange(len(tiles)) % 3 == 0, split=split, seed=0
    )
    meta = {"scaling": scaling.to_dict(), "split": info, "counts": {"kept": len(t)}}
    out = tmp_path / "run" / "tiles.parquet"
    table.write_tile_table(t, out, meta)
    return out, meta


def test_round_trip(tmp_path: Path) -> None:
    out, meta = _prepared(tmp_path)
    t, m = table.read_tile_table(out.parent)  # a run directory works too
    assert m["schema_version"] == 1 and m["scaling"] == meta["scaling"]
    assert list(t.columns[: len(table.COLUMNS)]) == list(table.COLUMNS)
    assert t.crs == "EPSG:4326" and t["urban"].dtype == bool
    assert t["tests"].dtype == np.int64 and t["devices"].dtype == np.int64
    assert t["x1"].between(-1, 1).all() and t["x2"].between(-1, 1).all()
    np.testing.assert_allclose(t["log10_download"], np.log10(t["avg_d_kbps"]))
    assert set(t["split"]) == {"train", "val", "test"}
    assert b"geo" in pq.read_schema(out).metadata  # GeoParquet
    plain, _ = table.read_tile_table(out, geometry=False)  # what training reads
    assert "geometry" not in plain.columns and not hasattr(plain, "crs")
    assert plain.equals(pd.DataFrame(t.drop(columns="geometry")))


def test_read_errors(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="geodbk ingest"):
        table.read_tile_table(tmp_path / "nothing.parquet")
    junk = tmp_path / "junk.parquet"
    junk.write_text("junk")
    with pytest.raises(DataError, match="not a readable parquet"):
        table.read_tile_table(junk)
    plain = tmp_path / "plain.parquet"
    make_tiles(5).to_parquet(plain)
    with pytest.raises(DataError, match="not a geodbk tile table"):
        table.read_tile_table(plain)


def test_version_and_content_validation(tmp_path: Path) -> None:
    out, _ = _prepared(tmp_path)
    arrow = pq.read_table(out)
    kv = dict(arrow.schema.metadata)
    kv[b"geodbk"] = json.dumps({"schema_version": 99}).encode()
    pq.write_table(arrow.replace_schema_metadata(kv), tmp_path / "v99.parquet")
    with pytest.raises(DataError, match="schema version 99"):
        table.read_tile_table(tmp_path / "v99.parquet")
    kv[b"geodbk"] = json.dumps({"schema_version": 1}).encode()
    pq.write_table(
        arrow.drop_columns(["split"]).replace_schema_metadata(kv), tmp_path / "nosplit.parquet"
    )
    with pytest.raises(DataError, match="lacks column"):
        table.read_tile_table(tmp_path / "nosplit.parquet")
