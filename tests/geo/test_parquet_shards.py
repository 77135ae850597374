"""A rank's shard of a parquet file: the ranks' row groups (or row ranges) cover every row once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.geo.parquet_shards import read_parquet_shard


def test_read_parquet_shard_row_groups_and_ranges(tmp_path: Path) -> None:
    table = pa.table({"a": np.arange(100, dtype=np.float64), "split": ["train", "val"] * 50})
    many = tmp_path / "many.parquet"
    pq.write_table(table, many, row_group_size=10)
    one = tmp_path / "one.parquet"
    pq.write_table(table, one)
    for path in (many, one):
        parts = [
            read_parquet_shard(path, columns=["a"], rank=k, world_size=3, batch_size=7)["a"]
            for k in range(3)
        ]
        assert sorted(np.concatenate(parts).tolist()) == list(range(100))
        assert max(len(p) for p in parts) <= 40
    import pyarrow.compute as pc

    train = read_parquet_shard(
        many, columns=["a"], rank=0, world_size=1, filters=pc.field("split") == "train"
    )["a"]
    assert train.tolist() == list(range(0, 100, 2))
