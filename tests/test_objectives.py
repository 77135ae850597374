"""Objectives and posteriors against direct / dense O(n^3) formulas (float64)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from geodbk.model import DBKModel
from geodbk.objectives import (
    dppgp_loss,
    elbo_loss,
    exact_marginal_log_likelihood,
    gaussian_kl_standard,
    gaussian_nll,
    ppgp_loss,
)
from geodbk.posterior import exact_weight_posterior

DT = torch.float64


def _problem(n: int = 40, r: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    phi = torch.randn(n, r, generator=g, dtype=DT) / math.sqrt(r)
    y = torch.randn(n, generator=g, dtype=DT)
    return phi, y


def _random_q(r: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(r, generator=g, dtype=DT)
    a = torch.randn(r, r, generator=g, dtype=DT) * 0.3
    chol = torch.tril(a, -1) + torch.diag(torch.rand(r, generator=g, dtype=DT) + 0.5)
    return m, chol


@pytest.mark.parametrize("hetero", [False, True])
def test_exact_mml_equals_dense_gp(hetero: bool) -> None:
    phi, y = _problem()
    n = phi.shape[0]
    s2 = torch.linspace(0.05, 0.6, n, dtype=DT) if hetero else torch.tensor(0.3, dtype=DT)
    c = 0.4
    ours = exact_marginal_log_likelihood(phi, y, s2, mean=c)
    cov = phi @ phi.T + torch.diag(s2.expand(n))
    dense = MultivariateNormal(torch.full((n,), c, dtype=DT), covariance_matrix=cov).log_prob(y)
    assert abs(float(ours - dense)) < 1e-6


def test_exact_mml_matches_methods_formula() -> None:
    """The doc's Lambda = Phi'Phi + s2 I form, written out literally."""
    phi, y = _problem()
    n, r = phi.shape
    s2 = torch.tensor(0.2, dtype=DT)
    lam = phi.T @ phi + s2 * torch.eye(r, dtype=DT)
    chol = torch.linalg.cholesky(lam)
    v = torch.linalg.solve_triangular(chol, (phi.T @ y)[:, None], upper=False)
    doc = (
        -n / 2 * math.log(2 * math.pi)
        - (n - r) / 2 * torch.log(s2)
        - torch.logdet(lam) / 2
        - (y @ y) / (2 * s2)
        + (v**2).sum() / (2 * s2)
    )
    assert abs(float(exact_marginal_log_likelihood(phi, y, s2) - doc)) < 1e-8


@pytest.mark.parametrize("hetero", [False, True])
def test_exact_posterior_equals_dense_gp_predictive(hetero: bool) -> None:
    phi, y = _problem(n=30, r=5)
    g = torch.Generator().manual_seed(7)
    phi_s = torch.randn(11, 5, generator=g, dtype=DT) / math.sqrt(5)
    n = phi.shape[0]
    s2 = torch.linspace(0.1, 0.5, n, dtype=DT) if hetero else torch.tensor(0.25, dtype=DT)
    c = -0.3
    post = exact_weight_posterior(phi, y, s2, mean=c)
    mean = phi_s @ post.mean + c
    var_f = ((phi_s @ post.scale_tril) ** 2).sum(-1)
    k = phi @ phi.T + torch.diag(s2.expand(n))
    ks = phi_s @ phi.T
    dense_mean = c + ks @ torch.linalg.solve(k, y - c)
    dense_var = (phi_s**2).sum(-1) - (ks * torch.linalg.solve(k, ks.T).T).sum(-1)
    assert torch.allclose(mean, dense_mean, atol=1e-6, rtol=0)
    assert torch.allclose(var_f, dense_var, atol=1e-6, rtol=0)
    assert torch.equal(post.scale_tril, torch.tril(post.scale_tril))
    assert bool((torch.diagonal(post.scale_tril) > 0).all())
    if not hetero:  # the doc form: N(Lambda^{-1} Phi'y, s2 Lambda^{-1})
        lam = phi.T @ phi + s2 * torch.eye(5, dtype=DT)
        assert torch.allclose(post.mean, torch.linalg.solve(lam, phi.T @ (y - c)), atol=1e-9)
        cov = post.scale_tril @ post.scale_tril.T
        assert torch.allclose(cov, s2 * torch.linalg.inv(lam), atol=1e-9)


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
def test_model_exact_prediction_equals_dense_gp(expansion: str) -> None:
    """End to end: the model's folded predictor with the exact posterior = dense GP on Phi."""
    torch.manual_seed(0)
    model = DBKModel(2, expansion=expansion, rank=8, hidden=6, jitter=1e-6).to(DT)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(25, 2, generator=g, dtype=DT) * 2 - 1
    xs = torch.rand(9, 2, generator=g, dtype=DT) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(25, generator=g, dtype=DT)
    with torch.no_grad():
        model.const_mean.fill_(0.2)
        phi, phi_s = model.features(x), model.features(xs)
        s2 = model.noise_var()
        model.set_weight_posterior(exact_weight_posterior(phi, y, s2, mean=0.2))
        mean, var_f, var = model.predict_folded(xs, model.fold())
    k = phi @ phi.T + s2 * torch.eye(25, dtype=DT)
    ks = phi_s @ phi.T
    dense_mean = 0.2 + ks @ torch.linalg.solve(k, y - 0.2)
    dense_var = (phi_s**2).sum(-1) - (ks * torch.linalg.solve(k, ks.T).T).sum(-1)
    assert torch.allclose(mean, dense_mean, atol=1e-6, rtol=0)
    assert torch.allclose(var_f, dense_var, atol=1e-6, rtol=0)
    assert torch.allclose(var, dense_var + s2, atol=1e-6, rtol=0)


