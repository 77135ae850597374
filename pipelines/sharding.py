"""Per-rank reading of ``tiles.parquet`` for ``geodbk train --distributed``.

Each rank streams only its own row groups (or row range) of the ``train`` split and keeps only
the model's columns, so no rank holds the full table; every rank reads the whole ``val`` split
(it is small and identical validation keeps the best-epoch choice identical on all ranks).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from geodbk.distributed import DistributedContext, ShardPlan, gather_sizes, read_parquet_shard
from geodbk.errors import DataError
from pipelines.rundir import RunDir, target_spec

log = logging.getLogger("geodbk")

__all__ = ["load_rank_split", "split_rows"]


def split_rows(
    rd: RunDir, target: str, split: str, *, rank: int = 0, world_size: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Finite ``(X (n, 2), y (n,))`` rows of ``split`` in shard ``rank`` of ``world_size``.

    Shards follow :func:`geodbk.distributed.read_parquet_shard` (row groups round-robin, or
    contiguous row ranges), so the shards of all ranks concatenated in rank order are the whole
    split.
    """
    import pyarrow.compute as pc

    cols = ["x1", "x2", target_spec(target).log_column]
    data = read_parquet_shard(
        rd.tiles,
        columns=cols,
        rank=rank,
        world_size=world_size,
        filters=pc.field("split") == split,
    )
    arr = np.column_stack([np.asarray(data[c], dtype=np.float64) for c in cols])
    arr = arr[np.isfinite(arr).all(axis=1)]
    return arr[:, :2], arr[:, 2]


def load_rank_split(
    rd: RunDir, target: str, *, ctx: DistributedContext
) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], ShardPlan]:
    """This rank's training rows, the full validation rows, the table metadata and the plan.

    Returns
    -------
    tuple
        ``(metadata, (X, y), (X_val, y_val), plan)`` with ``X`` (n_rank, 2) = ``x1, x2`` and
        ``y`` the ``log10`` target; ``plan`` holds every rank's shard size.

    Raises
    ------
    DataError
        When the table lacks a column or a rank gets fewer than 2 training rows.
    """
    import pyarrow.parquet as pq

    from geodbk.geo.table import read_table_metadata

    spec = target_spec(target)
    cols = ["x1", "x2", spec.log_column]
    names = set(pq.read_schema(rd.tiles).names)
    missing = [c for c in [*cols, "split"] if c not in names]
    if missing:
        raise DataError(f"{rd.tiles} has no {missing} column(s); re-run `geodbk ingest`")
    meta = read_table_metadata(rd.tiles)
    X, y = split_rows(rd, target, "train", rank=ctx.rank, world_size=ctx.world_size)
    Xv, yv = split_rows(rd, target, "val")
    sizes = gather_sizes(len(y))
    if min(sizes) < 2:
        raise DataError(
            f"{rd.tiles}: a rank got fewer than 2 training rows (shard sizes {sizes}); "
            "use fewer processes"
        )
    log.info(
        "rank %d of %d: %d training rows of %d (val %d)",
        ctx.rank,
        ctx.world_size,
        len(y),
        sum(sizes),
        len(yv),
    )
    return meta, (X, y), (Xv, yv), ShardPlan(sizes, rank=ctx.rank)
