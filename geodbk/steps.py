"""One optimiser step on a mini-batch, the step every mini-batch training loop takes
(:func:`geodbk.training.train_model`, :func:`geodbk.streaming.train_streaming` and the
single-process path of :func:`geodbk.distributed.make_epoch_runner`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from geodbk.objectives import batch_loss

if TYPE_CHECKING:
    from geodbk.model import DBKModel
    from geodbk.training import LoopConfig

__all__ = ["minibatch_step"]


def minibatch_step(
    model: DBKModel,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n: int,
    config: LoopConfig,
    batch: int,
    tests: torch.Tensor | None = None,
) -> float:
    """Zero the gradients, take the loss of ``config.objective`` on ``(x, y)`` (part of an
    ``n``-row data set; :func:`geodbk.objectives.batch_loss`) and its backward, with DBK-RBF's
    kernel held when ``config.holds_kernel(batch)`` (``batch``: the mini-batch's index in its
    epoch), then step ``optimizer``.

    Returns
    -------
    float
        The loss times the rows of the batch (an epoch's mean loss is their sum over ``n``).
    """
    optimizer.zero_grad(set_to_none=True)
    with model.kernel_held(config.holds_kernel(batch)):
        loss = batch_loss(model, x, y, n=n, config=config, tests=tests)
        loss.backward()
    optimizer.step()
    return float(loss.detach()) * int(x.shape[0])