def test_kl_matches_torch_distributions() -> None:
    m, chol = _random_q(7)
    ours = gaussian_kl_standard(m, chol)
    ref = kl_divergence(
        MultivariateNormal(m, scale_tril=chol),
        MultivariateNormal(torch.zeros(7, dtype=DT), scale_tril=torch.eye(7, dtype=DT)),
    )
    assert abs(float(ours - ref)) < 1e-10


def test_kl_gradient_equals_the_autograd_of_its_formula() -> None:
    """The one-pass backward of the KL (``dKL/dL = L - diag(1 / L_ii)``) against autograd of
    the closed form on the same inputs, and gradcheck (float64)."""
    m, chol = _random_q(6)
    m.requires_grad_()
    chol = chol.detach().requires_grad_()
    got = torch.autograd.grad(gaussian_kl_standard(m, chol), (m, chol))
    batched = gaussian_kl_standard(m[None], chol[None])[0]  # the closed form under autograd
    want = torch.autograd.grad(batched, (m, chol))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(gaussian_kl_standard, (m, chol))


def _dppgp_ours_and_direct(**scale: float) -> tuple[float, float]:
    """dPPGP on a batch, ours (with the inputs named in ``scale`` scaled) and written out."""
    phi, y = _problem(n=17, r=5)
    m, chol = _random_q(5)
    s2 = torch.tensor(0.15, dtype=DT)
    c = 0.1
    mu = phi @ m + c
    var_f = ((phi @ chol) ** 2).sum(-1)
    phi_sq = (phi**2).sum(-1)
    kl = gaussian_kl_standard(m, chol)
    alpha, beta, n_total = 0.3, 0.05, 1000
    inputs = {"mean": mu, "var_f": var_f, "phi_sq": phi_sq, "noise": s2, "kl": kl}
    for name, factor in scale.items():
        inputs[name] = inputs[name] * factor
    ours = dppgp_loss(
        inputs["mean"],
        inputs["var_f"],
        inputs["phi_sq"],
        y,
        inputs["noise"],
        kl=inputs["kl"],
        n=n_total,
        alpha=alpha,
        beta=beta,
    )
    b = phi.shape[0]
    direct = 0.0
    kmax = max(float(phi[i] @ phi[i]) for i in range(b))
    for i in range(b):
        mu_i = float(phi[i] @ m) + c
        v_i = float(phi[i] @ chol @ chol.T @ phi[i]) + float(s2)
        direct += 0.5 * math.log(2 * math.pi * v_i) + (float(y[i]) - mu_i) ** 2 / (2 * v_i)
        direct += alpha * (kmax - float(phi[i] @ phi[i])) / (2 * float(s2))
    direct /= b
    direct += beta / n_total * float(kl)
    return float(ours), direct


def test_dppgp_matches_direct_formula() -> None:
    ours, direct = _dppgp_ours_and_direct()
    assert abs(ours - direct) < 1e-10


