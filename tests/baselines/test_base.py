"""The shared TorchBaseline machinery: the learning-rate scheduler hook."""

from __future__ import annotations

import torch
from baseline_helpers import region

from geodbk.baselines.exact_rbf import ExactRBFRegressor


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
