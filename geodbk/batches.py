"""Tables read a row group at a time, and the math on one batch of columns, without file I/O.

A batch is ``{column: numpy array}`` (rows of a table). A :class:`RowGroupSource` serves a
table's row groups as batches; the out-of-core trainer
(:func:`geodbk.streaming.train_streaming`, :meth:`geodbk.estimator.DBKRegressor.fit_batches`)
draws its shuffle windows from one. :class:`ArrayRowGroups` serves arrays held in memory;
:class:`geodbk.geo.parquet_batches.ParquetRowGroups` serves a parquet file.

- :func:`mean_std`: mean, sd and count of the finite values of a stream of arrays (Chan et
  al.'s pairwise update).
- :func:`predict_columns`: the predictive mean and sds of one batch of rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from geodbk.geo.timeaxis import quarter_indices
from geodbk.predictive import noise_kwargs
from geodbk.tile_effect import predict_with_tile_effect, urban_groups
from geodbk.validation import counts_or_one

__all__ = [
    "ArrayRowGroups",
    "Batch",
    "InputFn",
    "RowGroupSource",
    "columns_read",
    "iter_groups",
    "mean_std",
    "predict_columns",
    "stack_inputs",
]

#: One batch of rows: ``{column: numpy array}``, every array of the same length.
Batch = dict[str, np.ndarray]
#: Maps one batch's columns to the model inputs (n, d).
InputFn = Callable[[Batch], np.ndarray]
#: Default tile id and quarter columns of :func:`predict_columns`.
TILE_COLUMN, TIME_COLUMN = "quadkey", "quarter"


def stack_inputs(x_columns: Sequence[str]) -> InputFn:
    """The input map that stacks ``x_columns`` as float64 columns: ``X = [c_1, ..., c_d]``."""

    def stack(cols: Batch) -> np.ndarray:
        return np.column_stack([np.asarray(cols[c], dtype=np.float64) for c in x_columns])

    return stack


class RowGroupSource(Protocol):
    """A table read one or more row groups at a time (its rows selected by the source)."""

    @property
    def num_groups(self) -> int:
        """Number of row groups ``G`` (groups are numbered ``0 .. G-1``)."""
        ...

    def count_rows(self) -> int:
        """Number of rows over all groups."""
        ...

    def read(self, groups: Sequence[int], columns: Sequence[str]) -> Batch:
        """The rows of ``groups`` (concatenated in the given order), one array per column."""
        ...


class ArrayRowGroups:
    """Arrays held in memory served as row groups of ``group_size`` consecutive rows.

    Group ``g`` holds rows ``g*s .. min((g+1)*s, n) - 1`` (``s = group_size``), as a parquet
    file written with ``row_group_size=s`` does.
    """

    def __init__(self, columns: Mapping[str, Any], *, group_size: int = 65536) -> None:
        self.columns = {c: np.asarray(v) for c, v in columns.items()}
        sizes = {len(v) for v in self.columns.values()}
        if len(sizes) > 1:
            raise ValueError(f"columns of different lengths: {sorted(sizes)}")
        if int(group_size) < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.group_size = int(group_size)
        self.n = sizes.pop() if sizes else 0

    def __str__(self) -> str:
        return f"arrays of {self.n} rows"

    @property
    def num_groups(self) -> int:
        """``ceil(n / group_size)``."""
        return -(-self.n // self.group_size)

    def count_rows(self) -> int:
        """``n``."""
        return self.n

    def read(self, groups: Sequence[int], columns: Sequence[str]) -> Batch:
        """The rows of ``groups`` in the given order."""
        s = self.group_size
        rows = [np.arange(int(g) * s, min((int(g) + 1) * s, self.n)) for g in groups]
        idx = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        return {c: self.columns[c][idx] for c in columns}


def iter_groups(source: RowGroupSource, columns: Sequence[str]) -> Iterator[Batch]:
    """Each row group of ``source`` in order, one at a time (memory: one group)."""
    for g in range(source.num_groups):
        yield source.read([g], columns)


def mean_std(values: Iterable[np.ndarray]) -> tuple[float, float, int]:
    """Mean, sd (ddof 0) and count of the finite values of a stream of arrays.

    Chan et al.'s pairwise update of ``(n, mean, M2)`` per array: with the array's
    ``(n_b, mean_b, M2_b)`` and ``delta = mean_b - mean``, ``n' = n + n_b``,
    ``mean' = mean + delta n_b / n'`` and ``M2' = M2 + M2_b + delta^2 n n_b / n'``; the sd is
    ``sqrt(M2 / n)``. The result equals ``numpy.mean``/``numpy.std`` on the concatenation to
    rounding, in the memory of one array. No finite value: ``(nan, nan, 0)``.
    """
    n, mean, m2 = 0, 0.0, 0.0
    for values_b in values:
        v = np.asarray(values_b, dtype=np.float64)
        v = v[np.isfinite(v)]
        if v.size == 0:
            continue
        nb, mb = v.size, float(v.mean())
        m2b = float(((v - mb) ** 2).sum())
        tot = n + nb
        delta = mb - mean
        mean += delta * nb / tot
        m2 += m2b + delta**2 * n * nb / tot
        n = tot
    sd = math.sqrt(m2 / n) if n else math.nan
    return (mean if n else math.nan), sd, n


def columns_read(options: Mapping[str, Any]) -> list[str]:
    """The columns :func:`predict_columns` reads besides the model inputs when given the
    keyword ``options``: the noise covariates, and with a ``tile_effect`` the tile and time
    columns."""
    names = [options.get(k) for k in ("tests_column", "devices_column", "urban_column")]
    if options.get("tile_effect") is not None:
        names += [options.get("tile_column", TILE_COLUMN), options.get("time_column", TIME_COLUMN)]
    return [str(c) for c in names if c]


def predict_columns(
    model: Any,
    cols: Batch,
    *,
    inputs: InputFn,
    tests_column: str | None = None,
    devices_column: str | None = None,
    urban_column: str | None = None,
    tile_effect: Any = None,
    tile_column: str = TILE_COLUMN,
    time_column: str | None = TIME_COLUMN,
    chunk_size: int = 65536,
) -> Batch:
    """Predict the rows of one batch: ``{"mean", "std", "std_f"}``, float64 (n,).

    ``mean`` and ``std`` are the predictive mean and sd (y's units), ``std_f`` the latent sd
    ``sqrt(var_f)``; rows with a non-finite input get NaN. ``inputs`` maps the batch to the
    model inputs. ``tests_column`` gives a tests-aware model each row's number of tests (the
    sd is then that of the row's tile average), ``devices_column`` a ``tests+devices`` model
    each row's number of devices (without it: ``devices = tests``), ``urban_column`` a model
    with a noise floor per urban/rural class each row's class; missing counts and counts below
    1 are read as 1. With a ``tile_effect`` (:class:`geodbk.tile_effect.TileEffect`) each row's
    tile (``tile_column``) and quarter (``time_column`` as a quarter index; ``None``: one time
    step) add the tile's offset (:func:`geodbk.tile_effect.predict_with_tile_effect`); an
    effect with a ``tau²`` per urban/rural group reads each row's group from ``urban_column``.
    """
    X = inputs(cols)
    ok = np.isfinite(X).all(axis=1)
    mean = np.full(len(X), np.nan)
    std = np.full(len(X), np.nan)
    std_f = np.full(len(X), np.nan)
    if ok.any():
        kw = noise_kwargs(
            model,
            counts_or_one(cols[tests_column])[ok] if tests_column else None,
            counts_or_one(cols[devices_column])[ok] if devices_column else None,
            urban=np.asarray(cols[urban_column], dtype=bool)[ok] if urban_column else None,
        )
        if tile_effect is None:
            pred = model.predict_dist(X[ok], chunk_size=chunk_size, **kw)
        else:
            groups = None
            if tile_effect.grouped:
                if not urban_column:
                    raise ValueError(
                        "this tile effect has a tau² per urban/rural group: give urban_column"
                    )
                groups = urban_groups(np.asarray(cols[urban_column], dtype=bool)[ok])
            tiles = np.asarray(cols[tile_column])[ok].astype(str)
            times = (
                quarter_indices(np.asarray(cols[time_column])[ok].astype(str))
                if time_column
                else np.zeros(tiles.size)
            )
            pred = predict_with_tile_effect(
                model,
                tile_effect,
                X[ok],
                tiles=tiles,
                times=np.asarray(times, dtype=np.float64),
                noise=kw,
                groups=groups,
                chunk_size=chunk_size,
            )
        mean[ok], std[ok] = pred.mean, pred.std
        std_f[ok] = np.sqrt(np.maximum(np.asarray(pred.var_f), 0.0))
    return {"mean": mean, "std": std, "std_f": std_f}
