"""One optimiser step on a mini-batch (:func:`geodbk.steps.minibatch_step`)."""

from __future__ import annotations

import pytest
import torch

from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.objectives import batch_loss
from geodbk.steps import minibatch_step
from geodbk.training import LoopConfig, _make_optimizer


def _setup() -> tuple[DBKModel, LoopConfig, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    model = DBKModel(2, expansion="rbf", rank=8, hidden=8, generator=gen).to(torch.float64)
    config = LoopConfig.of(
        DBKHyperparameters(lr=1e-2, kernel_update_every=2), variance_correction=False
    )
    x = torch.rand(16, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x[:, 0])
    return model, config, _make_optimizer(model, config), x, y


@pytest.mark.parametrize("batch", [0, 1])
def test_a_step_returns_the_rows_loss_and_holds_the_kernel_on_its_batches(batch: int) -> None:
    """The return is the batch's loss before the step times its rows; every parameter but the
    kernel's steps, and the kernel's only on an updating batch (kernel_update_every 2: batch 0
    updates, batch 1 holds)."""
    model, config, optimizer, x, y = _setup()
    with torch.no_grad():
        expected = float(batch_loss(model, x, y, n=100, config=config)) * 16
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    got = minibatch_step(model, optimizer, x, y, n=100, config=config, batch=batch)
    assert got == pytest.approx(expected, rel=1e-12)
    kernel = {id(p) for p in model.basis.kernel_parameters()}
    for name, p in model.named_parameters():
        moved = not torch.equal(p.detach(), before[name])
        assert moved == (id(p) not in kernel or batch == 0), name
