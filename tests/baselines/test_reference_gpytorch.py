"""Objective values on fixed parameters agree with GPyTorch (the reference implementation).

* SV-RBF (identity backbone + whitened RBF inducing basis + ELBO with the base-kernel variance
  correction) vs ``gpytorch.models.ApproximateGP`` with a whitened ``VariationalStrategy`` and
  ``gpytorch.mlls.VariationalELBO`` — same inducing points, variational parameters and
  hyperparameters.
* PP-DKL (PPGP with the correction, β = 1, on the residual-MLP features g(x)) vs
  ``gpytorch.mlls.PredictiveLogLikelihood`` on the same g(x).
* SV-DKL's ELBO on g(x) vs ``VariationalELBO``.

float64; the jitter is set to 1e-10 on both sides (GPyTorch adds it to Kzz and to k(x, x)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodbk.baselines.svgp import SVRBFRegressor
from geodbk.model import DBKModel
from geodbk.training import TrainConfig, batch_loss

gpytorch = pytest.importorskip("gpytorch")

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
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _reference(model: DBKModel) -> tuple[_GP, object]:
    """A GPyTorch SVGP holding exactly the parameters of ``model``."""
    basis = model.basis
    gp = _GP(basis.inducing.detach().clone()).double()
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


def test_sv_rbf_elbo_matches_gpytorch_variational_elbo() -> None:
    est = SVRBFRegressor(rank=7, jitter=JITTER, dtype="float64")
    model = est._build_model(2, torch.device("cpu"))
    _randomise(model, torch.Generator().manual_seed(0))
    X, y = _data(40, 2, seed=1)
    n_total = 500  # a mini-batch of a larger data set: KL is scaled by 1/n_total
    ours = batch_loss(
        model, X, y, n=n_total, config=TrainConfig(objective="elbo", variance_correction=True)
    )
    gp, lik = _reference(model)
    mll = gpytorch.mlls.VariationalELBO(lik, gp, num_data=n_total)
    ref = -mll(gp(X), y)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-8)


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
    config = TrainConfig(objective=objective, beta=1.0, variance_correction=True)
    ours = batch_loss(model, X, y, n=n_total, config=config)
    gp, lik = _reference(model)
    mll = getattr(gpytorch.mlls, mll_cls)(lik, gp, num_data=n_total, beta=1.0)
    ref = -mll(gp(model.backbone(X)), y)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-8)
