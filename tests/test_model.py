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
