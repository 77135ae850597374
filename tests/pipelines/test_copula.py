"""The service copula: standardised residuals of the validation rows, predicted held out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geodbk.errors import DataError
from geodbk.service import gaussian_copula_correlation
from pipelines.copula import COPULA_METHOD, estimate_copula
from pipelines.rundir import RunDir

TARGETS = ("download", "upload", "latency")


class _Predictor:
    """Predicts ``y - sd z`` for the rows it is asked about: their residuals are ``z``."""

    def __init__(self, y: dict[str, float], z: dict[str, float], sd: float) -> None:
        self.y, self.z, self.sd = y, z, sd
        self.dropped: list[str] = []

    def without_rows(self, tiles: Any, quarters: Any = None) -> _Predictor:
        self.dropped = [str(t) for t in tiles]
        return self

    def predict(self, lon: np.ndarray, lat: np.ndarray, **kw: Any) -> SimpleNamespace:
        assert kw["quantity"] == "test"
        keys = [f"{a:.6f}" for a in lon]
        mean = np.array([self.y[k] - self.sd * self.z[k] for k in keys])
        return SimpleNamespace(mean=mean, sd=np.full(len(keys), self.sd))


def _run(tmp_path: Path, n: int = 80) -> tuple[RunDir, dict[str, _Predictor], np.ndarray]:
    rng = np.random.default_rng(0)
    z = rng.multivariate_normal(np.zeros(3), [[1, 0.6, -0.3], [0.6, 1, 0], [-0.3, 0, 1]], n)
    lon = -157.0 + np.arange(n) * 1e-3
    logs = {t: rng.normal(4.0, 0.3, n) for t in TARGETS}
    split = np.where(np.arange(n) % 2 == 0, "val", "train")
    logs["upload"][0] = np.nan  # a val row without every target is left out
    pq.write_table(
        pa.table(
            {
                "quadkey": [f"q{i}" for i in range(n)],
                "lon": lon,
                "lat": np.full(n, 21.0),
                "split": split,
                "tests": np.full(n, 3),
                **{f"log10_{t}": v for t, v in logs.items()},
            }
        ),
        tmp_path / "tiles.parquet",
    )
    keys = [f"{a:.6f}" for a in lon]
    predictors = {
        t: _Predictor(
            dict(zip(keys, logs[t], strict=True)), dict(zip(keys, z[:, i], strict=True)), 0.2
        )
        for i, t in enumerate(TARGETS)
    }
    used = (split == "val") & np.isfinite(logs["upload"])
    return RunDir(tmp_path), predictors, z[used]


def test_the_correlation_is_that_of_the_held_out_residuals(tmp_path: Path) -> None:
    rd, predictors, z = _run(tmp_path)
    copula = estimate_copula(rd, predictors)
    assert copula.targets == TARGETS and copula.rows == len(z) == 39
    np.testing.assert_allclose(copula.correlation, gaussian_copula_correlation(z), atol=1e-12)
    for i, t in enumerate(TARGETS):
        assert copula.residual_sd[t] == pytest.approx(float(np.std(z[:, i])))
        assert len(predictors[t].dropped) == 39  # the validation rows are held out
    doc = copula.to_dict()
    assert doc["split"] == "val" and doc["method"] == COPULA_METHOD and doc["rows"] == 39
    sub = estimate_copula(rd, predictors, max_rows=30, seed=1)
    assert sub.rows == 30 and not np.allclose(sub.correlation, copula.correlation)


def test_too_few_rows_or_missing_columns_are_refused(tmp_path: Path) -> None:
    rd, predictors, _ = _run(tmp_path, n=40)  # 19 usable validation rows
    with pytest.raises(DataError, match="has 19 rows with download, upload and latency"):
        estimate_copula(rd, predictors)
    pq.write_table(pq.read_table(rd.tiles).drop_columns(["log10_latency"]), rd.tiles)
    with pytest.raises(DataError, match=r"lacks the column.*log10_latency.*geodbk ingest"):
        estimate_copula(rd, predictors)
