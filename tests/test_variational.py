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


def test_scale_tril_and_its_gradients_equal_the_sum_form() -> None:
    """``L`` and the gradients through it are bit for bit those of
    ``tril(A, -1) + diag_embed(exp(s))``, the formula written out."""
    r = 24
    q = VariationalWeights(r, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q.log_diag.normal_(-1.0, 0.3)
    weights = torch.randn(r, r, generator=torch.Generator().manual_seed(2))

    def value_and_grads(lower: torch.Tensor) -> tuple[torch.Tensor, ...]:
        loss = (lower * weights).sum() + (lower**2).sum() - torch.log(lower.diagonal()).sum()
        return (lower.detach(), *torch.autograd.grad(loss, [q.lower, q.log_diag]))

    got = value_and_grads(q.scale_tril())
    want = value_and_grads(torch.tril(q.lower, -1) + torch.diag_embed(q.log_diag.exp()))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    with torch.no_grad():  # the path without autograd builds the same matrix
        assert torch.equal(q.scale_tril(), got[0])
