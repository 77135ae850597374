"""SOLVE-GP: sparse orthogonal variational inference, whitened form (methods.md §4).

f = f_par + f_perp with inducing points Z (M) for f_par and orthogonal inducing points O (M2)
for f_perp. Kernel k: Matérn-3/2 ARD. With Luu = chol(Kuu), a(x) = Luu^{-1} k(Z, x),
c(x, x') = k(x, x') - a(x)'a(x'), Cvv = c(O, O), Lvv = chol(Cvv), b(x) = Lvv^{-1} c(O, x) and the
whitened variational factors q(u~) = N(m_u, S_u), q(v~) = N(m_v, S_v) (u = Luu u~, v = Lvv v~):

* mean(x) = a(x)'m_u + b(x)'m_v   [= k(x,Z) Kuu^{-1} m_u + c(x,O) Cvv^{-1} m_v unwhitened]
* var_f(x) = a(x)'S_u a(x) + c(x, x) + b(x)'(S_v - I) b(x)
  [= k(x,Z)Kuu^{-1}S_uKuu^{-1}k(Z,x) + c(x,x) + c(x,O)Cvv^{-1}(S_v - Cvv)Cvv^{-1}c(O,x)]
* ELBO = Σ_i [log N(y_i; mean_i, s2_i) - var_f,i / (2 s2_i)] - KL(q(u~)||N(0,I))
  - KL(q(v~)||N(0,I)) with s2_i = s2 (constant noise) or s2_i = s2_floor + s2_meas / tests_i^p
  (``noise="tests"``); mini-batch estimate (n/b) Σ_B; the loss is -ELBO / n.
* predictive var = var_f(x) + s2(x) (s2(tests) at the query for the tests-aware noise).

Each step costs O(M³ + M2³ + b (M + M2)² ) for the two Cholesky factors and solves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from geodbk.baselines.base import TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, matern32_ard, psd_cholesky, tri_solve
from geodbk.objectives import gaussian_kl_standard, gaussian_nll
from geodbk.variational import VariationalWeights


class SolveGPModule(nn.Module):
    """Parameters of SOLVE-GP: Z, O, whitened q(u~), q(v~), kernel, noise, constant mean."""

    def __init__(
        self,
        d: int,
        m_u: int,
        m_v: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
    ):
        super().__init__()
        self.Z = nn.Parameter(torch.zeros(m_u, d))
        self.O = nn.Parameter(torch.zeros(m_v, d))
        # Whitened q(u~) and q(v~): the core's N(m, LL') parameterisation (set to N(0, I) at init).
        self.q_u = VariationalWeights(m_u)
        self.q_v = VariationalWeights(m_v)
        self.lengthscale = Positive(lengthscale, shape=(d,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        self.mean_const = nn.Parameter(torch.zeros(()))

    def k(self, A: Tensor, B: Tensor) -> Tensor:
        """Matérn-3/2 ARD kernel."""
        return matern32_ard(A, B, lengthscale=self.lengthscale(), outputscale=self.outputscale())

    def _k64(self, A: Tensor, B: Tensor) -> Tensor:
        """The kernel evaluated in float64 (the factors below are ill-conditioned in float32)."""
        return matern32_ard(
            A.double(),
            B.double(),
            lengthscale=self.lengthscale().double(),
            outputscale=self.outputscale().double(),
        )

    def factors(self) -> tuple[Tensor, Tensor, Tensor]:
        """(Luu, a(O) = Luu^{-1} k(Z, O), Lvv) — the x-independent parts, in float64.

        Cvv = k(O,O) - a(O)'a(O) is a difference of nearly equal terms wherever Z already
        explains f (e.g. many points on a 1-D input); in float32 it turns indefinite and the
        gradients NaN, so the factors are formed in float64 and the results cast back.
        """
        Luu = psd_cholesky(self._k64(self.Z, self.Z), jitter=1e-6)
        aO = tri_solve(Luu, self._k64(self.Z, self.O))
        Cvv = self._k64(self.O, self.O) - aO.T @ aO
        # c(O, O) can be ~0 where Z already explains f: jitter relative to the kernel variance.
        Lvv = psd_cholesky(Cvv, jitter=1e-6, scale=self.outputscale())
        return Luu, aO, Lvv

    def latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Whitened predictive mean and latent variance at X (see the module docstring)."""
        Luu, aO, Lvv = self.factors()
        a = tri_solve(Luu, self._k64(self.Z, X))  # (M, b)
        cOx = self._k64(self.O, X) - aO.T @ a  # c(O, x), (M2, b)
        bx = tri_solve(Lvv, cOx)  # (M2, b)
        mean = a.T @ self.q_u.mean.double() + bx.T @ self.q_v.mean.double()
        Lu, Lv = self.q_u.scale_tril().double(), self.q_v.scale_tril().double()
        var_f = (
            (Lu.T @ a).pow(2).sum(0)
            + self.outputscale().double()
            - a.pow(2).sum(0)
            + (Lv.T @ bx).pow(2).sum(0)
            - bx.pow(2).sum(0)
        )
        return mean.to(X.dtype) + self.mean_const, var_f.to(X.dtype)

    def kl(self) -> Tensor:
        """KL(q(u~)||N(0,I)) + KL(q(v~)||N(0,I)) (whitened, so the priors are standard)."""
        kl_u = gaussian_kl_standard(self.q_u.mean, self.q_u.scale_tril())
        return kl_u + gaussian_kl_standard(self.q_v.mean, self.q_v.scale_tril())


