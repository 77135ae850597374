"""Per-rank reading of ``tiles.parquet`` for ``geodbk train --distributed``.

Each rank streams only its own row groups (or row range) of the ``train`` split and keeps only
the model's columns, so no rank holds the full table; every rank reads the whole ``val`` split
(it is small and identical validation keeps the best-epoch choice identical on all ranks).

Time-aware models (``--time``): each rank also reads the ``quarter`` column of its rows and
appends ``t``; the time scaling comes from the whole table's ``quarter``/``split`` columns
(:func:`read_time_axis`), so it is the same on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from geodbk.distributed import DistributedContext, ShardPlan, gather_sizes
from geodbk.errors import DataError
from geodbk.geo.parquet_batches import count_rows
from geodbk.geo.parquet_shards import read_parquet_shard
from geodbk.geo.table import read_table_metadata
from geodbk.geo.timeaxis import TimeScaling
from geodbk.validation import counts_or_one
from pipelines.rundir import RunDir, target_spec
from pipelines.training_data import resolve_noise, time_axis

log = logging.getLogger("geodbk")

__all__ = [
    "load_rank_split",
    "read_time_axis",
    "split_rows",
    "streaming_inputs",
]


def read_time_axis(rd: RunDir) -> tuple[TimeScaling, list[str]]:
    """:func:`pipelines.training_data.time_axis` from the ``quarter`` and ``split`` columns only.

    Reads two columns of ``tiles.parquet`` (cheap, no geometry), so every rank computes the same
    :class:`~geodbk.geo.timeaxis.TimeScaling` and quarter list without the full table.
    """
    import pyarrow.parquet as pq

    names = set(pq.read_schema(rd.tiles).names)
    missing = [c for c in ("quarter", "split") if c not in names]
    if missing:
        raise DataError(f"{rd.tiles} has no {missing} column(s); --time needs them")
    table = pq.read_table(rd.tiles, columns=["quarter", "split"])
    return time_axis(
        table.column("quarter").to_numpy(zero_copy_only=False),
        table.column("split").to_numpy(zero_copy_only=False),
        source=rd.tiles,
    )


def split_rows(
    rd: RunDir,
    target: str,
    split: str,
    *,
    rank: int = 0,
    world_size: int = 1,
    time_scaling: TimeScaling | None = None,
    covariates: Sequence[str] = (),
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Finite ``(X, y (n,), covariates)`` rows of ``split`` in shard ``rank`` of
    ``world_size``.

    ``X`` is ``[x1, x2]`` (n, 2), or ``[x1, x2, t]`` (n, 3) with ``t =
    time_scaling.scale(quarter)`` for a time-aware model. ``covariates`` names the noise
    model's columns (:func:`pipelines.training_data.noise_columns`): ``tests`` and ``devices``
    are returned as counts (missing or below 1 set to 1), ``urban`` as bool, each (n,). Shards
    follow :func:`geodbk.geo.parquet_shards.read_parquet_shard` (row groups round-robin, or contiguous
    row ranges), so the shards of all ranks concatenated in rank order are the whole split.
    """
    import pyarrow.compute as pc

    cols = ["x1", "x2", target_spec(target).log_column]
    extra = (["quarter"] if time_scaling is not None else []) + list(covariates)
    data = read_parquet_shard(
        rd.tiles,
        columns=cols + extra,
        rank=rank,
        world_size=world_size,
        filters=pc.field("split") == split,
    )
    arr = np.column_stack([np.asarray(data[c], dtype=np.float64) for c in cols])
    ok = np.isfinite(arr).all(axis=1)
    X = _input_map(time_scaling)(data)
    covs = {
        c: (
            np.asarray(data[c], dtype=bool)
            if c == "urban"
            else counts_or_one(np.asarray(data[c], dtype=np.float64))
        )[ok]
        for c in covariates
    }
    return X[ok], arr[ok, 2], covs


