"""The copula joining a run's download, upload and latency models, from the validation split.

:func:`estimate_copula` predicts each validation row of ``RUN/tiles.parquet`` that has all three
targets with each target's model, as a held-out row: the ``test`` quantity (one tile-quarter's
average of the row's own ``tests`` speed tests from its ``devices`` devices, where the model's
noise uses them) at the row's tile and quarter, with the tile effect and local layer
conditioned without the validation rows (the saved ones condition on them, which would shrink
each row's residual toward zero). The standardised residuals::

    z_it = (y_it - mean_it) / sd_it,   t = download, upload, latency (log10 units)

give the Gaussian copula's correlation ``R`` (:func:`geodbk.service.gaussian_copula_correlation`:
normal scores of the ranks, then their correlation). ``R`` is stored in
``RUN/service/copula.json`` and in every service output's metadata.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.errors import DataError
from geodbk.service import MIN_COPULA_ROWS, gaussian_copula_correlation
from pipelines.places import PlacePredictor
from pipelines.rundir import RunDir, target_spec

log = logging.getLogger("geodbk")

__all__ = ["COPULA_METHOD", "MAX_COPULA_ROWS", "Copula", "estimate_copula"]

#: At most this many validation rows (a seeded random subset) enter the estimate.
MAX_COPULA_ROWS = 50_000
#: How ``R`` is estimated, for metadata.
COPULA_METHOD = (
    "Gaussian copula: correlation of the normal scores of the ranks of the standardised "
    "residuals (y - mean) / sd of each target's test quantity (each row's own tests and "
    "devices) on the validation rows with all three targets, predicted as held out (tile "
    "effect and local layer conditioned without the validation rows)"
)


@dataclass(frozen=True)
class Copula:
    """The copula's correlation and how it was estimated.

    Attributes
    ----------
    targets
        Order of the rows and columns of ``correlation``.
    correlation
        (3, 3) correlation matrix ``R``.
    rows
        Validation rows used.
    residual_sd
        Sample sd of each target's standardised residuals (1 for a calibrated model).
    """

    targets: tuple[str, ...]
    correlation: np.ndarray
    rows: int
    residual_sd: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``RUN/service/copula.json``)."""
        return {
            "targets": list(self.targets),
            "correlation": [[round(float(v), 6) for v in row] for row in self.correlation],
            "rows": int(self.rows),
            "split": "val",
            "residual_quantity": "test",
            "residual_sd": {k: round(v, 6) for k, v in self.residual_sd.items()},
            "method": COPULA_METHOD,
        }


def _validation_rows(rd: RunDir, targets: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The validation rows of ``tiles.parquet`` with every target finite (numpy columns)."""
    schema = pq.read_schema(rd.tiles)
    logs = [target_spec(t).log_column for t in targets]
    wanted = ["quadkey", "lon", "lat", "split", *logs]
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise DataError(
            f"{rd.tiles} lacks the column(s) {', '.join(missing)} that the service copula "
            "needs; re-run `geodbk ingest`"
        )
    optional = [c for c in ("quarter", "tests", "devices") if c in schema.names]
    table = pq.read_table(rd.tiles, columns=[*wanted, *optional])
    split = np.asarray(table["split"].to_numpy(zero_copy_only=False)).astype(str)
    table = table.filter(pa.array(split == "val"))
    cols = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
    ok = np.ones(table.num_rows, dtype=bool)
    for c in logs:
        ok &= np.isfinite(cols[c].astype(np.float64))
    log.info("read %s (%d validation rows, %d with all three targets)", rd.tiles, ok.size, ok.sum())
    return {c: v[ok] for c, v in cols.items()}


def estimate_copula(
    rd: RunDir,
    predictors: dict[str, PlacePredictor],
    *,
    max_rows: int = MAX_COPULA_ROWS,
    seed: int = 0,
) -> Copula:
    """The copula of ``predictors`` (download, upload, latency, in that order) from the
    validation rows of ``RUN/tiles.parquet`` (see the module docstring).

    Raises
    ------
    DataError
        Fewer than :data:`geodbk.service.MIN_COPULA_ROWS` usable validation rows, or residuals
        whose correlation is not positive definite.
    """
    targets = tuple(predictors)
    rows = _validation_rows(rd, targets)
    n = len(rows["quadkey"])
    if n < MIN_COPULA_ROWS:
        raise DataError(
            f"the validation split of {rd.tiles} has {n} rows with download, upload and latency; "
            f"the service copula needs at least {MIN_COPULA_ROWS}. Re-run `geodbk ingest` with a "
            "larger validation share, then train the three models again"
        )
    if n > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(n, size=max_rows, replace=False))
        rows = {c: v[keep] for c, v in rows.items()}
        n = max_rows
    lon = rows["lon"].astype(np.float64)
    lat = rows["lat"].astype(np.float64)
    quarters = rows.get("quarter")
    tests = rows["tests"].astype(np.float64) if "tests" in rows else None
    devices = rows["devices"].astype(np.float64) if "devices" in rows else None
    z = np.empty((n, len(targets)))
    for i, target in enumerate(targets):
        held = predictors[target].without_rows(rows["quadkey"], quarters)
        q = held.predict(
            lon,
            lat,
            quantity="test",
            tests=tests,
            devices=devices,
            quarters=quarters,
            own_testers=True,
        )
        y = rows[target_spec(target).log_column].astype(np.float64)
        z[:, i] = (y - q.mean) / q.sd
    if not np.isfinite(z).all():
        raise DataError(
            "the models gave non-finite predictions on the validation rows of "
            f"{rd.tiles}; a model file may be damaged: retrain it with `geodbk train`"
        )
    try:
        R = gaussian_copula_correlation(z)
    except ValueError as exc:
        raise DataError(
            f"cannot estimate the service copula from the validation rows of {rd.tiles}: {exc}"
        ) from None
    copula = Copula(
        targets=targets,
        correlation=R,
        rows=n,
        residual_sd={t: float(np.std(z[:, i])) for i, t in enumerate(targets)},
    )
    off = {
        f"{targets[a]}/{targets[b]}": round(float(R[a, b]), 3) for a, b in ((0, 1), (0, 2), (1, 2))
    }
    log.info("service copula from %d validation rows: %s", n, off)
    return copula
