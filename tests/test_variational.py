"""The variational weights q(w) = N(m, LL'): initialisation and the Cholesky factor."""

from __future__ import annotations

import torch

from geodbk.variational import VariationalWeights


def test_variational_init_and_scale_tril() -> None:
    r = 32
    q = VariationalWeights(r, generator=torch.Generator().manual_seed(0))
    chol = q.scale_tril()
    assert torch.equal(chol, torch.tril(chol))
    assert torch.allclose(torch.diagonal(chol), torch.full((r,), r**-0.5))
    assert float(q.mean.abs().max()) == 0.0
    strict = torch.tril(chol, -1)
    assert 0.5 / r < float(strict[strict != 0].std()) < 2.0 / r
