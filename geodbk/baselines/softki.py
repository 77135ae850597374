"""SoftKI: soft kernel interpolation with a learnable temperature (methods.md §5).

m learned interpolation points Z; weights w(x) = softmax_j(-||x - z_j|| / T) with a learnable
temperature T (the seed's unscaled distances make the weights nearly uniform on [-1,1]²);
Q(x, x') = w(x)' Kzz w(x') with Kzz an RBF-ARD kernel on Z. This is a rank-m deep-basis-like
kernel with phi(x) = Lz' w(x), Lz = chol(Kzz), so Q = phi(x)'phi(x').

Training: each batch's own exact marginal likelihood of N(c, Phi_B Phi_B' + s2 I), computed in
O(b m²) with the Woodbury identity and the determinant lemma (Lambda_B = Phi_B'Phi_B + s2 I):
log p(y_B) = -b/2 log 2π - (b - m)/2 log s2 - 1/2 logdet Lambda_B - ||r||²/(2 s2)
+ ||chol(Lambda_B)^{-1} Phi_B' r||² / (2 s2); loss = -log p(y_B) / b. (Exact, where the seed uses
a stochastic trace estimator; the noise is learned here, where the seed fixes s2 = 1e-3.)

Posterior over all training data (weight space, Cholesky in float64 instead of the seed's QR):
Lambda = Phi'Phi + s2 I, mean(x) = phi(x)' Lambda^{-1} Phi' r, var_f(x) = s2 ||chol(Lambda)^{-1} phi(x)||².

Tests-aware noise (``noise="tests"``): N(c, Phi Phi' + D), D = diag(s2_i),
s2_i = s2_floor + s2_meas / tests_i^p. The batch term uses Phi~ = D^{-1/2} Phi, r~ = D^{-1/2} r and
Lambda~ = I + Phi~'Phi~:
log p(y_B) = -b/2 log 2π - 1/2 Σ log s2_i - 1/2 logdet Lambda~ - ||r~||²/2
+ ||chol(Lambda~)^{-1} Phi~' r~||² / 2. The posterior uses the weights omega_i = s1 / s2_i with s1 the
single-test variance s2(tests = 1) (so omega_i <= 1): Lambda = Phi' Omega Phi + s1 I,
mean(x) = phi(x)' Lambda^{-1} Phi' Omega r, var_f(x) = s1 ||chol(Lambda)^{-1} phi(x)||² — the
constant-noise formulas with s1 = s2 and Omega = I.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from geodbk.baselines.base import TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, psd_cholesky, rbf_ard, tri_solve


class SoftKIModule(nn.Module):
    """Interpolation points, log-temperature, RBF-ARD hyperparameters, noise, constant mean."""

    alpha: Tensor
    chol_Lambda: Tensor

    def __init__(
        self,
        d: int,
        m: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
    ):
        super().__init__()
        self.Z = nn.Parameter(torch.zeros(m, d))
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.lengthscale = Positive(lengthscale, shape=(d,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        self.mean_const = nn.Parameter(torch.zeros(()))
        self.register_buffer("alpha", torch.zeros(m))  # Lambda^{-1} Phi' r
        self.register_buffer("chol_Lambda", torch.eye(m))

    def weights(self, X: Tensor) -> Tensor:
        """Soft interpolation weights softmax_j(-||x - z_j|| / T), (n, m)."""
        d2 = (
            X.pow(2).sum(-1, keepdim=True) + self.Z.pow(2).sum(-1) - 2.0 * X @ self.Z.T
        ).clamp_min(1e-12)
        return torch.softmax(-d2.sqrt() / self.log_temperature.exp(), dim=-1)

    def kzz_chol(self) -> Tensor:
        """Lz = chol(Kzz + jitter)."""
        Kzz = rbf_ard(
            self.Z, self.Z, lengthscale=self.lengthscale(), outputscale=self.outputscale()
        )
        return psd_cholesky(Kzz, jitter=1e-6)

    def features(self, X: Tensor, Lz: Tensor | None = None) -> Tensor:
        """phi(x) = Lz' w(x), stacked as rows (n, m)."""
        Lz = self.kzz_chol() if Lz is None else Lz
        return self.weights(X) @ Lz


def batch_marginal_nll(phi: Tensor, r: Tensor, s2: Tensor) -> Tensor:
    """-log N(r; 0, phi phi' + D) / b via Woodbury and the determinant lemma.

    ``s2`` 0-d: D = s2 I. ``s2`` of shape (b,): D = diag(s2_i), computed with phi~ = D^{-1/2} phi,
    r~ = D^{-1/2} r, Lambda~ = I + phi~'phi~:
    log p = -b/2 log 2π - 1/2 Σ log s2_i - 1/2 logdet Lambda~ - ||r~||²/2
    + ||chol(Lambda~)^{-1} phi~'r~||²/2.
    """
    b, m = phi.shape
    if s2.ndim > 0:
        root = s2.sqrt()
        phi_w, r_w = phi / root.unsqueeze(-1), r / root
        Lw = psd_cholesky(
            phi_w.T @ phi_w + torch.eye(m, dtype=phi.dtype, device=phi.device), jitter=1e-10
        )
        proj_w = tri_solve(Lw, (phi_w.T @ r_w).unsqueeze(-1)).squeeze(-1)
        logp_w = (
            -0.5 * b * math.log(2.0 * math.pi)
            - 0.5 * torch.log(s2).sum()
            - torch.log(torch.diagonal(Lw)).sum()
            - 0.5 * r_w.pow(2).sum()
            + 0.5 * proj_w.pow(2).sum()
        )
        return -logp_w / b
    Lam = phi.T @ phi + s2 * torch.eye(m, dtype=phi.dtype, device=phi.device)
    L = psd_cholesky(Lam, jitter=1e-10)
    proj = tri_solve(L, (phi.T @ r).unsqueeze(-1)).squeeze(-1)
    logp = (
        -0.5 * b * math.log(2.0 * math.pi)
        - 0.5 * (b - m) * torch.log(s2)
        - torch.log(torch.diagonal(L)).sum()
        - r.pow(2).sum() / (2.0 * s2)
        + proj.pow(2).sum() / (2.0 * s2)
    )
    return -logp / b


