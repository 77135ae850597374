"""Exact GP with an RBF-ARD kernel, constant mean and Gaussian noise (small n only).

With K_hat = K + D = L L', D = s2 I (constant noise) or D = diag(s2_i),
s2_i = s2_floor + s2_meas / tests_i^p (``noise="tests"``, heteroscedastic), and r = y - c:

* log p(y) = -1/2 r'K_hat^{-1} r - Σ log diag L - n/2 log 2π; loss = -log p(y) / n
* mean(x) = c + k(x, X) K_hat^{-1} r; var_f(x) = k(x, x) - ||L^{-1} k(X, x)||²;
  var = var_f + s2(x) (s2(tests) at the query for the tests-aware noise)

Initial lengthscale (``lengthscale_init``): ``lengthscale`` for every input, or l_j = √d for
all d inputs (the seed's "RBF" baseline, 000 App. B, with its RBF-ARD kernel eq. 16).

O(n³) time and O(n²) memory per step (full batch, Adam), so the estimator refuses data sets
above ``max_n`` rows with :class:`~geodbk.baselines.base.ProblemTooLargeError` before any work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from geodbk.baselines.base import ProblemTooLargeError, TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, psd_cholesky, rbf_ard, tri_solve

#: Lengthscale initialisations: the ``lengthscale`` option, or √d (000 App. B).
LENGTHSCALE_INITS = ("value", "sqrt_d")


class ExactRBFModule(nn.Module):
    """RBF-ARD hyperparameters, noise, constant mean and the cached training solve."""

    X: Tensor
    alpha: Tensor
    chol: Tensor

    def __init__(
        self,
        n: int,
        d: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
    ):
        super().__init__()
        self.register_buffer("X", torch.zeros(n, d))
        self.lengthscale = Positive(lengthscale, shape=(d,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        self.mean_const = nn.Parameter(torch.zeros(()))
        self.register_buffer("alpha", torch.zeros(n))
        self.register_buffer("chol", torch.eye(n))

    def k(self, A: Tensor, B: Tensor) -> Tensor:
        """RBF-ARD kernel."""
        return rbf_ard(A, B, lengthscale=self.lengthscale(), outputscale=self.outputscale())


@dataclass(kw_only=True, eq=False, repr=False)
class ExactRBFRegressor(TorchBaseline):
    """Exact RBF-ARD GP trained by maximising the marginal likelihood (full batch).

    Parameters
    ----------
    max_n
        Largest training set accepted (default 5000: one step is an n×n Cholesky).
    lengthscale, noise_init
        Initial lengthscale and noise variance (of a single test for ``noise="tests"``;
        standardised units).
    lengthscale_init
        ``"value"``: every lengthscale starts at ``lengthscale``; ``"sqrt_d"``: at √d for d
        inputs, ignoring ``lengthscale`` (the seed's "RBF" baseline, 000 App. B).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``: ``epochs`` are optimiser steps (``batch_size`` unused: full
        batch), ``lr`` defaults to 0.05, ``dtype`` to float64; ``noise``: ``"constant"`` or
        ``"tests"`` (D = diag(s2_i)).
    """

    model_name = "exact-rbf"
    full_batch = True

    max_n: int = 5000
    lengthscale: float = 0.3
    noise_init: float = 0.5
    lengthscale_init: str = "value"
    lr: float = 0.05
    dtype: str = "float64"

    def _validate(self) -> None:
        super()._validate()
        if self.lengthscale_init not in LENGTHSCALE_INITS:
            raise ValueError(
                f"lengthscale_init must be one of {LENGTHSCALE_INITS}, got {self.lengthscale_init!r}"
            )

    def initial_lengthscale(self, d: int) -> float:
        """The lengthscale every input starts at: ``lengthscale``, or √d (``"sqrt_d"``)."""
        return math.sqrt(d) if self.lengthscale_init == "sqrt_d" else float(self.lengthscale)

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n = X.shape[0]
        if n > self.max_n:
            raise ProblemTooLargeError(
                f"exact-rbf: {n} training points exceed max_n={self.max_n} (O(n³) time, O(n²) "
                f"memory: {n * n * 8 / 2**30:.1f} GiB per kernel matrix); use a scalable model or "
                "raise max_n"
            )
        return {"n": n, "d": X.shape[1]}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return ExactRBFModule(
            sizes["n"],
            sizes["d"],
            lengthscale=self.initial_lengthscale(int(sizes["d"])),
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
        )

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, ExactRBFModule)
        module.X.copy_(X)
        module.mean_const.fill_(float(y.mean()))

    def _solve(
        self, module: ExactRBFModule, y: Tensor, tests: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """L = chol(K + D), r = y - c, alpha = (K + D)^{-1} r with D = diag(s2(tests))."""
        n = module.X.shape[0]
        s2 = module.noise(tests)
        Khat = module.k(module.X, module.X) + torch.diag_embed(s2.expand(n))
        L = psd_cholesky(Khat, jitter=1e-10)
        r = y - module.mean_const
        alpha = torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
        return L, r, alpha

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, ExactRBFModule)
        L, r, alpha = self._solve(module, y, tests)
        module.chol.copy_(L.detach())
        module.alpha.copy_(alpha.detach())
        n = y.shape[0]
        nll = (
            0.5 * (r @ alpha)
            + torch.log(torch.diagonal(L)).sum()
            + 0.5 * n * math.log(2.0 * math.pi)
        )
        return nll / n

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        assert isinstance(module, ExactRBFModule)
        L, _, alpha = self._solve(module, y, tests)
        module.chol.copy_(L)
        module.alpha.copy_(alpha)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, ExactRBFModule)
        Kxs = module.k(module.X, X)
        mean = Kxs.T @ module.alpha + module.mean_const
        var_f = module.outputscale() - tri_solve(module.chol, Kxs).pow(2).sum(0)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, ExactRBFModule)
        return module.k(A, B)
