"""Small default-suite version of the seed paper's 1-D heteroscedastic experiment.

Full-size run: ``benchmarks/toy1d.py`` (figures in docs/benchmarks/core.md).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from geodbk import DBKRegressor
from geodbk.metrics import coverage, gaussian_nll


def _toy() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "toy1d.py"
    spec = importlib.util.spec_from_file_location("toy1d_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["toy1d_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    # One thread: the outcome of a short optimisation depends on the floating-point reduction
    # order, so pin it; small matrices gain little from more threads anyway.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_small()
    finally:
        torch.set_num_threads(threads)


def _run_small() -> dict[str, Any]:
    toy = _toy()
    n_train, n_val, n_test = toy.SMALL_ROWS
    dppgp = toy.SMALL_DPPGP
    x, y = toy.make_data(n_train, seed=0)
    xv, yv = toy.make_data(n_val, seed=1)
    xs, ys = toy.make_data(n_test, seed=2)
    sd_true = toy.true_sd(xs[:, 0])
    out: dict[str, Any] = {}

    def record(name: str, mean: np.ndarray, var: np.ndarray) -> None:
        out[name] = {
            "nll": gaussian_nll(ys, mean, var),
            "coverage95": coverage(ys, mean, var),
            "spearman": toy.spearman(np.sqrt(var), sd_true),
        }

    for rank, epochs in ((128, dppgp["epochs"]), (8, 150), (1, 80)):
        model = DBKRegressor(**{**dppgp, "rank": rank, "epochs": epochs})
        p = model.fit(x, y, xv, yv).predict_dist(xs)
        record(f"dppgp_r{rank}", p.mean, p.var)
    exact = DBKRegressor(**{**dppgp, "rank": 128, "objective": "exact", "epochs": 100})
    pe = exact.fit(x, y, xv, yv).predict_dist(xs)
    record("exact_dbk", pe.mean, pe.var)
    mean, var = toy.fit_exact_rbf_gp(x, y, xs, iters=30)
    record("exact_rbf_gp", mean, var)
    print(out)
    return out


def test_dppgp_beats_exact_dbk_and_exact_rbf_gp(results: dict[str, Any]) -> None:
    nll = {k: v["nll"] for k, v in results.items()}
    assert nll["dppgp_r128"] < nll["exact_dbk"]
    assert nll["dppgp_r128"] < nll["exact_rbf_gp"]


def test_dppgp_sd_tracks_true_noise_and_covers(results: dict[str, Any]) -> None:
    """At this budget the rank correlation of the predictive sd with the true noise sd depends
    on the float32 trajectory: 0.23–0.77 over the model seeds, dtypes and numerically equal forms of
    the step measured (docs/benchmarks/core.md, section 2), against 0.11 for rank 1 and below
    0.05 for the exact models, whose noise is constant. 0.2 asks for the heteroscedastic
    shape without betting on one trajectory; the full-size run asks 0.5."""
    r = results["dppgp_r128"]
    assert r["spearman"] > 0.2
    assert r["spearman"] > results["dppgp_r1"]["spearman"] + 0.05
    assert 0.92 <= r["coverage95"] <= 0.98


def test_rank_one_is_worse_than_rank_eight(results: dict[str, Any]) -> None:
    assert results["dppgp_r1"]["nll"] > results["dppgp_r8"]["nll"]


@pytest.mark.slow
def test_full_size_toy_run() -> None:
    """The benchmark-size run (minutes): same claims on 20,000 training points, 60 epochs."""
    toy = _toy()
    res = toy.run(n_train=20_000, epochs=60, exact_epochs=150, rbf_iters=50, rbf_max_n=2000)
    assert res["dppgp_r128"]["nll"] < res["exact_dbk_r128"]["nll"]
    assert res["dppgp_r128"]["nll"] < res["exact_rbf_gp"]["nll"]
    assert res["dppgp_r128"]["spearman_sd"] > 0.5
    assert 0.90 <= res["dppgp_r128"]["coverage95"] <= 0.98
    assert res["dppgp_r1"]["nll"] > res["dppgp_r8"]["nll"]
