"""DBKModel: folded prediction equals the forward pass; the weight-decay groups."""

from __future__ import annotations

import pytest
import torch

from geodbk.model import DBKModel

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
def test_blocked_variance_and_its_gradients_equal_the_dense_product(expansion: str) -> None:
    """At r = 200 the forward pass sums ``||L'phi||^2`` over L's lower-triangular column
    blocks: the values and every parameter's gradient equal the dense ``((phi L)^2).sum``."""
    torch.manual_seed(1)
    model = DBKModel(2, expansion=expansion, rank=200, hidden=8).to(DT)
    with torch.no_grad():  # a posterior factor far from its initial value
        model.q.lower.normal_(0.0, 0.1)
    x = torch.rand(64, 2, dtype=DT) * 2 - 1
    weights = torch.rand(64, dtype=DT)
    blocked = (model(x).var_f * weights).sum()
    got = torch.autograd.grad(blocked, list(model.parameters()), allow_unused=True)
    phi = model.features(x)
    dense = ((((phi @ model.q.scale_tril()) ** 2).sum(-1)) * weights).sum()
    want = torch.autograd.grad(dense, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(blocked, dense, rtol=1e-12, atol=1e-12)
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        if w is None:
            assert g is None or not bool(g.abs().max() > 0), name
            continue
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