@pytest.mark.parametrize("factor", ["mean", "var_f", "phi_sq", "noise", "kl"])
def test_dppgp_reference_fails_when_a_factor_is_perturbed(factor: str) -> None:
    """Mutation check: one term of the loss 0.1% off and the comparison above fails."""
    ours, direct = _dppgp_ours_and_direct(**{factor: 1.001})
    assert abs(ours - direct) > 1e-10  # the tolerance of the comparison


def test_exact_references_fail_when_a_factor_is_perturbed() -> None:
    """Mutation check: Phi, s2 or c 0.1% off in the exact marginal likelihood and posterior."""
    phi, y = _problem()
    n = phi.shape[0]
    s2 = torch.linspace(0.05, 0.6, n, dtype=DT)
    cov = phi @ phi.T + torch.diag(s2)
    dense = MultivariateNormal(torch.full((n,), 0.4, dtype=DT), covariance_matrix=cov).log_prob(y)
    for args in ((phi * 1.001, s2, 0.4), (phi, s2 * 1.001, 0.4), (phi, s2, 0.4 * 1.001)):
        assert (
            abs(float(exact_marginal_log_likelihood(args[0], y, args[1], mean=args[2]) - dense))
            > 1e-4
        )
        post = exact_weight_posterior(args[0], y, args[1], mean=args[2])
        k_inv_r = torch.linalg.solve(cov, y - 0.4)
        assert not torch.allclose(phi @ post.mean + 0.4, 0.4 + phi @ phi.T @ k_inv_r, atol=1e-6)


def _ppgp_elbo_ours_and_direct(scale: float = 1.0) -> tuple[float, float, float, float]:
    """PPGP and ELBO losses, ours (var_correction and var_f scaled by ``scale``) and direct."""
    phi, y = _problem(n=13, r=4)
    m, chol = _random_q(4)
    s2 = torch.tensor(0.2, dtype=DT)
    mu = phi @ m
    var_f = ((phi @ chol) ** 2).sum(-1)
    corr = torch.rand(13, dtype=DT, generator=torch.Generator().manual_seed(5))
    kl = gaussian_kl_standard(m, chol)
    pp = ppgp_loss(mu, var_f, y, s2, kl=kl, n=100, beta=0.5, var_correction=corr * scale)
    pp_ref = gaussian_nll(y, mu, var_f + corr + s2).mean() + 0.5 / 100 * kl
    # ELBO: E_q[-log N(y; w'phi, s2)] with E_q[(y - w'phi)^2] = (y - m'phi)^2 + phi'LL'phi
    el = elbo_loss(mu, var_f * scale, y, s2, kl=kl, n=100)
    cov = chol @ chol.T
    sq = torch.stack([(y[i] - phi[i] @ m) ** 2 + phi[i] @ cov @ phi[i] for i in range(13)])
    direct = (0.5 * torch.log(2 * math.pi * s2) + sq / (2 * s2)).mean() + kl / 100
    return float(pp), float(pp_ref), float(el), float(direct)


def test_ppgp_and_elbo_direct_formulas() -> None:
    pp, pp_ref, el, direct = _ppgp_elbo_ours_and_direct()
    assert abs(pp - pp_ref) < 1e-12
    assert abs(el - direct) < 1e-12
    # mutation check: the correction (PPGP) or var_f (ELBO) 0.1% off fails the comparison
    pp, pp_ref, el, direct = _ppgp_elbo_ours_and_direct(1.001)
    assert abs(pp - pp_ref) > 1e-12 and abs(el - direct) > 1e-12