def load_rank_split(
    rd: RunDir,
    target: str,
    *,
    ctx: DistributedContext,
    time_scaling: TimeScaling | None = None,
    covariates: Sequence[str] = (),
) -> tuple[
    dict[str, Any],
    tuple[np.ndarray, np.ndarray],
    tuple[np.ndarray, np.ndarray],
    ShardPlan,
    dict[str, np.ndarray],
]:
    """This rank's training rows, the full validation rows, the table metadata and the plan.

    Returns
    -------
    tuple
        ``(metadata, (X, y), (X_val, y_val), plan, noise_kw)`` with ``X`` (n_rank, 2) =
        ``x1, x2`` and ``y`` the ``log10`` target (``[x1, x2, t]``, (n_rank, 3), with
        ``time_scaling``); ``plan`` holds every rank's shard size; ``noise_kw`` holds, for each
        of ``covariates``, this rank's rows (``"tests"``) and all validation rows
        (``"tests_val"``), the ``fit`` keywords of the noise model.

    Raises
    ------
    DataError
        When the table lacks a column or a rank gets fewer than 2 training rows.
    """
    import pyarrow.parquet as pq

    spec = target_spec(target)
    cols = ["x1", "x2", spec.log_column] + (["quarter"] if time_scaling is not None else [])
    names = set(pq.read_schema(rd.tiles).names)
    missing = [c for c in [*cols, "split", *covariates] if c not in names]
    if missing:
        raise DataError(f"{rd.tiles} has no {missing} column(s); re-run `geodbk ingest`")
    meta = read_table_metadata(rd.tiles)
    X, y, cov = split_rows(
        rd,
        target,
        "train",
        rank=ctx.rank,
        world_size=ctx.world_size,
        time_scaling=time_scaling,
        covariates=covariates,
    )
    Xv, yv, cov_val = split_rows(
        rd, target, "val", time_scaling=time_scaling, covariates=covariates
    )
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
    noise_kw = {**cov, **{f"{c}_val": v for c, v in cov_val.items()}}
    return meta, (X, y), (Xv, yv), ShardPlan(sizes, rank=ctx.rank), noise_kw


def streaming_inputs(
    rd: RunDir, target: str, cfg: Any
) -> tuple[Any, dict[str, Any], TimeScaling | None, list[str], dict[str, Any]]:
    """What ``geodbk train --streaming`` needs, read without loading the train split.

    Reads the table footer (metadata, schema), the ``quarter``/``split`` columns for a
    time-aware model, and the (small) validation split in memory.

    Returns
    -------
    tuple
        ``(cfg, metadata, time_scaling, quarters, stream)``: ``cfg`` with ``noise: auto``
        resolved from the schema; ``stream`` holds ``filters`` (train rows), ``inputs`` (batch
        columns -> model inputs), ``read_columns``, ``X_val``, ``y_val``, ``tests_val`` and
        ``n_train`` (finite training rows, counted in a streaming pass).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    spec = target_spec(target)
    names = set(pq.read_schema(rd.tiles).names)
    missing = [c for c in ("x1", "x2", spec.log_column, "split") if c not in names]
    if missing:
        raise DataError(f"{rd.tiles} has no {missing} column(s); re-run `geodbk ingest`")
    meta = read_table_metadata(rd.tiles)
    cfg = resolve_noise(cfg, names, source=rd.tiles, devices_supported=False)
    time_scaling: TimeScaling | None = None
    quarters: list[str] = []
    if cfg.time:
        time_scaling, quarters = read_time_axis(rd)
    val_cols = ["x1", "x2", spec.log_column, "split"]
    val_cols += ["quarter"] if time_scaling is not None else []
    val_cols += ["tests"] if cfg.noise == "tests" else []
    val = pq.read_table(rd.tiles, columns=val_cols, filters=pc.field("split") == "val")
    cols = {c: val.column(c).to_numpy(zero_copy_only=False) for c in val_cols}
    inputs = _input_map(time_scaling)
    Xv = inputs(cols) if val.num_rows else np.zeros((0, 2 if time_scaling is None else 3))
    yv = np.asarray(cols[spec.log_column], dtype=np.float64)
    ok = np.isfinite(yv) & np.isfinite(Xv).all(axis=1)
    tests_val = None
    if cfg.noise == "tests":
        tests_val = np.maximum(np.nan_to_num(np.asarray(cols["tests"], float), nan=1.0), 1.0)[ok]
    train = (
        (pc.field("split") == "train")
        & pc.is_finite(pc.field(spec.log_column))
        & pc.is_finite(pc.field("x1"))
        & pc.is_finite(pc.field("x2"))
    )
    n_train = count_rows(rd.tiles, filters=train)
    if n_train < 2:
        raise DataError(f"{rd.tiles}: fewer than 2 usable training rows for {target}")
    stream = {
        "filters": train,
        "inputs": inputs,
        "read_columns": ["quarter"] if time_scaling is not None else [],
        "X_val": Xv[ok],
        "y_val": yv[ok],
        "tests_val": tests_val,
        "n_train": n_train,
    }
    log.info("streaming %d training rows of %s (val %d in memory)", n_train, rd.tiles, ok.sum())
    return cfg, meta, time_scaling, quarters, stream


def _input_map(time_scaling: TimeScaling | None) -> Any:
    """Batch columns -> model inputs: ``[x1, x2]`` or ``[x1, x2, t]`` (t from ``quarter``)."""

    def inputs(cols: dict[str, np.ndarray]) -> np.ndarray:
        X = np.column_stack(
            [np.asarray(cols["x1"], dtype=np.float64), np.asarray(cols["x2"], dtype=np.float64)]
        )
        if time_scaling is None:
            return X
        quarter = np.asarray(cols["quarter"], dtype=object).astype(str)
        t = np.asarray(time_scaling.scale(quarter), dtype=np.float64).reshape(-1, 1)
        return np.hstack([X, t])

    return inputs
