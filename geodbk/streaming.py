"""Streaming (out-of-core) training and prediction over parquet tables with pyarrow.

Memory is bounded by one record batch (prediction) or one row group plus the optimiser state
(training), not by the number of rows ``n``:

- :func:`iter_parquet_batches` yields column arrays of one record batch at a time
  (``pyarrow.dataset`` scanner, optional row-group subset for one rank of a data-parallel run).
- :func:`predict_table` streams a table through a fitted model into a parquet file of
  predictions (``mean``, ``std``) with a :class:`pyarrow.parquet.ParquetWriter`.
- :func:`train_streaming` trains with mini-batches drawn row group by row group: each epoch
  visits this rank's row groups in a seeded random order and shuffles the rows inside each group
  (a "shuffle buffer" of one row group). The KL term uses the global ``n``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["count_rows", "iter_parquet_batches", "predict_table", "train_streaming"]


def count_rows(path: str | Path, *, filters: Any = None) -> int:
    """Rows of a parquet file (matching ``filters``), counted without loading the table."""
    import pyarrow.dataset as ds

    return int(ds.dataset(path, format="parquet").count_rows(filter=filters))


def iter_parquet_batches(
    path: str | Path,
    *,
    columns: Sequence[str],
    filters: Any = None,
    batch_size: int = 65536,
    row_groups: Sequence[int] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield ``{column: numpy array}`` for each record batch of a parquet file.

    Parameters
    ----------
    path
        Parquet file.
    columns
        Columns to read.
    filters
        Optional :class:`pyarrow.compute.Expression` (e.g. ``pc.field("split") == "train"``).
    batch_size
        Maximum rows per batch.
    row_groups
        Only these row groups, in this order (default: all, in file order).
    """
    import pyarrow.dataset as ds

    dataset = ds.dataset(path, format="parquet")
    fragment = next(iter(dataset.get_fragments()))
    if row_groups is None:
        row_groups = range(fragment.metadata.num_row_groups)
    # One scanner per row group: a single scanner over the whole file reads ahead of a slow
    # consumer (measured: 1.2 GB peak for 10^7 rows), one group at a time stays flat.
    for group in row_groups:
        scanner = ds.Scanner.from_fragment(
            fragment.subset(row_group_ids=[int(group)]),
            schema=dataset.schema,
            columns=list(columns),
            filter=filters,
            batch_size=int(batch_size),
            use_threads=False,
        )
        for batch in scanner.to_batches():
            if batch.num_rows:
                yield {c: batch.column(c).to_numpy(zero_copy_only=False) for c in columns}


