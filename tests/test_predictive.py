"""Predictive moments (geodbk.predictive) with the exact and the truncated variance factor."""

from __future__ import annotations

import pytest
import torch

from geodbk.model import DBKModel
from geodbk.posterior import WeightPosterior, feature_sq_bound, fold_into_basis
from geodbk.predictive import change_moments

DT = torch.float64


def _model_with_decaying_posterior(r: int = 32) -> DBKModel:
    """A DBK-RBF model whose q(w) has the spectrum ``0.7^j`` in random directions."""
    torch.manual_seed(0)
    model = DBKModel(2, rank=r, hidden=6).to(DT)
    q, _ = torch.linalg.qr(torch.randn(r, r, dtype=DT))
    cov = (q * 0.7 ** torch.arange(r, dtype=DT)) @ q.T
    post = WeightPosterior(
        mean=torch.randn(r, dtype=DT), scale_tril=torch.linalg.cholesky(0.5 * (cov + cov.T))
    )
    model.set_weight_posterior(post)
    return model


@pytest.mark.parametrize("correction", [False, True])
def test_change_variance_drops_by_at_most_twice_the_bound(correction: bool) -> None:
    model = _model_with_decaying_posterior()
    post = model.weight_posterior()
    s2 = 1e-2
    exact = fold_into_basis(model.basis, post, with_whitener=correction)
    trunc = fold_into_basis(
        model.basis, post, with_whitener=correction, variance_rtol=1e-1, min_noise_var=s2
    )
    assert trunc.truncated and 0.0 < trunc.variance_bound <= 1e-1 * s2
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ga = model.backbone(torch.rand(4000, 2, generator=g, dtype=DT) * 4 - 2)
        gb = model.backbone(torch.rand(4000, 2, generator=g, dtype=DT) * 4 - 2)
        ua, ub = model.basis.raw_features(ga), model.basis.raw_features(gb)
        d2 = (((gb - ga) * torch.exp(-model.basis.log_lengthscale)) ** 2).sum(-1)
        prior = 2.0 * model.basis.outputscale() * (-torch.expm1(-0.5 * d2))
        m0, v0 = change_moments(ua, ub, exact, prior_diff_var=prior)
        m1, v1 = change_moments(ua, ub, trunc, prior_diff_var=prior)
        phi_diff = ((model.basis(gb) - model.basis(ga)) ** 2).sum(-1)
    c = feature_sq_bound(model.basis)
    assert c is not None
    assert float(phi_diff.max()) <= 2.0 * c  # ||phi_b - phi_a||^2 <= d~(a, b) <= 2 sk2
    assert torch.equal(m0, m1)
    d = v0 - v1
    assert float(d.min()) >= -1e-12 and float(d.max()) <= 2.0 * trunc.variance_bound
    assert float(d.max()) > 0.0


def test_latent_variance_drops_by_at_most_the_bound() -> None:
    model = _model_with_decaying_posterior()
    exact = model.fold(variance_rtol=0.0)
    s2 = model.min_noise_var()
    trunc = model.fold(variance_rtol=1.0)
    assert trunc.truncated and trunc.variance_bound <= s2
    x = torch.rand(4000, 2, dtype=DT) * 4 - 2
    _, vf0, v0 = model.predict_folded(x, exact)
    _, vf1, v1 = model.predict_folded(x, trunc)
    d = vf0 - vf1
    assert float(d.min()) >= -1e-12 and float(d.max()) <= trunc.variance_bound
    assert float(((v0 - v1) / v0).max()) <= 1.0  # variance_rtol, since var >= min s2


def test_chunk_rows_are_capped_on_the_cpu_only() -> None:
    """On the CPU a chunk keeps rows x width within CPU_CHUNK_VALUES (at least
    CPU_CHUNK_MIN_ROWS rows, never more than asked); a GPU, or no width, keeps chunk_size."""
    from geodbk.predictive import CPU_CHUNK_MIN_ROWS, CPU_CHUNK_VALUES, chunk_rows_for

    assert chunk_rows_for(65536, device="cpu", width=256) == CPU_CHUNK_VALUES // 256
    assert chunk_rows_for(65536, device="cpu", width=10**7) == CPU_CHUNK_MIN_ROWS
    assert chunk_rows_for(100, device="cpu", width=256) == 100
    assert chunk_rows_for(65536, device="cpu") == 65536
    assert chunk_rows_for(65536, device="cuda", width=256) == 65536


def test_predict_in_chunks_gives_the_same_values_whatever_the_cap() -> None:
    """The capped chunking changes only the work's grouping: outputs equal one big chunk."""
    import numpy as np
    import torch

    from geodbk.predictive import predict_in_chunks

    x = np.random.default_rng(0).normal(size=(5000, 2))

    def fn(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return xb.sum(1), (xb**2).sum(1)

    one = predict_in_chunks(fn, x, chunk_size=5000, device=torch.device("cpu"), dtype=torch.float64)
    capped = predict_in_chunks(
        fn, x, chunk_size=5000, device=torch.device("cpu"), dtype=torch.float64, width=1 << 20
    )
    for a, b in zip(one, capped, strict=True):
        np.testing.assert_array_equal(a, b)