class SoftKIRegressor(TorchBaseline):
    """SoftKI estimator (mini-batch exact batch MLL, Adam, learnable temperature).

    Parameters
    ----------
    num_points
        m interpolation points (seed default 512; capped at n), initialised at a random subset
        of the training inputs.
    lengthscale, noise_init
        Initial RBF lengthscale and noise variance (of a single test for ``noise="tests"``;
        standardised units). The temperature starts at half the median nearest-neighbour
        distance between the initial points.
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``; ``noise``: ``"constant"`` or ``"tests"`` (D = diag(s2_i) in
        the marginal likelihood and the posterior).
    """

    model_name = "softki"

    def __init__(
        self,
        *,
        num_points: int = 512,
        lengthscale: float = 0.3,
        noise_init: float = 0.5,
        epochs: int = 100,
        batch_size: int = 1024,
        lr: float = 0.01,
        patience: int | None = 50,
        seed: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
        noise: str = "constant",
        noise_power: bool = False,
    ) -> None:
        super().__init__(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            patience=patience,
            seed=seed,
            device=device,
            dtype=dtype,
            noise=noise,
            noise_power=noise_power,
        )
        self.num_points = num_points
        self.lengthscale = lengthscale
        self.noise_init = noise_init

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        return {"d": X.shape[1], "m": min(int(self.num_points), X.shape[0])}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return SoftKIModule(
            sizes["d"],
            sizes["m"],
            lengthscale=self.lengthscale,
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
        )

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, SoftKIModule)
        rng = np.random.default_rng(self.seed)
        idx = torch.as_tensor(rng.permutation(X.shape[0])[: module.Z.shape[0]], device=X.device)
        Z = X[idx] + 1e-4 * torch.randn_like(X[idx])
        module.Z.copy_(Z)
        if Z.shape[0] > 1:
            D = torch.cdist(Z, Z) + torch.diag(
                torch.full((Z.shape[0],), math.inf, dtype=Z.dtype, device=Z.device)
            )
            nn_dist = float(D.min(dim=1).values.median())
        else:
            nn_dist = 1.0
        module.log_temperature.fill_(math.log(max(0.5 * nn_dist, 1e-4)))
        module.mean_const.fill_(float(y.mean()))

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SoftKIModule)
        return batch_marginal_nll(module.features(X), y - module.mean_const, module.noise(tests))

    def _refresh(
        self,
        module: nn.Module,
        X: Tensor,
        y: Tensor,
        tests: Tensor | None = None,
        chunk_size: int = 8192,
    ) -> None:
        assert isinstance(module, SoftKIModule)
        Lz = module.kzz_chol()
        m = Lz.shape[0]
        PtP = torch.zeros(m, m, dtype=torch.float64, device=X.device)
        Ptr = torch.zeros(m, dtype=torch.float64, device=X.device)
        s2 = module.noise().double()  # s1: s2, or a single test's variance (tests-aware)
        for start in range(0, X.shape[0], chunk_size):
            phi = module.features(X[start : start + chunk_size], Lz).double()
            r = (y[start : start + chunk_size] - module.mean_const).double()
            if tests is not None:  # omega_i = s1 / s2_i
                omega = s2 / module.noise(tests[start : start + chunk_size]).double()
                PtP += phi.T @ (omega.unsqueeze(-1) * phi)
                Ptr += phi.T @ (omega * r)
            else:
                PtP += phi.T @ phi
                Ptr += phi.T @ r
        L = psd_cholesky(
            PtP + s2 * torch.eye(m, dtype=torch.float64, device=X.device), jitter=1e-12
        )
        alpha = torch.cholesky_solve(Ptr.unsqueeze(-1), L).squeeze(-1)
        module.alpha.copy_(alpha.to(module.alpha.dtype))
        module.chol_Lambda.copy_(L.to(module.chol_Lambda.dtype))

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SoftKIModule)
        phi = module.features(X)
        mean = phi @ module.alpha + module.mean_const
        # s1 ||chol(Lambda)^{-1} phi||², s1 = s2 (constant) or s2(tests = 1) (tests-aware)
        var_f = module.noise() * tri_solve(module.chol_Lambda, phi.T).pow(2).sum(0)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, SoftKIModule)
        Lz = module.kzz_chol()
        return module.features(A, Lz) @ module.features(B, Lz).T

    def features(self, X: Any) -> np.ndarray:
        """phi(X) = W(X) Lz, (n, m), so that kernel(X, X') = phi(X) phi(X')'."""
        module = self._check_fitted()
        assert isinstance(module, SoftKIModule)
        with torch.no_grad():
            phi = module.features(self._tensor(np.asarray(X, dtype=np.float64).reshape(len(X), -1)))
        return phi.double().cpu().numpy() * self.y_sd_