def predict_table(
    model: Any,
    src: str | Path,
    dst: str | Path,
    *,
    x_columns: Sequence[str] = ("x1", "x2"),
    keep_columns: Sequence[str] = (),
    filters: Any = None,
    batch_size: int = 262_144,
) -> int:
    """Predict every (filtered) row of ``src`` and write ``dst`` batch by batch.

    ``dst`` holds ``keep_columns``, ``mean`` and ``std`` (predictive, y's units). Rows with a
    non-finite input get NaN. Returns the number of rows written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    n = 0
    try:
        for cols in iter_parquet_batches(
            src, columns=[*x_columns, *keep_columns], filters=filters, batch_size=batch_size
        ):
            X = np.column_stack([np.asarray(cols[c], dtype=np.float64) for c in x_columns])
            ok = np.isfinite(X).all(axis=1)
            mean = np.full(len(X), np.nan)
            std = np.full(len(X), np.nan)
            if ok.any():
                pred = model.predict(X[ok], chunk_size=min(batch_size, 65536))
                mean[ok], std[ok] = pred.mean, pred.std
            table = pa.table({**{c: cols[c] for c in keep_columns}, "mean": mean, "std": std})
            if writer is None:
                writer = pq.ParquetWriter(str(dst), table.schema)
            writer.write_table(table)
            n += len(X)
    finally:
        if writer is not None:
            writer.close()
    return n


def train_streaming(
    model: Any,
    path: str | Path,
    *,
    x_columns: Sequence[str],
    y_column: str,
    y_mean: float,
    y_std: float,
    config: Any,
    filters: Any = None,
    x_val: torch.Tensor | None = None,
    y_val: torch.Tensor | None = None,
    rank: int = 0,
    world_size: int = 1,
    n_global: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """Train ``model`` (a :class:`geodbk.model.DBKModel`) without loading the table.

    Each epoch: this rank's row groups (``rank, rank + W, ...``) in an order drawn from
    ``(config.seed, epoch)``, each group read with its columns only, its rows shuffled and cut
    into mini-batches of ``config.batch_size``. Targets are standardised with ``y_mean`` and
    ``y_std`` (computed beforehand, e.g. in one streaming pass). With a process group, wrap
    ``model`` yourself or average gradients; this function is the single-process loop.

    Parameters
    ----------
    model
        The model (left at the epoch with the best validation NLL, or the last epoch).
    path
        Parquet file.
    x_columns, y_column
        Input and target columns.
    y_mean, y_std
        Target standardisation.
    config
        A :class:`geodbk.training.TrainConfig` (objective, batch size, epochs, lr, patience...).
    filters
        Row filter (e.g. the ``train`` split).
    x_val, y_val
        Validation data (standardised targets), held in memory; ``None``: no selection.
    rank, world_size
        Which row groups this process reads.
    n_global
        Training rows over all ranks (the KL's ``n``); default: counted from the file.
    dtype
        Tensor dtype of the batches.

    Returns
    -------
    list of dict
        The history (``epoch``, ``train_loss``, ``val_nll``, ``seconds``).
    """
    import pyarrow.parquet as pq

    from geodbk.training import _make_optimizer, batch_loss, evaluate_nll

    n = int(n_global) if n_global is not None else count_rows(path, filters=filters)
    groups = np.arange(pq.ParquetFile(path).num_row_groups)[rank::world_size]
    optimizer = _make_optimizer(model, config)
    device = next(model.parameters()).device
    history: list[dict[str, Any]] = []
    best: tuple[float, dict[str, torch.Tensor]] | None = None
    bad = 0
    cols = [*x_columns, y_column]
    for epoch in range(int(config.epochs)):
        t0 = time.perf_counter()
        rng = np.random.default_rng([int(config.seed), epoch, rank])
        total, seen = 0.0, 0
        model.train()
        for g in rng.permutation(groups):
            for part in iter_parquet_batches(
                path, columns=cols, filters=filters, row_groups=[int(g)], batch_size=1 << 30
            ):
                X = np.column_stack([np.asarray(part[c], dtype=np.float64) for c in x_columns])
                y = (np.asarray(part[y_column], dtype=np.float64) - y_mean) / y_std
                ok = np.isfinite(X).all(axis=1) & np.isfinite(y)
                order = rng.permutation(np.flatnonzero(ok))
                xt = torch.as_tensor(X[order], dtype=dtype, device=device)
                yt = torch.as_tensor(y[order], dtype=dtype, device=device)
                for i in range(0, len(order), int(config.batch_size)):
                    xb, yb = xt[i : i + config.batch_size], yt[i : i + config.batch_size]
                    if xb.shape[0] < 2 and config.objective == "dppgp":
                        continue
                    optimizer.zero_grad(set_to_none=True)
                    loss = batch_loss(model, xb, yb, n=n, config=config)
                    loss.backward()
                    optimizer.step()
                    total += float(loss.detach()) * int(xb.shape[0])
                    seen += int(xb.shape[0])
        model.eval()
        train_loss = total / max(seen, 1)
        val = None
        if x_val is not None and y_val is not None and len(y_val):
            val = evaluate_nll(model, x_val, y_val) + math.log(y_std)
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                "val_nll": val,
                "seconds": time.perf_counter() - t0,
            }
        )
        score = val if val is not None else train_loss
        if best is None or score < best[0]:
            best = (score, {k: v.detach().clone() for k, v in model.state_dict().items()})
            bad = 0
        else:
            bad += 1
            if bad >= int(config.patience):
                break
    if best is not None:
        model.load_state_dict(best[1])
    model.eval()
    return history
