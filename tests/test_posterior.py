"""Weight posteriors and their folding (geodbk.posterior): the truncated variance factor's
bound against dense float64 references."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from geodbk import DBKRegressor
from geodbk.model import DBKModel
from geodbk.posterior import (
    MAX_RANK_FRACTION,
    VARIANCE_RTOL,
    FoldedWeights,
    WeightPosterior,
    feature_sq_bound,
    fold_into_basis,
    lower_triangular_factor,
    truncate_variance_factor,
    truncation_rank,
)
from geodbk.triangular import block_width_for

DT = torch.float64


def _decaying_covariance(r: int, *, seed: int, decay: float = 0.7) -> tuple[torch.Tensor, ...]:
    """``(L, V, lam)``: a random SPD ``S = V diag(lam) V' = L L'`` with ``lam_j = decay^j``."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=DT))
    lam = decay ** torch.arange(r, dtype=DT)
    cov = (q * lam) @ q.T
    return torch.linalg.cholesky(0.5 * (cov + cov.T)), q, lam


def _features(n: int, r: int, c: float, *, seed: int) -> torch.Tensor:
    """n random vectors with ``||phi||^2`` uniform in (0, c]."""
    g = torch.Generator().manual_seed(seed)
    phi = torch.randn(n, r, generator=g, dtype=DT)
    scale = torch.rand(n, 1, generator=g, dtype=DT) * c
    return phi / phi.norm(dim=1, keepdim=True) * scale.sqrt()


