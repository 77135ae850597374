"""The shared TorchBaseline machinery: the scheduler hook and, through the one training loop,
checkpoint/resume, divergence and early stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from baseline_helpers import region

from geodbk.baselines.exact_rbf import ExactRBFRegressor
from geodbk.baselines.registry import build_model
from geodbk.errors import DataError, ModelFileError, TrainingDivergedError


class _Halving(ExactRBFRegressor):
    """Exact RBF GP whose learning rate halves after every epoch."""

    def _scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        self.sched_ = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return self.sched_


def test_scheduler_hook_is_stepped_once_per_epoch() -> None:
    X, y = region(40, seed=0)
    model = _Halving(epochs=3, patience=None, lr=0.04).fit(X, y)
    assert model.sched_.last_epoch == 3
    assert model.sched_.get_last_lr() == [0.04 * 0.5**3]
    assert ExactRBFRegressor()._scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0)) is None


@pytest.mark.parametrize("name", ["exact-rbf", "solve-gp"])
def test_baseline_resume_equals_uninterrupted_run(name: str, tmp_path: Path) -> None:
    """Full batch (exact RBF) and mini-batches (SOLVE-GP): 2 epochs, a checkpoint, 2 more
    give the weights, history and best epoch of 4 uninterrupted epochs."""
    X, y = region(120, seed=2)

    def model(epochs: int) -> Any:
        return build_model(name, epochs=epochs, batch_size=32, seed=0, rank=8, hidden=8)

    full = model(4).fit(X[:90], y[:90], X[90:], y[90:])
    model(2).fit(X[:90], y[:90], X[90:], y[90:], checkpoint_dir=tmp_path)
    resumed = model(4).fit(X[:90], y[:90], X[90:], y[90:], checkpoint_dir=tmp_path, resume=True)
    sa, sb = full.module_.state_dict(), resumed.module_.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [r["val_nll"] for r in full.history_] == [r["val_nll"] for r in resumed.history_]
    assert full.best_epoch_ == resumed.best_epoch_
    with pytest.raises(ModelFileError, match="different options"):
        build_model(name, epochs=4, batch_size=32, seed=1, rank=8, hidden=8).fit(
            X[:90], y[:90], checkpoint_dir=tmp_path, resume=True
        )


class _Diverging(ExactRBFRegressor):
    def _loss(self, module: Any, X: Any, y: Any, n_total: int, tests: Any = None) -> Any:
        return super()._loss(module, X, y, n_total, tests) * float("nan")


def test_baseline_divergence_and_early_stopping() -> None:
    X, y = region(40, seed=0)
    with pytest.raises(TrainingDivergedError, match="exact-rbf: the training loss became nan"):
        _Diverging(epochs=3).fit(X, y)
    # lr = 0: nothing improves after epoch 1, so training stops after 1 + patience epochs
    stuck = ExactRBFRegressor(epochs=10, patience=2, lr=0.0).fit(X[:30], y[:30], X[30:], y[30:])
    assert [r["epoch"] for r in stuck.history_] == [1, 2, 3] and stuck.best_epoch_ == 1


@pytest.mark.parametrize("name", ["exact-rbf", "cagp", "solve-gp", "softki"])
@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("epochs", -1, "epochs must be >= 0"),
        ("epochs", float("nan"), "epochs must be >= 0"),
        ("batch_size", 0, "batch_size must be >= 1"),
        ("lr", -0.1, "lr must be a finite number >= 0"),
        ("lr", float("nan"), "lr must be a finite number >= 0"),
        ("patience", -1, r"patience must be None \(never stop early\) or >= 0"),
        ("seed", -1, "seed must be >= 0"),
    ],
)
def test_baseline_refuses_a_shared_option_out_of_range(
    name: str, option: str, value: float, rule: str
) -> None:
    """The shared budget options are checked when fitting, with the option named, as
    DBKRegressor's are (not torch's error, a silent no-op or a hang)."""
    X, y = region(30, seed=0)
    model = build_model(name, epochs=1, batch_size=8, seed=0, rank=4, hidden=4)
    with pytest.raises(ValueError, match=f"{rule}, got"):
        model.set_params(**{option: value}).fit(X, y)
    assert not hasattr(model, "module_")


@pytest.mark.parametrize("name", ["exact-rbf", "cagp", "solve-gp", "softki"])
def test_baseline_needs_two_training_rows(name: str) -> None:
    X, y = region(30, seed=0)
    model = build_model(name, epochs=1, batch_size=8, seed=0, rank=4, hidden=4)
    with pytest.raises(DataError, match="need at least 2 training points, got 1"):
        model.fit(X[:1], y[:1])
