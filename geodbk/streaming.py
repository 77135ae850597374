"""Out-of-core training: mini-batches drawn window by window from a table's row groups.

:func:`train_streaming` reads its rows from a :class:`geodbk.batches.RowGroupSource` (for a
parquet file :class:`geodbk.geo.parquet_batches.ParquetRowGroups`), so memory is bounded by
one shuffle window of row groups plus the optimiser state, not by the number of rows ``n``:
each epoch visits this rank's row groups in a seeded random order, a window of
``shuffle_groups`` groups at a time, and shuffles the rows inside each window (a shuffle
buffer). The KL term uses the global ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geodbk.batches import InputFn, RowGroupSource, stack_inputs
from geodbk.steps import minibatch_step
from geodbk.training import (
    _make_optimizer,
    checkpoint_options,
    fit,
    shuffled_batches,
    validator,
)
from geodbk.validation import counts_or_one

__all__ = ["train_streaming"]


def train_streaming(
    model: Any,
    source: RowGroupSource,
    *,
    x_columns: Sequence[str],
    y_column: str,
    y_mean: float,
    y_std: float,
    config: Any,
    x_val: torch.Tensor | None = None,
    y_val: torch.Tensor | None = None,
    rank: int = 0,
    world_size: int = 1,
    n_global: int | None = None,
    dtype: torch.dtype = torch.float32,
    inputs: InputFn | None = None,
    read_columns: Sequence[str] = (),
    tests_column: str | None = None,
    tests_val: torch.Tensor | None = None,
    nll_offset: float | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
    callback: Callable[[dict[str, Any]], None] | None = None,
    shuffle_groups: int = 16,
) -> list[dict[str, Any]]:
    """Train ``model`` (a :class:`geodbk.model.DBKModel`) without loading the table.

    Each epoch: this rank's row groups (``rank, rank + W, ...``) in an order drawn from
    ``(config.seed, epoch, rank)``, cut into windows of ``shuffle_groups`` groups; a window's
    finite rows (its groups in file order) are cut into mini-batches by
    :func:`geodbk.training.shuffled_batches` with a generator seeded by ``config.seed + rank``.
    With one window this is the batch order of :func:`geodbk.training.train_model` on the same
    rows. Targets are standardised with ``y_mean`` and ``y_std`` (computed beforehand, e.g. in
    one streaming pass). Selection, early stopping, checkpoints and errors are those of
    :func:`geodbk.training.fit`. With a process group, wrap ``model`` yourself or average
    gradients; this function is the single-process loop.

    Parameters
    ----------
    model
        The model (left at the epoch with the best validation NLL, or the last epoch).
    source
        The training rows, read a window of row groups at a time (e.g.
        :class:`geodbk.geo.parquet_batches.ParquetRowGroups`: a parquet file's rows matching a
        filter, such as the ``train`` split).
    x_columns, y_column
        Input and target columns.
    y_mean, y_std
        Target standardisation.
    config
        A :class:`geodbk.training.LoopConfig` (objective, batch size, epochs, lr, patience...).
    x_val, y_val
        Validation data (standardised targets), held in memory; ``None``: no selection.
    rank, world_size
        Which row groups this process reads.
    n_global
        Training rows over all ranks (the KL's ``n``); default: ``source.count_rows()``.
    dtype
        Tensor dtype of the batches.
    inputs, read_columns
        Map a batch's columns to the model inputs (default: stack ``x_columns``), e.g. to add
        the time input from the ``quarter`` column; ``read_columns``: the extra columns it reads.
    tests_column, tests_val
        Noise covariate: the loss uses ``s2_i = model.noise_var(tests_i)`` per row
        (tests-aware noise); ``tests_val`` for the validation rows.
    nll_offset
        Added to the recorded validation NLL (default ``log y_std``: y's units).
    checkpoint_dir, resume
        ``checkpoint_dir/last.pt`` after every epoch (with the generator's state); ``resume``
        continues from it, equal to an uninterrupted run.
    progress, callback
        Progress on rank 0; a function called with each epoch's history record.
    shuffle_groups
        Row groups read, concatenated and shuffled together (the shuffle window). Tile
        tables are written sorted by quarter and quadkey in row groups of 65,536 rows, so a
        window of 16 randomly chosen groups (~1M rows, ~40 MB for five float64 columns) mixes
        quarters and regions within each mini-batch stream; memory is bounded by the window.

    Returns
    -------
    list of dict
        The history (``epoch``, ``train_loss``, ``val_nll``, ``seconds``).
    """
    n = int(n_global) if n_global is not None else source.count_rows()
    groups = np.arange(source.num_groups)[rank::world_size]
    optimizer = _make_optimizer(model, config)
    device = next(model.parameters()).device
    to_x = inputs or stack_inputs(x_columns)
    covariate = [tests_column] if tests_column else []
    cols = list(dict.fromkeys([*x_columns, *read_columns, y_column, *covariate]))
    size, window = int(config.batch_size), max(int(shuffle_groups), 1)
    gen = torch.Generator(device="cpu").manual_seed(int(config.seed) + rank)

    def epoch_step(epoch: int) -> float:
        total, seen, steps = 0.0, 0, 0
        order_g = np.random.default_rng([int(config.seed), epoch, rank]).permutation(groups)
        for w in range(0, len(order_g), window):
            part = source.read(sorted(int(g) for g in order_g[w : w + window]), cols)
            if len(part[y_column]) == 0:
                continue
            X = to_x(part)
            y = (np.asarray(part[y_column], dtype=np.float64) - y_mean) / y_std
            rows = np.flatnonzero(np.isfinite(X).all(axis=1) & np.isfinite(y))
            xt = torch.as_tensor(X[rows], dtype=dtype, device=device)
            yt = torch.as_tensor(y[rows], dtype=dtype, device=device)
            tt = None
            if tests_column:
                t_np = counts_or_one(part[tests_column])[rows]
                tt = torch.as_tensor(t_np, dtype=dtype, device=device)
            for idx in shuffled_batches(len(rows), size, gen):
                if len(idx) < 2 and config.objective == "dppgp":
                    continue
                idx = idx.to(device)
                tb = None if tt is None else tt[idx]
                total += minibatch_step(
                    model, optimizer, xt[idx], yt[idx], n=n, config=config, batch=steps, tests=tb
                )
                seen += len(idx)
                steps += 1
        return total / max(seen, 1)

    return fit(
        model,
        epoch_step,
        optimizer=optimizer,
        epochs=int(config.epochs),
        patience=int(config.patience),
        validate=validator(model, config, x_val, y_val, tests_val),
        nll_offset=math.log(y_std) if nll_offset is None else float(nll_offset),
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        options=checkpoint_options(config),
        progress=progress,
        is_main=rank == 0,
        callback=callback,
        name="streaming",
        generator=gen,
    ).history
