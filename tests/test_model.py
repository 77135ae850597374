"""DBKModel: folded prediction equals the forward pass; the weight-decay groups; the blocked
training variance."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import geodbk.model as model_module
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.objectives import batch_loss
from geodbk.training import LoopConfig
from geodbk.triangular import latent_moments

DT = torch.float64


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
@pytest.mark.parametrize("correction", [False, True])
def test_folded_prediction_equals_forward(expansion: str, correction: bool) -> None:
    torch.manual_seed(0)
    model = DBKModel(2, expansion=expansion, rank=12, hidden=8).to(DT)
    x = torch.rand(20, 2, dtype=DT) * 2 - 1
    with torch.no_grad():
        out = model(x)
        mean, var_f, var = model.predict_folded(x, model.fold(variance_correction=correction))
    expected_var_f = out.var_f
    if correction and out.var_correction is not None:
        expected_var_f = out.var_f + out.var_correction
    assert torch.allclose(mean, out.mean, atol=1e-10)
    assert torch.allclose(var_f, expected_var_f, atol=1e-10)
    assert torch.allclose(var, var_f + model.noise_var(), atol=1e-12)


def test_weight_decay_groups_partition_parameters() -> None:
    model = DBKModel(2, rank=4, hidden=4)
    back = {id(p) for p in model.backbone_parameters()}
    other = {id(p) for p in model.other_parameters()}
    assert back.isdisjoint(other)
    assert back | other == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
def test_blocked_training_variance_and_gradients_equal_the_dense_product(
    expansion: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With blocks in training (r = 200 >= a lowered ``TRAINING_BLOCK_MIN_RANK``) the forward's
    ``||L'phi||^2`` and every parameter's gradient of the dPPGP loss equal the dense product's
    (float64)."""
    torch.manual_seed(1)
    model = DBKModel(2, expansion=expansion, rank=200, hidden=8).to(DT)
    with torch.no_grad():  # a posterior factor far from its initial value
        model.q.lower.normal_(0.0, 0.1)
    x = torch.rand(64, 2, dtype=DT) * 2 - 1
    y = torch.randn(64, dtype=DT)
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", alpha=0.1, beta=0.01))
    params = list(model.parameters())

    widths: list[int] = []

    def recording_moments(*args: Any, width: int) -> Any:
        widths.append(width)
        return latent_moments(*args, width=width)

    monkeypatch.setattr(model_module, "latent_moments", recording_moments)

    def loss_and_grads(min_rank: int) -> tuple[torch.Tensor, tuple]:
        monkeypatch.setattr(model_module, "TRAINING_BLOCK_MIN_RANK", min_rank)
        widths.clear()
        model(x)
        assert (widths[0] > 0) == (min_rank <= model.rank)
        loss = batch_loss(model, x, y, n=1000, config=config)
        return loss, torch.autograd.grad(loss, params, allow_unused=True)

    blocked, got = loss_and_grads(128)
    dense, want = loss_and_grads(10**9)
    torch.testing.assert_close(blocked, dense, rtol=1e-12, atol=1e-12)
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        if w is None:
            assert g is None, name
            continue
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
