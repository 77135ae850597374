"""CaGP's learning-rate schedule: constant (tuned) or paper 002's LinearLR to 0.1·lr at the last
epoch (preset "paper"), the learning-rate grid the benchmark sweeps, and save/load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from baseline_helpers import region
from torch import nn

from geodbk.baselines.cagp import CaGPRegressor
from geodbk.baselines.registry import CAGP_LR_GRID, PAPER_PRESET, build_model


class _RecordingAdam(torch.optim.Adam):
    """Adam that records its learning rate at every step."""

    lrs: list[float]

    def step(self, closure: Any = None) -> Any:
        self.lrs.append(float(self.param_groups[0]["lr"]))
        return super().step(closure)


class _RecordingCaGP(CaGPRegressor):
    """CaGP whose optimiser records the learning rate of every step in ``lrs_``."""

    def _optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        opt = _RecordingAdam(module.parameters(), lr=self.lr)
        self.lrs_: list[float] = []
        opt.lrs = self.lrs_
        return opt


@pytest.mark.parametrize("epochs", [6, 2])
def test_linear_schedule_reaches_a_tenth_of_lr_at_the_last_epoch(epochs: int) -> None:
    X, y = region(40, seed=0)
    est = _RecordingCaGP(
        n_actions=4, epochs=epochs, lr=0.2, patience=None, lr_schedule="linear"
    ).fit(X, y)
    assert len(est.lrs_) == epochs  # full batch: one step per epoch
    expected = 0.2 * (1.0 - 0.9 * np.arange(epochs) / (epochs - 1))
    np.testing.assert_allclose(est.lrs_, expected, rtol=1e-12)
    assert est.lrs_[-1] == pytest.approx(0.02, rel=1e-12)
    constant = _RecordingCaGP(n_actions=4, epochs=epochs, lr=0.2, patience=None).fit(X, y)
    assert constant.lrs_ == [0.2] * epochs
    assert constant._scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0)) is None


def test_invalid_schedule_raises_and_the_schedule_round_trips(tmp_path: Path) -> None:
    X, y = region(30, seed=1)
    with pytest.raises(ValueError, match="lr_schedule"):
        CaGPRegressor(n_actions=4, epochs=1, lr_schedule="cosine").fit(X, y)
    est = CaGPRegressor(n_actions=4, epochs=3, lr_schedule="linear", dtype="float64").fit(X, y)
    est.save(tmp_path / "m")
    back = CaGPRegressor.load(tmp_path / "m")
    assert back.lr_schedule == "linear" and back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.predict(X[:5]), est.predict(X[:5]))


def test_registry_presets_and_lr_grid() -> None:
    """Paper: lr 0.1 (from the grid) with the linear schedule; tuned: lr 0.05, constant."""
    assert CAGP_LR_GRID == (1.0, 0.1, 0.01)
    assert PAPER_PRESET["cagp"]["lr"] in CAGP_LR_GRID
    X, y = region(30, seed=2)
    for preset, lr, schedule in (("paper", 0.1, "linear"), ("tuned", 0.05, "constant")):
        est = build_model("cagp", epochs=2, batch_size=32, seed=0, rank=4, preset=preset)
        assert isinstance(est, CaGPRegressor)
        assert (est.lr, est.lr_schedule) == (lr, schedule)
        pred = est.fit(X, y).predict_dist(X[:5])
        assert np.isfinite(pred.mean).all() and (pred.var > 0).all()
