"""Shared pieces of the baseline tests: tiny synthetic data (a 2-D heteroscedastic region, rows
with speed-test counts, a run directory), the dense Gaussian KL and the tests-aware noise
s2_i = floor + s2_floor + s2_meas / tests_i that the dense formulas use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tile_tables import write_synthetic_tile_table

from geodbk.likelihoods import TestsNoise as _TestsNoise  # (not a test class)
from geodbk.likelihoods import inverse_softplus


def field(X: np.ndarray) -> np.ndarray:
    """Smooth mean field on [-1, 1]²."""
    return np.sin(3.0 * X[:, 0]) + np.cos(2.0 * X[:, 1])


def region(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n points uniform in [-1,1]² with noise sd 0.1 (x1 < 0) or 0.4 (x1 > 0)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, (n, 2))
    sd = np.where(X[:, 0] > 0, 0.4, 0.1)
    return X, field(X) + sd * rng.standard_normal(n)


def make_tiny_run(path: Path, *, n: int = 300, seed: int = 0) -> Path:
    """Write a minimal valid ``tiles.parquet`` (via the geo layer's writer) into ``path``."""
    rng = np.random.default_rng(seed)
    X, ld = region(n, seed=seed)
    ld = 4.0 + 0.3 * ld
    lon_min, lon_max, lat_min, lat_max = -158.3, -157.6, 21.2, 21.75
    lon = lon_min + (X[:, 0] + 1) / 2 * (lon_max - lon_min)
    lat = lat_min + (X[:, 1] + 1) / 2 * (lat_max - lat_min)
    urban = (X[:, 0] + X[:, 1]) > 0.3
    lu = 3.5 + 0.2 * X[:, 1] + 0.2 * rng.standard_normal(n)
    ll = 1.5 + 0.1 * rng.standard_normal(n)
    split = rng.choice(["train", "val", "test"], size=n, p=[0.7, 0.1, 0.2])
    return write_synthetic_tile_table(
        path,
        lon=lon,
        lat=lat,
        x1=X[:, 0],
        x2=X[:, 1],
        bounds=(lon_min, lat_min, lon_max, lat_max),
        log10_download=ld,
        log10_upload=lu,
        log10_latency=ll,
        urban=urban,
        split=split,
        rng=rng,
        tile_half_width=0.002,
        fractions=(0.7, 0.1, 0.2),
        seed=seed,
        source="tests/baselines",
    )


def rows_with_tests(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, tests): n points in [-1,1]², 1..29 speed tests per row, noise sd
    sqrt(0.02 + 0.3 / tests)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    tests = rng.integers(1, 30, n).astype(float)
    y = np.sin(2 * x[:, 0]) + rng.normal(size=n) * np.sqrt(0.02 + 0.3 / tests)
    return x, y, tests


def kl_gauss(m1: np.ndarray, S1: np.ndarray, m0: np.ndarray, S0: np.ndarray) -> float:
    """KL(N(m1, S1) || N(m0, S0)) by the dense formula."""
    diff = m1 - m0
    return 0.5 * (
        np.trace(np.linalg.solve(S0, S1))
        + diff @ np.linalg.solve(S0, diff)
        - len(m1)
        + np.linalg.slogdet(S0)[1]
        - np.linalg.slogdet(S1)[1]
    )


# noise="tests" (issue 9): s2_i = floor + s2_floor + s2_meas / tests_i with D = diag(s2_i) in
# place of s2 I. Each model is checked against its dense formula on ~30 points in float64, with
# the noise parameters set to distinct values (s2_floor = 0.05, s2_meas = 0.4).
S2_FLOOR, S2_MEAS = 0.05, 0.4


def speed_test_counts(n: int, *, seed: int) -> np.ndarray:
    """Test counts with many single-test rows (1..40)."""
    rng = np.random.default_rng(seed)
    return rng.choice([1.0, 1.0, 2.0, 3.0, 5.0, 12.0, 40.0], size=n)


def dense_s2(tests: np.ndarray) -> np.ndarray:
    """s2_i = 1e-6 + S2_FLOOR + S2_MEAS / tests_i (the TestsNoise floor is 1e-6)."""
    return 1e-6 + S2_FLOOR + S2_MEAS / np.asarray(tests, dtype=np.float64)


def set_tests_noise(noise: _TestsNoise) -> None:
    """Set a model's tests-aware noise to s2_floor = S2_FLOOR, s2_meas = S2_MEAS."""
    with torch.no_grad():
        noise.raw_floor.fill_(inverse_softplus(S2_FLOOR))
        noise.raw_meas.fill_(inverse_softplus(S2_MEAS))


def standardised(est: Any, y: np.ndarray) -> torch.Tensor:
    """``y`` in a fitted estimator's standardised units."""
    return torch.as_tensor((y - est.y_mean_) / est.y_sd_)


#: A one-epoch budget for ``build_model`` (the presets' tests).
BUDGET: dict[str, int] = dict(epochs=1, batch_size=64, seed=0, rank=8, hidden=8)

#: Per model, the budget of test_models_fit.py's fits: small budgets that are enough on 320
#: points; noise_init 0.3 for the DBK family (the core's default 1e-2 needs more epochs than a
#: unit test should spend). test_registry.py checks that it names every model.
FIT_SETTINGS: dict[str, dict[str, Any]] = {
    "dbk-rbf": {"epochs": 40, "overrides": {"lr": 1e-2, "noise_init": 0.3}},
    "dbk-silu": {"epochs": 40, "overrides": {"lr": 1e-2, "noise_init": 0.3}},
    "exact-dbk": {"epochs": 40, "overrides": {"lr": 1e-2, "noise_init": 0.3}},
    "exact-rbf": {"epochs": 30, "overrides": {}},
    "sv-rbf": {"epochs": 30, "overrides": {"lr": 1e-2}},
    "sv-dkl": {"epochs": 30, "overrides": {"lr": 1e-2}},
    "pp-dkl": {"epochs": 30, "overrides": {"lr": 1e-2}},
    "vbll": {"epochs": 30, "overrides": {"lr": 1e-2}},
    "svdbk": {"epochs": 40, "overrides": {"lr": 1e-2, "noise_init": 0.3}},
    "svdbk-exact": {"epochs": 40, "overrides": {"lr": 1e-2, "noise_init": 0.3}},
    "cagp": {"epochs": 30, "overrides": {"lr": 0.05}},
    "solve-gp": {"epochs": 30, "overrides": {"lr": 0.02}},
    "softki": {"epochs": 30, "overrides": {}},
}