def solvegp_loss(
    module: SolveGPModule, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
) -> Tensor:
    """-ELBO / n: mean_B[-log N(y_i; mean_i, s2_i) + var_f,i / (2 s2_i)] + KL / n.

    ``s2_i = s2(tests_i)`` for the tests-aware noise, the constant ``s2`` otherwise.
    """
    mean, var_f = module.latent(X)
    s2 = module.noise(tests)
    return (gaussian_nll(y, mean, s2) + var_f / (2.0 * s2)).mean() + module.kl() / n_total


class SolveGPRegressor(TorchBaseline):
    """SOLVE-GP estimator (mini-batch, Adam, whitened, Matérn-3/2 ARD).

    Parameters
    ----------
    num_inducing, num_orthogonal
        M and M2 (seed default 1024 each; capped at n). Z and O start at two disjoint random
        subsets of the training inputs (seeded).
    lengthscale, noise_init
        Initial Matérn lengthscale and noise variance (of a single test for ``noise="tests"``;
        standardised units).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``; ``noise``: ``"constant"`` or ``"tests"`` (s2_i in the ELBO's
        data term).
    """

    model_name = "solve-gp"

    def __init__(
        self,
        *,
        num_inducing: int = 1024,
        num_orthogonal: int = 1024,
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
        self.num_inducing = num_inducing
        self.num_orthogonal = num_orthogonal
        self.lengthscale = lengthscale
        self.noise_init = noise_init

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n, d = X.shape
        m_u = min(int(self.num_inducing), n)
        m_v = min(int(self.num_orthogonal), max(n - m_u, 1))
        return {"d": d, "m_u": m_u, "m_v": m_v}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return SolveGPModule(
            sizes["d"],
            sizes["m_u"],
            sizes["m_v"],
            lengthscale=self.lengthscale,
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
        )

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, SolveGPModule)
        rng = np.random.default_rng(self.seed)
        perm = torch.as_tensor(rng.permutation(X.shape[0]), device=X.device)
        m_u, m_v = module.Z.shape[0], module.O.shape[0]
        module.Z.copy_(X[perm[:m_u]])
        rest = perm[m_u : m_u + m_v]
        if rest.numel() < m_v:  # tiny data: jitter copies
            rest = perm[torch.arange(m_v, device=X.device) % perm.numel()]
            module.O.copy_(X[rest] + 1e-3 * torch.randn_like(X[rest]))
        else:
            module.O.copy_(X[rest])
        for q in (module.q_u, module.q_v):
            r = q.mean.shape[0]
            q.set_(
                torch.zeros(r, dtype=X.dtype, device=X.device),
                torch.eye(r, dtype=X.dtype, device=X.device),
            )
        module.mean_const.fill_(float(y.mean()))

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SolveGPModule)
        return solvegp_loss(module, X, y, n_total, tests)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SolveGPModule)
        mean, var_f = module.latent(X)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, SolveGPModule)
        return module.k(A, B)
