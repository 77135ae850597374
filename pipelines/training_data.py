"""The arrays a training stage reads from a run's tile table: splits, time axis, noise
covariates, and the noise model resolved from the table's columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from geodbk.errors import DataError
from geodbk.geo.contract import target_info
from geodbk.geo.timeaxis import TimeScaling, format_quarter, quarter_indices
from geodbk.validation import counts_or_one
from pipelines.config import NOISE_INIT, URBAN_SUFFIX, TrainConfig


def resolve_noise(
    cfg: TrainConfig,
    columns: Any,
    *,
    source: Path | str = "tiles.parquet",
    devices_supported: bool = True,
    urban_classes: int = 0,
) -> TrainConfig:
    """Resolve ``noise: auto`` from the tile table's columns.

    ``auto`` becomes ``tests+devices`` when the table has ``tests`` and ``devices`` columns and
    ``devices_supported`` (in-memory and ``--distributed`` training; ``--streaming`` passes
    ``False`` and gets ``tests``), ``tests`` when it has ``tests``, else ``constant``. The
    devices term is the default because validation NLL favoured it on every Hawaii target
    (docs/decisions/noise_model.md); the floor per urban/rural class (``+urban``) is not,
    because cross-validated NLL did not change with it. An explicit noise needs its
    columns (``source``: the table, for the message) and ``+urban`` needs ``urban_classes ==
    2`` (urban and rural tiles in the train split). ``noise_init: 0`` becomes the noise
    model's default (:data:`pipelines.config.NOISE_INIT`), so the saved config is explicit.
    """
    if cfg.noise == "auto":
        if "tests" not in columns:
            cfg = cfg.replace(noise="constant")
        elif "devices" in columns and devices_supported:
            cfg = cfg.replace(noise="tests+devices")
        else:
            cfg = cfg.replace(noise="tests")
    if cfg.noise.endswith(URBAN_SUFFIX) and urban_classes != 2:
        raise DataError(
            f"--noise {cfg.noise} learns a noise floor per urban/rural class, but the train "
            f"split of {source} does not hold both urban and rural tiles; re-ingest with an "
            f"urban layer (--urban-areas, --tracts with --rural-tracts, or --counties with "
            f"--rucc) or train with --noise {cfg.noise.removesuffix(URBAN_SUFFIX)}"
        )
    for col in [c for c in noise_columns(cfg.noise) if c != "urban"]:
        if col not in columns:
            raise DataError(
                f"--noise {cfg.noise} needs a `{col}` column in {source}; re-ingest Ookla tiles "
                f"that have it, or train with --noise "
                f"{'tests' if col == 'devices' else 'constant'}"
            )
    if cfg.noise_init == 0:
        cfg = cfg.replace(noise_init=NOISE_INIT[cfg.noise])
    return cfg


def time_axis(quarter: Any, split: Any, *, source: Path) -> tuple[TimeScaling, list[str]]:
    """Time scaling of a time-aware model and the table's quarters.

    Parameters
    ----------
    quarter, split
        The ``quarter`` and ``split`` columns of the tile table (all rows).
    source
        The table (for messages).

    Returns
    -------
    tuple
        ``(TimeScaling(first, last), quarters)``: ``first``/``last`` span the quarters of the
        ``train`` split (so the later quarters of a forecast split are extrapolations, t > 1);
        ``quarters`` are all the table's quarters, sorted.

    Raises
    ------
    DataError
        When the train split has fewer than 2 distinct quarters (t would be constant).
    """
    q = np.asarray(quarter, dtype=object).astype(str)
    train = np.asarray(split, dtype=object).astype(str) == "train"
    try:
        all_idx = np.unique(quarter_indices(q))
        train_idx = np.unique(quarter_indices(q[train]))
    except DataError as exc:
        raise DataError(f"{source}: bad value in the 'quarter' column ({exc})") from exc
    if train_idx.size < 2:
        got = ", ".join(format_quarter(int(i)) for i in train_idx) or "none"
        raise DataError(
            f"{source}: --time needs at least 2 quarters in the train split, got {got}; "
            "ingest more quarters (e.g. `geodbk ingest --quarters 2023Q1:2023Q4`) or train "
            "without --time"
        )
    ts = TimeScaling(format_quarter(int(train_idx[0])), format_quarter(int(train_idx[-1])))
    return ts, [format_quarter(int(i)) for i in all_idx]


def split_tests(gdf: Any, target: str, *, column: str = "tests") -> dict[str, np.ndarray]:
    """``{"train"|"val"|"test": values (n,)}`` of ``column`` aligned with :func:`split_arrays`
    (same rows).

    ``tests`` and ``devices`` are counts (float64; missing or below 1 set to 1); ``urban``
    is returned as bool, ``quadkey`` and ``quarter`` as strings, ``lon`` and ``lat`` as
    float64.
    """
    log_column = target_info(target).log_column
    out: dict[str, np.ndarray] = {}
    for name in ("train", "val", "test"):
        part = gdf[gdf["split"] == name]
        X = part[["x1", "x2"]].to_numpy(dtype=np.float64)
        y = part[log_column].to_numpy(dtype=np.float64)
        ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
        if column == "urban":
            out[name] = part[column].to_numpy(dtype=bool)[ok]
        elif column in ("quadkey", "quarter"):
            out[name] = part[column].astype(str).to_numpy()[ok]
        elif column in ("lon", "lat"):
            out[name] = part[column].to_numpy(dtype=np.float64)[ok]
        else:
            out[name] = counts_or_one(part[column].to_numpy(dtype=np.float64))[ok]
    return out


def noise_columns(noise: str) -> list[str]:
    """Table columns a noise model reads: ``[]`` (constant), ``["tests"]``, plus ``"devices"``
    (``tests+devices``) and ``"urban"`` (``+urban``: the floor per urban/rural class)."""
    if noise == "constant":
        return []
    return ["tests"] + [c for c in ("devices", "urban") if c in noise]


def noise_covariates(gdf: Any, target: str, noise: str) -> dict[str, np.ndarray]:
    """The ``fit`` keywords of the noise covariates for ``noise`` (train and val rows).

    ``{}`` (constant), ``{"tests", "tests_val"}`` (``tests``), plus ``{"devices",
    "devices_val"}`` (``tests+devices``) and ``{"urban", "urban_val"}`` (``+urban``), each
    from :func:`split_tests`.
    """
    out: dict[str, np.ndarray] = {}
    for column in noise_columns(noise):
        parts = split_tests(gdf, target, column=column)
        out.update({column: parts["train"], f"{column}_val": parts["val"]})
    return out


def urban_classes(urban: Any, split: Any) -> int:
    """Number of urban/rural classes (0, 1 or 2) among the ``train`` rows."""
    train = np.asarray(split, dtype=object).astype(str) == "train"
    return int(np.unique(np.asarray(urban, dtype=bool)[train]).size)


def split_arrays(
    gdf: Any, target: str, *, source: Path, time_scaling: TimeScaling | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train"|"val"|"test": (X, y (n,))}`` for ``target`` (finite rows only).

    ``X`` is ``[x1, x2]`` (n, 2), or ``[x1, x2, t]`` (n, 3) with ``t =
    time_scaling.scale(quarter)`` when a :class:`~geodbk.geo.timeaxis.TimeScaling` is given
    (time-aware models). The rows kept are the same either way (finite ``x1, x2, y``), so
    :func:`split_tests` stays row-aligned.
    """
    log_column = target_info(target).log_column
    need = ["x1", "x2", log_column, "split"] + (["quarter"] if time_scaling is not None else [])
    for col in need:
        if col not in gdf.columns:
            raise DataError(f"{source} has no {col!r} column; re-run `geodbk ingest`")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in ("train", "val", "test"):
        part = gdf[gdf["split"] == name]
        X = part[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True)
        y = part[log_column].to_numpy(dtype=np.float64)
        ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
        if time_scaling is not None:
            t = time_scaling.scale(part["quarter"].astype(str).to_numpy())
            X = np.column_stack([X, np.asarray(t, dtype=np.float64).reshape(-1)])
        out[name] = (X[ok], y[ok])
    if len(out["train"][1]) < 2:
        raise DataError(f"{source}: fewer than 2 usable training rows for {target}")
    return out


#: Objective rows (validation rows, or the training hold-out) each urban/rural class needs for
#: ``tile_effect_groups: auto`` to pick ``urban`` (its own ``tau²`` is chosen on them).
MIN_GROUP_VAL_ROWS = 100


def smaller_class_rows(urban_val: np.ndarray) -> int:
    """Rows of the smaller urban/rural class."""
    urban_val = np.asarray(urban_val, dtype=bool)
    return min(int(urban_val.sum()), int((~urban_val).sum()))


def urban_groups_supported(urban_val: np.ndarray) -> bool:
    """Whether each urban/rural class has :data:`MIN_GROUP_VAL_ROWS` validation rows (then
    ``tile_effect_groups: auto`` gives each class its own ``tau²``)."""
    return smaller_class_rows(urban_val) >= MIN_GROUP_VAL_ROWS
