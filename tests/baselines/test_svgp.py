"""The sparse-variational baselines (geodbk/baselines/svgp.py): SV-RBF, SV-DKL, PP-DKL, VBLL.

* What each constructor builds: the backbone, basis, objective and (PP-DKL) beta; SV-RBF's
  bundle records its name.
* Objective values on fixed parameters agree with GPyTorch (the reference implementation):
  SV-RBF (identity backbone + whitened RBF inducing basis + ELBO with the base-kernel variance
  correction) vs ``gpytorch.models.ApproximateGP`` with a whitened ``VariationalStrategy`` and
  ``gpytorch.mlls.VariationalELBO`` — same inducing points, variational parameters and
  hyperparameters; PP-DKL (PPGP with the correction, β = 1, on the residual-MLP features g(x))
  vs ``gpytorch.mlls.PredictiveLogLikelihood`` on the same g(x); SV-DKL's ELBO on g(x) vs
  ``VariationalELBO``. float64; the jitter is set to 1e-10 on both sides (GPyTorch adds it to
  Kzz and to k(x, x)). Skipped without gpytorch.
* Each takes the tests-aware noise s2_i = s2_floor + s2_meas / tests_i^p (issue 9) and keeps
  it through save/load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from baseline_helpers import region, rows_with_tests
from torch import nn

from geodbk.baselines.svgp import SVRBFRegressor, pp_dkl, sv_dkl, vbll
from geodbk.bases import RBFInducingBasis
from geodbk.errors import DataError
from geodbk.estimator import DBKRegressor
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.training import LoopConfig, batch_loss

try:
    import gpytorch
except ImportError:  # the reference is a dev dependency
    gpytorch = None

needs_gpytorch = pytest.mark.skipif(gpytorch is None, reason="gpytorch (the reference) is absent")

JITTER = 1e-10


def _randomise(model: DBKModel, gen: torch.Generator) -> None:
    """Non-trivial q(w), inducing points, lengthscales, outputscale, noise and mean."""
    r = model.rank
    with torch.no_grad():
        h = model.basis.inducing.shape[1]
        model.basis.inducing.copy_(torch.rand(r, h, generator=gen, dtype=torch.float64) * 2 - 1)
        model.basis.log_lengthscale.copy_(
            torch.log(0.5 + torch.rand(h, generator=gen, dtype=torch.float64))
        )
        model.basis.log_outputscale.fill_(np.log(1.7))
        model.q.mean.copy_(0.5 * torch.randn(r, generator=gen, dtype=torch.float64))
        model.q.log_diag.copy_(-1.0 + 0.3 * torch.randn(r, generator=gen, dtype=torch.float64))
        model.q.lower.copy_(0.1 * torch.randn(r, r, generator=gen, dtype=torch.float64))
        model.noise.raw.fill_(float(np.log(np.expm1(0.3 - model.noise.floor))))
        model.const_mean.fill_(0.25)


def _gp(inducing: torch.Tensor):  # type: ignore[no-untyped-def]
    """A GPyTorch SVGP (whitened ``VariationalStrategy``, constant mean, scaled RBF-ARD)."""

    class _GP(gpytorch.models.ApproximateGP):  # type: ignore[misc]
        def __init__(self, inducing: torch.Tensor) -> None:
            dist = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[0])
            strategy = gpytorch.variational.VariationalStrategy(
                self, inducing, dist, learn_inducing_locations=True, jitter_val=JITTER
            )
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=inducing.shape[1])
            )

        def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x)
            )

    return _GP(inducing)


def _reference(model: DBKModel) -> tuple[object, object]:
    """A GPyTorch SVGP holding exactly the parameters of ``model``."""
    basis = model.basis
    gp = _gp(basis.inducing.detach().clone()).double()
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    with torch.no_grad():
        gp.covar_module.base_kernel.lengthscale = basis.log_lengthscale.exp().detach().clone()
        gp.covar_module.outputscale = basis.outputscale().detach().clone()
        gp.mean_module.constant.fill_(float(model.const_mean))
        var = gp.variational_strategy._variational_distribution
        var.variational_mean.copy_(model.q.mean.detach())
        var.chol_variational_covar.copy_(model.q.scale_tril().detach())
        gp.variational_strategy.variational_params_initialized.fill_(1)
        lik.noise = model.noise_var().detach().clone()
    gp.train()
    lik.train()
    return gp, lik


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
    return X, y


@needs_gpytorch
def test_sv_rbf_elbo_matches_gpytorch_variational_elbo() -> None:
    est = SVRBFRegressor(rank=7, jitter=JITTER, dtype="float64")
    model = est._build_model(2, torch.device("cpu"))
    _randomise(model, torch.Generator().manual_seed(0))
    X, y = _data(40, 2, seed=1)
    n_total = 500  # a mini-batch of a larger data set: KL is scaled by 1/n_total
    ours = batch_loss(
        model,
        X,
        y,
        n=n_total,
        config=LoopConfig.of(DBKHyperparameters(objective="elbo"), variance_correction=True),
    )
    gp, lik = _reference(model)
    mll = gpytorch.mlls.VariationalELBO(lik, gp, num_data=n_total)
    ref = -mll(gp(X), y)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-8)


@needs_gpytorch
def test_sv_rbf_predictive_matches_gpytorch() -> None:
    est = SVRBFRegressor(rank=6, jitter=JITTER, dtype="float64")
    model = est._build_model(2, torch.device("cpu"))
    _randomise(model, torch.Generator().manual_seed(3))
    X, _ = _data(25, 2, seed=4)
    out = model(X)
    var_f = out.var_f + out.var_correction
    gp, _ = _reference(model)
    gp.eval()
    with torch.no_grad():
        f = gp(X)
    torch.testing.assert_close(out.mean, f.mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(var_f, f.variance, rtol=1e-7, atol=1e-8)


@needs_gpytorch
@pytest.mark.parametrize(
    ("objective", "mll_cls"), [("ppgp", "PredictiveLogLikelihood"), ("elbo", "VariationalELBO")]
)
def test_deep_kernel_objectives_match_gpytorch(objective: str, mll_cls: str) -> None:
    """PP-DKL (β = 1) and SV-DKL on the backbone features g(x)."""
    torch.manual_seed(0)
    model = DBKModel(2, expansion="rbf", rank=8, hidden=5, jitter=JITTER).double()
    _randomise(model, torch.Generator().manual_seed(5))
    X, y = _data(50, 2, seed=6)
    n_total = 300
    config = LoopConfig.of(
        DBKHyperparameters(objective=objective, beta=1.0), variance_correction=True
    )
    ours = batch_loss(model, X, y, n=n_total, config=config)
    gp, lik = _reference(model)
    mll = getattr(gpytorch.mlls, mll_cls)(lik, gp, num_data=n_total, beta=1.0)
    ref = -mll(gp(model.backbone(X)), y)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------------------------- constructors
def test_constructors_build_their_backbone_basis_and_objective(tmp_path: Path) -> None:
    """SV-DKL, PP-DKL and VBLL are DBKRegressors with their basis and objective (PP-DKL with
    beta = 1), each option overridable; SV-RBF puts a seeded RBF basis on the raw inputs behind
    an identity backbone and records its name in its bundle."""
    expected = {
        sv_dkl: ("rbf", "elbo", 0.01),
        pp_dkl: ("rbf", "ppgp", 1.0),
        vbll: ("silu", "elbo", 0.01),
    }
    for make, (expansion, objective, beta) in expected.items():
        est = make(rank=4)
        assert type(est) is DBKRegressor and est.rank == 4
        assert (est.expansion, est.objective, est.beta) == (expansion, objective, beta)
    assert sv_dkl(objective="ppgp").objective == "ppgp" and pp_dkl(beta=0.1).beta == 0.1
    est = SVRBFRegressor(rank=5, seed=3, dtype="float64")
    model = est._build_model(3, torch.device("cpu"))
    assert isinstance(model.backbone, nn.Identity) and isinstance(model.basis, RBFInducingBasis)
    assert model.basis.inducing.shape == (5, 3) and model.basis.inducing.dtype == torch.float64
    again = SVRBFRegressor(rank=5, seed=3, dtype="float64")._build_model(3, torch.device("cpu"))
    assert torch.equal(model.basis.inducing, again.basis.inducing)
    X, y = region(60, seed=5)
    fitted = SVRBFRegressor(rank=6, epochs=1, batch_size=30, device="cpu").fit(X, y)
    back = SVRBFRegressor.load(fitted.save(tmp_path / "m", metadata={"note": "x"}))
    assert type(back) is SVRBFRegressor
    assert back.metadata_ == {"note": "x", "baseline": "sv-rbf"}
    np.testing.assert_allclose(back.predict(X[:5]), fitted.predict(X[:5]), rtol=1e-6)


# ---------------------------------------------------------------------------------- tests-aware
@pytest.mark.parametrize("make", [SVRBFRegressor, sv_dkl, pp_dkl, vbll])
def test_dbk_path_baselines_accept_tests_noise(make, tmp_path: Path) -> None:
    x, y, tests = rows_with_tests()
    model = make(rank=8, hidden=8, epochs=2, batch_size=64, device="cpu", noise="tests")
    model.fit(x, y, x[:40], y[:40], tests=tests, tests_val=tests[:40])
    assert model.noise_parameters()["noise"] == "tests"
    one = model.predict_dist(x[:5])
    many = model.predict_dist(x[:5], tests=20)
    latent = model.predict_dist(x[:5], quantity="latent")
    assert np.all(latent.var < many.var) and np.all(many.var < one.var)
    model.save(tmp_path / "m")
    back = type(model).load(tmp_path / "m", device="cpu")
    np.testing.assert_allclose(
        back.predict_dist(x[:5], tests=3).var, model.predict_dist(x[:5], tests=3).var
    )


def test_sv_rbf_honours_noise_urban() -> None:
    """SV-RBF builds its model with every noise option, the urban floor included (it was
    dropped before issue 21: the option was accepted and had no effect)."""
    x, y, tests = rows_with_tests(80)
    urban = np.arange(80) % 2 == 0
    model = SVRBFRegressor(rank=4, epochs=1, batch_size=40, device="cpu", noise="tests")
    model.set_params(noise_urban=True).fit(x, y, tests=tests, urban=urban)
    assert model.model_.noise.urban
    assert "s2_floor_urban" in model.noise_parameters()
    with pytest.raises(DataError, match="urban"):
        model.predict_dist(x[:3])  # the observation quantity needs the class