def _var(phi: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return ((phi @ factor) ** 2).sum(-1)


def _bound_holds(exact: torch.Tensor, approx: torch.Tensor, atol: float) -> bool:
    """The check the tests apply: ``0 <= exact - approx <= atol`` (float64 rounding aside)."""
    d = exact - approx
    slack = 1e-12 * float(exact.abs().max())
    return bool((d >= -slack).all() and (d <= atol + slack).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truncated_variance_is_within_the_bound_and_the_bound_is_attained(seed: int) -> None:
    r, c, atol = 40, 2.5, 1e-3
    L, V, lam = _decaying_covariance(r, seed=seed)
    out = truncate_variance_factor(L, atol=atol, feature_sq_bound=c)
    assert out is not None
    factor, bound = out
    k = factor.shape[1]
    assert k == truncation_rank(lam, threshold=atol / c)
    assert bound == pytest.approx(float(lam[k]) * c, rel=1e-10)  # lambda_{k+1} C
    assert bound <= atol < float(lam[k - 1]) * c  # k is the smallest rank that meets atol
    phi = _features(2000, r, c, seed=seed + 10)
    exact, approx = _var(phi, L), _var(phi, factor)
    assert _bound_holds(exact, approx, bound)
    # the bound is attained at phi = sqrt(C) v_{k+1}
    worst = (c**0.5 * V[:, k])[None, :]
    assert float(_var(worst, L) - _var(worst, factor)) == pytest.approx(bound, rel=1e-9)


def test_the_bound_check_fails_for_one_eigenpair_fewer_or_a_perturbed_eigenvalue() -> None:
    r, c, atol = 30, 1.0, 1e-3
    L, V, _ = _decaying_covariance(r, seed=5)
    out = truncate_variance_factor(L, atol=atol, feature_sq_bound=c)
    assert out is not None
    factor, _ = out
    k = factor.shape[1]
    phi = torch.cat([_features(500, r, c, seed=6), c**0.5 * V.T])  # random points and each v_j
    exact = _var(phi, L)
    assert _bound_holds(exact, _var(phi, factor), atol)
    assert not _bound_holds(exact, _var(phi, factor[:, : k - 1]), atol)  # drop v_k too
    bumped = factor.clone()
    bumped[:, 0] *= (1.0 + 1e-2) ** 0.5  # lambda_1 -> 1.01 lambda_1
    assert not _bound_holds(exact, _var(phi, bumped), atol)


def test_a_flat_spectrum_does_not_truncate() -> None:
    r = 16
    L = 0.7 * torch.eye(r, dtype=DT)
    assert truncate_variance_factor(L, atol=1e-3, feature_sq_bound=1.0) is None
    post = WeightPosterior(mean=torch.zeros(r, dtype=DT), scale_tril=L)
    model = DBKModel(2, rank=r, hidden=4).to(DT)
    folded = fold_into_basis(model.basis, post, variance_rtol=1e-3, min_noise_var=1e-2)
    assert folded.factor.shape == (r, r) and folded.variance_bound == 0.0
    assert not folded.truncated


def test_no_gain_above_the_rank_fraction() -> None:
    r = 20
    lam = torch.cat([torch.ones(17, dtype=DT), torch.full((3,), 1e-9, dtype=DT)])
    L = torch.diag(lam.sqrt())
    assert truncate_variance_factor(L, atol=1e-3, feature_sq_bound=1.0) is None  # k=17 > 16
    out = truncate_variance_factor(L, atol=1e-3, feature_sq_bound=1.0, max_rank_fraction=0.9)
    assert out is not None and out[0].shape == (r, 17)
    assert MAX_RANK_FRACTION == 0.8


def test_truncation_needs_the_noise_floor() -> None:
    model = DBKModel(2, rank=8, hidden=4).to(DT)
    post = model.weight_posterior()
    with pytest.raises(ValueError, match="min_noise_var"):
        fold_into_basis(model.basis, post, variance_rtol=1e-3)


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
def test_feature_bound_holds_everywhere(expansion: str) -> None:
    torch.manual_seed(0)
    model = DBKModel(3, expansion=expansion, rank=24, hidden=8).to(DT)
    with torch.no_grad():
        for p in model.parameters():  # move away from the initialisation
            p.add_(0.3 * torch.randn_like(p))
        c = feature_sq_bound(model.basis, out_norm=model.backbone.out_norm)
        assert c is not None
        x = torch.randn(5000, 3, dtype=DT) * torch.logspace(-1, 3, 5000, dtype=DT)[:, None]
        phi_sq = (model.features(x) ** 2).sum(-1)
    assert float(phi_sq.max()) <= c
    if expansion == "rbf":
        assert c == pytest.approx(float(model.basis.outputscale().detach()))
    else:
        assert feature_sq_bound(model.basis) is None  # no backbone bound, no truncation


def test_min_noise_var_is_the_tests_noise_floor() -> None:
    model = DBKModel(2, rank=4, hidden=4, noise="tests+devices").to(DT)
    s2 = model.min_noise_var()
    big = torch.tensor([[1e12, 1e12]], dtype=DT)
    assert float(model.noise_var(big).detach()) == pytest.approx(s2, rel=1e-9)
    assert float(model.noise_var(torch.tensor([[1.0, 1.0]], dtype=DT)).detach()) > s2
    const = DBKModel(2, rank=4, hidden=4).to(DT)
    assert const.min_noise_var() == pytest.approx(float(const.noise_var().detach()))


# ---------------------------------------------------------------- a trained tiny DBKRegressor
SMALL: dict[str, Any] = {
    "rank": 24,
    "hidden": 8,
    "batch_size": 32,
    "epochs": 3,
    "device": "cpu",
    "seed": 0,
    "dtype": "float64",
}


@pytest.fixture(scope="module", params=["rbf", "silu"])
def fitted(request: pytest.FixtureRequest) -> DBKRegressor:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(150, 2))
    y = 3.0 + 0.4 * np.sin(3 * x[:, 0]) + rng.normal(scale=0.1, size=150)
    return DBKRegressor(**SMALL, expansion=request.param).fit(x, y)


def _rtol_that_truncates(core: DBKModel) -> float:
    """A relative tolerance whose bound keeps about half the eigenpairs."""
    L = core.q.scale_tril().detach().to(DT)
    lam = torch.linalg.eigvalsh(L @ L.T).flip(0)
    c = feature_sq_bound(core.basis, out_norm=core.backbone.out_norm)
    assert c is not None
    return float(lam[core.rank // 2]) * c / core.min_noise_var() * 1.0001


def test_trained_model_truncated_prediction_is_within_the_bound(fitted: DBKRegressor) -> None:
    core = fitted.model_
    rtol = _rtol_that_truncates(core)
    exact = core.fold(variance_rtol=0.0)
    trunc = core.fold(variance_rtol=rtol)
    assert trunc.truncated and trunc.factor.shape[1] <= MAX_RANK_FRACTION * core.rank
    assert 0.0 < trunc.variance_bound <= rtol * core.min_noise_var()
    x = torch.rand(3000, 2, dtype=DT) * 4 - 2
    m0, vf0, v0 = core.predict_folded(x, exact)
    m1, vf1, v1 = core.predict_folded(x, trunc)
    assert torch.equal(m0, m1)  # the mean stays exact
    assert _bound_holds(vf0, vf1, trunc.variance_bound)
    assert float(((v0 - v1) / v0).max()) <= rtol


def test_exact_option_reproduces_the_dense_prediction(fitted: DBKRegressor) -> None:
    core = fitted.model_
    x = torch.rand(500, 2, dtype=DT) * 4 - 2
    with torch.no_grad():
        out = core(x)
    folded = core.fold(variance_rtol=0.0)
    assert folded.factor.shape == (core.rank, core.rank) and folded.variance_bound == 0.0
    mean, var_f, _ = core.predict_folded(x, folded)
    torch.testing.assert_close(mean, out.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(var_f, out.var_f, rtol=1e-12, atol=1e-12)
    direct = fold_into_basis(core.basis, core.weight_posterior())
    assert torch.equal(direct.factor, folded.factor)


def test_default_fold_is_exact_and_the_opt_in_keeps_the_relative_bound(
    fitted: DBKRegressor,
) -> None:
    core = fitted.model_
    exact = core.fold()
    assert exact.variance_bound == 0.0 and not exact.truncated
    folded = core.fold(variance_rtol=VARIANCE_RTOL)  # a tiny trained model keeps every pair
    assert folded.variance_bound <= VARIANCE_RTOL * core.min_noise_var()
    x = torch.rand(1000, 2, dtype=DT) * 2 - 1
    _, _, v0 = core.predict_folded(x, core.fold(variance_rtol=0.0))
    _, _, v1 = core.predict_folded(x, folded)
    assert float(((v0 - v1).abs() / v0).max()) <= 1e-3


@pytest.mark.parametrize("r", [24, 200, 256])
def test_lower_triangular_factor_keeps_the_covariance(r: int) -> None:
    g = torch.Generator().manual_seed(r)
    full = torch.randn(r, r, generator=g, dtype=DT)  # a dense B (DBK-RBF's P L)
    lower = lower_triangular_factor(full)
    assert not bool(torch.triu(lower, diagonal=1).any())
    torch.testing.assert_close(lower @ lower.T, full @ full.T, rtol=1e-10, atol=1e-10)
    tril = torch.tril(full)  # already lower (DBK-SiLU's L): returned as is
    assert lower_triangular_factor(tril) is tril


@pytest.mark.parametrize(("r", "width"), [(24, 0), (200, 64), (256, 64), (1024, 128)])
def test_blocked_variance_equals_the_dense_quadratic_form(r: int, width: int) -> None:
    assert block_width_for(r) == width
    g = torch.Generator().manual_seed(1)
    full = torch.randn(r, r, generator=g, dtype=DT) / r**0.5
    u = torch.randn(300, r, generator=g, dtype=DT)
    folded = FoldedWeights(
        mean_vec=torch.zeros(r, dtype=DT),
        factor=lower_triangular_factor(full),
        block_width=width,
    )
    dense = torch.einsum("ni,ij,nj->n", u, full @ full.T, u)  # u' B B' u
    torch.testing.assert_close(folded.latent_variance(u), dense, rtol=1e-10, atol=1e-10)
    # a factor that is not lower triangular would lose its upper blocks
    if width:
        wrong = FoldedWeights(mean_vec=folded.mean_vec, factor=full, block_width=width)
        assert not torch.allclose(wrong.latent_variance(u), dense, rtol=1e-3)


def test_fold_makes_the_exact_factor_lower_triangular(fitted: DBKRegressor) -> None:
    core = fitted.model_
    folded = core.fold()
    assert not bool(torch.triu(folded.factor, diagonal=1).any())
    assert folded.block_width == block_width_for(core.rank)
    b = core.basis.pullback(core.weight_posterior().scale_tril)
    torch.testing.assert_close(folded.factor @ folded.factor.T, b @ b.T, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
def test_blocked_fold_reproduces_the_dense_prediction(expansion: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(300, 2))
    y = 3.0 + 0.4 * np.sin(3 * x[:, 0]) + rng.normal(scale=0.1, size=300)
    params = {**SMALL, "rank": 200, "epochs": 1, "expansion": expansion}
    core = DBKRegressor(**params).fit(x, y).model_
    folded = core.fold()
    assert folded.block_width == 64
    xs = torch.rand(400, 2, dtype=DT) * 2 - 1
    with torch.no_grad():
        out = core(xs)
    mean, var_f, _ = core.predict_folded(xs, folded)
    torch.testing.assert_close(mean, out.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(var_f, out.var_f, rtol=1e-9, atol=1e-12)
