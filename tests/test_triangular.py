"""Products with lower-triangular matrices by column blocks (geodbk.triangular) against the
dense products, values and gradients in float64."""

from __future__ import annotations

import pytest
import torch

from geodbk.triangular import block_width_for, latent_moments, lower_gram, lower_sq_norms

DT = torch.float64


@pytest.mark.parametrize(("r", "width"), [(12, 4), (10, 3), (9, 9)])
def test_blocked_sq_norms_gradients_equal_the_dense_products(r: int, width: int) -> None:
    """Under autograd the blocked ``||L'u||^2`` (its own backward) has the dense product's
    values and gradients in u and L (gradcheck in float64, blocks of every shape)."""
    g = torch.Generator().manual_seed(2)
    u = torch.randn(7, r, generator=g, dtype=DT, requires_grad=True)
    raw = torch.randn(r, r, generator=g, dtype=DT, requires_grad=True)
    blocked = lower_sq_norms(u, torch.tril(raw), width=width)
    torch.testing.assert_close(blocked, ((u @ torch.tril(raw)) ** 2).sum(-1))
    assert torch.autograd.gradcheck(
        lambda a, b: lower_sq_norms(a, torch.tril(b), width=width), (u, raw)
    )


@pytest.mark.parametrize(("r", "width"), [(12, 4), (10, 3), (9, 0), (9, 9)])
def test_lower_gram_equals_the_lower_triangle_of_the_dense_product(r: int, width: int) -> None:
    g = torch.Generator().manual_seed(4)
    a = torch.randn(15, r, generator=g, dtype=DT)
    b = torch.randn(15, r, generator=g, dtype=DT)
    got = lower_gram(a, b, width=width)
    torch.testing.assert_close(got, torch.tril(a.T @ b), rtol=1e-12, atol=1e-12)
    assert not bool(torch.triu(got, diagonal=1).any())


@pytest.mark.parametrize(("rank", "width"), [(64, 0), (100, 64), (512, 64), (2048, 256)])
def test_block_width_is_an_eighth_of_the_rank_and_at_least_64(rank: int, width: int) -> None:
    assert block_width_for(rank) == width


@pytest.mark.parametrize(("r", "width"), [(12, 4), (10, 3), (9, 0), (9, 9)])
def test_latent_moments_and_their_gradients_equal_the_dense_formulas(r: int, width: int) -> None:
    """``(u m, ||L'u_i||^2, ||u_i||^2)`` and their one backward equal the dense formulas under
    autograd (gradcheck in float64, by blocks and dense), also when only some outputs are used."""
    g = torch.Generator().manual_seed(5)
    u = torch.randn(7, r, generator=g, dtype=DT, requires_grad=True)
    mean = torch.randn(r, generator=g, dtype=DT, requires_grad=True)
    raw = torch.randn(r, r, generator=g, dtype=DT, requires_grad=True)
    mu, var_f, sq = latent_moments(u, mean, torch.tril(raw), width=width)
    torch.testing.assert_close(mu, u @ mean)
    torch.testing.assert_close(var_f, ((u @ torch.tril(raw)) ** 2).sum(-1))
    torch.testing.assert_close(sq, (u**2).sum(-1))
    assert torch.autograd.gradcheck(
        lambda a, m, b: latent_moments(a, m, torch.tril(b), width=width), (u, mean, raw)
    )
    for used in range(3):  # one output alone: the others' gradients are absent, not zero-filled
        assert torch.autograd.gradcheck(
            lambda a, m, b, k=used: latent_moments(a, m, torch.tril(b), width=width)[k],
            (u, mean, raw),
        )


def test_latent_moments_without_gradients_match_under_autograd() -> None:
    g = torch.Generator().manual_seed(6)
    u, mean, lower = torch.randn(5, 8, generator=g), torch.randn(8, generator=g), torch.randn(8, 8)
    with torch.no_grad():
        plain = latent_moments(u, mean, torch.tril(lower), width=4)
    fused = latent_moments(u.requires_grad_(), mean, torch.tril(lower), width=4)
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a, b.detach())
