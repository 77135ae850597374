"""The expansions: RBF inducing basis (Nyström kernel, log-space cross kernel) and SiLU basis."""

from __future__ import annotations

import math

import pytest
import torch

from geodbk.bases import RIGHT_SOLVES_MAX_RANK, RBFInducingBasis, SiLUBasis, _ScaledRBF, _Whiten

DT = torch.float64


def test_rbf_basis_init_and_nystrom_kernel() -> None:
    h, r = 4, 10
    basis = RBFInducingBasis(h, r, jitter=1e-6, generator=torch.Generator().manual_seed(0)).to(DT)
    z = basis.inducing.detach()
    assert float(z.min()) >= -1 and float(z.max()) <= 1
    assert torch.allclose(basis.log_lengthscale.exp(), torch.full((h,), math.sqrt(h), dtype=DT))
    assert float(basis.outputscale()) == pytest.approx(1.0)
    with torch.no_grad():
        basis.log_lengthscale.fill_(math.log(0.7))
        basis.log_outputscale.fill_(math.log(1.7))
    a = torch.randn(7, h, dtype=DT)
    b = torch.randn(5, h, dtype=DT)
    z = basis.inducing.detach()

    def k(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 1.7 * torch.exp(-0.5 * torch.cdist(u / 0.7, v / 0.7) ** 2)

    kzz = k(z, z) + 1e-6 * 1.7 * torch.eye(r, dtype=DT)
    nystrom = k(a, z) @ torch.linalg.solve(kzz, k(z, b))
    with torch.no_grad():
        ours = basis(a) @ basis(b).T
        sq = (basis(a) ** 2).sum(-1)
    assert torch.allclose(ours, nystrom, atol=1e-8)
    assert bool((sq <= 1.7 + 1e-8).all())  # ||phi||^2 <= k~(x, x) = sk2
    prior = basis.prior_variance(a)
    assert prior is not None
    assert torch.allclose(prior, torch.full((7,), 1.7, dtype=DT))


def test_silu_basis_init() -> None:
    r = 64
    basis = SiLUBasis(8, r, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(basis.scale.abs(), torch.full((r,), 1 / math.sqrt(r)))
    assert 0 < int((basis.scale > 0).sum()) < r  # random signs
    assert basis.prior_variance(torch.zeros(2, 8)) is None
    g = torch.randn(3, 8)
    assert torch.allclose(basis(g), basis.scale * torch.nn.functional.silu(basis.linear(g)))


def test_rbf_cross_values_and_gradients_match_the_dense_kernel() -> None:
    """The log-space ``k_Z(g)`` (fused product, in place without autograd) equals
    ``sk2 exp(-|g - z|² / 2l²)`` and gives the same gradients."""
    h, r = 3, 6
    basis = RBFInducingBasis(h, r, generator=torch.Generator().manual_seed(1)).to(DT)
    with torch.no_grad():
        basis.log_lengthscale.copy_(torch.tensor([0.1, -0.4, 0.3], dtype=DT))
        basis.log_outputscale.fill_(0.2)
    g = torch.randn(9, h, dtype=DT, requires_grad=True)

    def dense() -> torch.Tensor:
        inv_l = torch.exp(-basis.log_lengthscale)
        d2 = ((g[:, None, :] - basis.inducing[None]) * inv_l).pow(2).sum(-1)
        return basis.log_outputscale.exp() * torch.exp(-0.5 * d2)

    ours, ref = basis.cross(g), dense()
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        torch.testing.assert_close(basis.cross(g), ref.detach(), rtol=1e-12, atol=1e-14)
    weights = torch.randn(9, r, dtype=DT)
    params = [g, basis.inducing, basis.log_lengthscale, basis.log_outputscale]
    got = torch.autograd.grad((ours * weights).sum(), params)
    want = torch.autograd.grad((ref * weights).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # a point on an inducing point gets exactly sk2 (the cap), never more
    with torch.no_grad():
        at_z = basis.cross(basis.inducing[:2].clone())
    assert float(at_z.max()) <= math.exp(0.2) * (1 + 1e-15)


def test_rbf_features_and_gradients_match_the_autograd_cholesky_chain() -> None:
    """``phi = Lzz^{-1} k_Z(g)`` with the fused backward of the whitening and of the kernels
    has the values and gradients (g, Z, l, sk2) of the same formula built from torch's dense
    kernel, ``cholesky`` and ``solve_triangular`` under autograd (float64)."""
    h, r = 3, 12
    basis = RBFInducingBasis(h, r, generator=torch.Generator().manual_seed(2)).to(DT)
    with torch.no_grad():
        basis.log_lengthscale.copy_(torch.tensor([-0.3, 0.2, -0.1], dtype=DT))
        basis.log_outputscale.fill_(-0.4)
    g = torch.randn(20, h, dtype=DT, requires_grad=True)
    weights = torch.randn(20, r, dtype=DT)

    def dense_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        inv_l = torch.exp(-basis.log_lengthscale)
        d2 = ((a[:, None, :] - b[None]) * inv_l).pow(2).sum(-1)
        return basis.log_outputscale.exp() * torch.exp(-0.5 * d2)

    kzz = dense_kernel(basis.inducing, basis.inducing)
    jitter = basis.jitter * float(basis.outputscale().detach())
    chol = torch.linalg.cholesky(kzz + jitter * torch.eye(r, dtype=DT))
    ref = torch.linalg.solve_triangular(chol, dense_kernel(g, basis.inducing).T, upper=False).T
    ours = basis(g)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)

    def loss(phi: torch.Tensor) -> torch.Tensor:  # linear and quadratic in phi, like dPPGP
        return (phi * weights).sum() + (phi**2).sum(-1).log().sum()

    params = [g, basis.inducing, basis.log_lengthscale, basis.log_outputscale]
    got = torch.autograd.grad(loss(ours), params)
    want = torch.autograd.grad(loss(ref), params)
    for name, a, b in zip(("g", "Z", "log l", "log sk2"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=name)


def test_whitening_and_scaled_rbf_pass_gradcheck() -> None:
    """Both fused backwards against finite differences (float64); the whitening's ``Kzz``
    enters symmetrised, as the basis builds it."""
    gen = torch.Generator().manual_seed(3)
    cross = torch.randn(6, 5, generator=gen, dtype=DT, requires_grad=True)
    raw = torch.randn(5, 5, generator=gen, dtype=DT)
    raw = (raw @ raw.T + 5 * torch.eye(5, dtype=DT)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c, m: _Whiten.apply(c, 0.5 * (m + m.T), 1e-6), (cross, raw)
    )
    a = torch.randn(7, 3, generator=gen, dtype=DT, requires_grad=True)
    b = torch.randn(4, 3, generator=gen, dtype=DT, requires_grad=True)
    log_sk2 = torch.tensor(0.3, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(_ScaledRBF.apply, (a, b, log_sk2))
    # a against itself: the capped diagonal still carries d k / d log sk2 = k
    kernel = _ScaledRBF.apply(a, a, log_sk2)
    (grad,) = torch.autograd.grad(kernel.diagonal().sum(), [log_sk2])
    torch.testing.assert_close(grad, 7 * log_sk2.detach().exp())


@pytest.mark.parametrize("rank", [8, RIGHT_SOLVES_MAX_RANK + 1])
def test_the_kzz_gradient_sandwich_matches_the_dense_product(rank: int) -> None:
    """``_sandwich(L, D) = L^{-T} D' L^{-1}`` (float64) on both sides of the rank where the
    CPU switches the first solve's side."""
    from geodbk.bases import _sandwich

    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(rank, rank, generator=gen, dtype=torch.float64)
    chol = torch.linalg.cholesky(a @ a.T + rank * torch.eye(rank, dtype=torch.float64))
    lower = torch.tril(torch.randn(rank, rank, generator=gen, dtype=torch.float64))
    inv = torch.linalg.inv(chol)  # the dense reference only
    torch.testing.assert_close(_sandwich(chol, lower), inv.T @ lower.T @ inv)


def test_a_held_kernel_gives_the_same_features_no_kernel_gradient_and_one_reused_factor() -> None:
    """Inside ``fixed_kernel`` phi and its gradient in g are those of the trained path, no
    gradient reaches Z, l or sk2, the factor is computed once while they keep their values and
    again after an in-place change of any of them; requires_grad is restored on leaving."""
    h, r = 3, 10
    basis = RBFInducingBasis(h, r, generator=torch.Generator().manual_seed(4)).to(DT)
    g = torch.randn(15, h, dtype=DT, requires_grad=True)
    want = basis(g)
    (want_g,) = torch.autograd.grad(want.pow(2).sum(), g)
    kernel = basis.kernel_parameters()
    with basis.fixed_kernel():
        assert not any(p.requires_grad for p in kernel)
        got = basis(g)
        got.pow(2).sum().backward()
        first = basis.fixed_chol()
        assert basis.fixed_chol() is first  # reused while nothing changed
        for p in kernel:
            with torch.no_grad():
                p.add_(0.05)
            moved = basis(g)
            assert basis.fixed_chol() is not first
            first = basis.fixed_chol()
            with torch.no_grad():
                ref = _Whiten.apply(basis.cross(g), basis._kzz(), basis._absolute_jitter())
            torch.testing.assert_close(moved, ref, rtol=1e-12, atol=1e-14)
    for p in kernel:  # torch's fused AdamW changes values without bumping version counters
        p.grad = torch.ones_like(p)
    torch.optim.AdamW(kernel, lr=0.1, fused=True).step()
    assert basis.fixed_chol() is not first
    torch.testing.assert_close(basis.fixed_chol(), basis.chol().detach(), rtol=0, atol=0)
    for p in kernel:
        p.grad = None
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert g.grad is not None
    torch.testing.assert_close(g.grad, want_g, rtol=1e-10, atol=1e-12)
    assert all(p.grad is None and p.requires_grad for p in kernel)
    # keep_graph (DDP): the kernel stays in the graph, its gradient is dropped on leaving
    with torch.no_grad():
        want = _Whiten.apply(basis.cross(g), basis._kzz(), basis._absolute_jitter())
    with basis.fixed_kernel(keep_graph=True):
        assert all(p.requires_grad for p in kernel)
        kept = basis(g)
        kept.pow(2).sum().backward()
        assert all(p.grad is not None for p in kernel)
    torch.testing.assert_close(kept, want, rtol=1e-12, atol=1e-14)
    assert all(p.grad is None and p.requires_grad for p in kernel)
    silu = SiLUBasis(h, r)
    with silu.fixed_kernel():
        assert all(p.requires_grad for p in silu.parameters())