def test_gradcheck_objectives() -> None:
    g = torch.Generator().manual_seed(0)
    b, r = 6, 3
    phi = (torch.randn(b, r, generator=g, dtype=DT) / 2).requires_grad_()
    y = torch.randn(b, generator=g, dtype=DT)
    m0, c0 = _random_q(r)
    m = m0.clone().requires_grad_()
    chol = c0.clone().requires_grad_()
    s2 = torch.tensor(0.3, dtype=DT, requires_grad=True)

    def dppgp(phi: torch.Tensor, m: torch.Tensor, chol: torch.Tensor, s2: torch.Tensor):
        mu = phi @ m
        var_f = ((phi @ torch.tril(chol)) ** 2).sum(-1)
        kl = gaussian_kl_standard(m, torch.tril(chol))
        return dppgp_loss(mu, var_f, (phi**2).sum(-1), y, s2, kl=kl, n=50, alpha=0.1, beta=0.1)

    def ppgp(phi: torch.Tensor, m: torch.Tensor, chol: torch.Tensor, s2: torch.Tensor):
        mu = phi @ m
        var_f = ((phi @ torch.tril(chol)) ** 2).sum(-1)
        kl = gaussian_kl_standard(m, torch.tril(chol))
        corr = 2.0 - (phi**2).sum(-1)
        return ppgp_loss(mu, var_f, y, s2, kl=kl, n=50, beta=0.1, var_correction=corr)

    def elbo(phi: torch.Tensor, m: torch.Tensor, chol: torch.Tensor, s2: torch.Tensor):
        mu = phi @ m
        var_f = ((phi @ torch.tril(chol)) ** 2).sum(-1)
        return elbo_loss(mu, var_f, y, s2, kl=gaussian_kl_standard(m, torch.tril(chol)), n=50)

    def mml(phi: torch.Tensor, s2: torch.Tensor):
        return exact_marginal_log_likelihood(phi, y, s2, mean=0.1)

    for fn in (dppgp, ppgp, elbo):
        assert torch.autograd.gradcheck(fn, (phi, m, chol, s2))
    assert torch.autograd.gradcheck(mml, (phi, s2))
    s2_vec = torch.linspace(0.1, 0.4, b, dtype=DT).requires_grad_()
    assert torch.autograd.gradcheck(mml, (phi, s2_vec))


def test_noise_var_broadcasts_per_point() -> None:
    """A per-point noise tensor plugs into every objective."""
    phi, y = _problem(n=10, r=3)
    m, chol = _random_q(3)
    mu = phi @ m
    var_f = ((phi @ chol) ** 2).sum(-1)
    kl = gaussian_kl_standard(m, chol)
    s2_i = torch.linspace(0.1, 1.0, 10, dtype=DT)
    loss = dppgp_loss(mu, var_f, (phi**2).sum(-1), y, s2_i, kl=kl, n=10, alpha=0.0, beta=0.0)
    assert abs(float(loss - gaussian_nll(y, mu, var_f + s2_i).mean())) < 1e-12


def test_split_batch_parts_add_up_to_the_batch_loss() -> None:
    """Parts of a batch with ``size=|B|`` (one part empty) and a third of the KL each sum to
    the loss of the whole batch, for every mini-batch objective (per-point noise s2_i)."""
    phi, y = _problem(n=10, r=4)
    m, chol = _random_q(4)
    s2 = torch.linspace(0.1, 0.5, 10, dtype=DT)
    mu, var_f, phi_sq = phi @ m, ((phi @ chol) ** 2).sum(-1), (phi**2).sum(-1)
    corr = torch.rand(10, dtype=DT, generator=torch.Generator().manual_seed(2))
    kl = gaussian_kl_standard(m, chol)

    def losses(p: slice, share: float, size: int | None) -> list[torch.Tensor]:
        return [
            dppgp_loss(
                mu[p],
                var_f[p],
                phi_sq[p],
                y[p],
                s2[p],
                kl=share * kl,
                alpha=0.3,
                beta=0.5,
                phi_sq_max=phi_sq.max(),
                n=100,
                size=size,
            ),
            ppgp_loss(
                mu[p],
                var_f[p],
                y[p],
                s2[p],
                kl=share * kl,
                beta=0.5,
                var_correction=corr[p],
                n=100,
                size=size,
            ),
            elbo_loss(
                mu[p],
                var_f[p],
                y[p],
                s2[p],
                kl=share * kl,
                var_correction=corr[p],
                n=100,
                size=size,
            ),
        ]

    whole = losses(slice(0, 10), 1.0, None)
    parts = [losses(p, 1 / 3, 10) for p in (slice(0, 3), slice(3, 3), slice(3, 10))]
    for k, want in enumerate(whole):
        got = sum(part[k] for part in parts)
        assert abs(float(got - want)) < 1e-12 * abs(float(want))
    # the empty part is its KL share alone: (β / n) KL / 3, and KL / (3 n) for the ELBO
    kl_weights = (0.5 / 100, 0.5 / 100, 1 / 100)
    for part, weight in zip(parts[1], kl_weights, strict=True):
        assert float(part) == pytest.approx(weight * float(kl) / 3, rel=1e-12)
