"""SVDBK and exact DBK with the variance correction (paper 001, methods.md §2).

Kernel k(x, x') = phi(x)'phi(x'), f(x) = c + w'phi(x), w ~ N(0, I_r). Bases (``basis=``):
``"paper"`` (001 §5: a 2-layer tanh MLP of width h whose r outputs are the basis functions,
:class:`PaperBasisNet`) or ``"rbf"`` (DBK-RBF, methods.md §1: the whitened RBF-ARD
inducing-point basis on the core's residual MLP). ``weight_decay`` acts on the network only,
with ``optimizer="adam"`` (001 §5: coupled L2, gradient + weight_decay·theta) or ``"adamw"``.

Correction: c(x) = max(0, max_train ||phi||² - ||phi(x)||²) and s2_hat(x) = s2(x) + c(x), with
s2(x) = s2 or, for ``noise="tests"``, s2_floor + s2_meas / tests^p.

* **SVDBK** (``svdbk``, mini-batch, q(w) = N(m, LL')): loss :func:`svdbk_loss`; prediction
  mu = c + m'phi*, var_f = ||L'phi*||², var = var_f + s2_hat(x*).
* **Exact SVDBK** (``svdbk-exact``, full batch): loss :func:`svdbk_exact_loss` (001 eq. 5 with
  the trace bound of eq. 11); prediction 001 eq. 12 with S_hat = diag(s2_hat(x_i)):
  A = I + Phi'S_hat^{-1}Phi = L_A L_A', mu = c + phi*'A^{-1}Phi'S_hat^{-1}(y - c),
  var_f = ||L_A^{-1} phi*||², var = var_f + s2_hat(x*) (:class:`SVDBKExactRegressor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from geodbk.backbone import ResidualMLP
from geodbk.baselines.base import ProblemTooLargeError, TorchBaseline, make_noise
from geodbk.bases import RBFInducingBasis, stable_cholesky
from geodbk.likelihoods import GaussianNoise, TestsNoise
from geodbk.model import DBKModel
from geodbk.objectives import elbo_loss, exact_marginal_log_likelihood, gaussian_kl_standard
from geodbk.posterior import accumulate_statistics

#: Basis functions: paper 001's tanh MLP, or DBK-RBF on the residual MLP.
BASES = ("paper", "rbf")
#: Optimisers: Adam with coupled L2 (001 §5) or AdamW (decoupled), decay on the network only.
OPTIMIZERS = ("adam", "adamw")
#: Absolute jitter on A = I + Phi'S_hat^{-1}Phi (eigenvalues >= 1): guards round-off only.
A_JITTER = 1e-10
#: Training rows at a time when max ||phi||² and the exact posterior are computed.
REFRESH_CHUNK = 65536


class PaperBasisNet(nn.Module):
    """Paper 001's basis network: phi(x) = W3 tanh(W2 tanh(W1 x + b1) + b2) + b3, (b, r)."""

    def __init__(self, d: int, hidden: int, rank: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(d, hidden)
        self.layer2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, rank)

    def forward(self, x: Tensor) -> Tensor:
        """The r basis functions at ``x`` (b, d)."""
        return self.out(torch.tanh(self.layer2(torch.tanh(self.layer1(x)))))


class DirectBasis(nn.Module):
    """The identity expansion: the network's outputs are the basis functions, phi = g."""

    def forward(self, g: Tensor) -> Tensor:
        """``phi = g``."""
        return g

    def raw_features(self, g: Tensor) -> Tensor:
        """``g`` itself (nothing to fold)."""
        return g

    def pullback(self, matrix: Tensor) -> Tensor:
        """Identity."""
        return matrix

    def prior_variance(self, g: Tensor) -> Tensor | None:
        """``None``: no base kernel."""
        return None


def check_basis(basis: str) -> str:
    """Return ``basis`` if it is one of :data:`BASES`, else raise ``ValueError``."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
    return basis


def check_optimizer(optimizer: str) -> str:
    """Return ``optimizer`` if it is one of :data:`OPTIMIZERS`, else raise ``ValueError``."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    return optimizer


@dataclass(frozen=True, kw_only=True)
class SVDBKOptions:
    """What both SVDBK modules are built from (the estimators' options of the same names)."""

    rank: int
    hidden: int
    jitter: float
    noise_init: float
    seed: int
    noise: str = "constant"
    noise_power: bool = False
    basis: str = "rbf"

    def basis_network(self, d: int, generator: torch.Generator) -> tuple[nn.Module, nn.Module]:
        """``(network, expansion)`` with phi = expansion ∘ network; the network gets weight decay.

        ``"paper"``: (:class:`PaperBasisNet`, :class:`DirectBasis`); ``"rbf"``: (the core's
        ``ResidualMLP``, ``RBFInducingBasis``).
        """
        if check_basis(self.basis) == "paper":
            return PaperBasisNet(d, self.hidden, self.rank), DirectBasis()
        return ResidualMLP(d, self.hidden), RBFInducingBasis(
            self.hidden, self.rank, jitter=self.jitter, generator=generator
        )


class SVDBKModule(nn.Module):
    """A core :class:`DBKModel` (its backbone and basis per ``basis``) plus max_train ||phi||²."""

    max_phi_sq: Tensor

    def __init__(self, d: int, options: SVDBKOptions):
        super().__init__()
        o, gen = options, torch.Generator().manual_seed(options.seed)
        self.dbk = DBKModel(
            d,
            expansion="rbf" if check_basis(o.basis) == "rbf" else "silu",
            rank=o.rank,
            hidden=o.hidden,
            jitter=o.jitter,
            noise_init=o.noise_init,
            noise=o.noise,
            noise_power=o.noise_power,
            generator=gen,
        )
        if o.basis == "paper":
            network, expansion = o.basis_network(d, gen)
            self.dbk.backbone = network  # type: ignore[assignment]
            self.dbk.basis = expansion  # type: ignore[assignment]
        self.register_buffer("max_phi_sq", torch.zeros(()))

    def features(self, x: Tensor) -> Tensor:
        """phi(x), (b, r)."""
        return self.dbk.features(x)

    def network_parameters(self) -> list[nn.Parameter]:
        """The network's parameters (weight decay)."""
        return self.dbk.backbone_parameters()

    def other_parameters(self) -> list[nn.Parameter]:
        """RBF basis, q(w), noise and constant mean (no weight decay)."""
        return self.dbk.other_parameters()


def svdbk_loss(
    module: SVDBKModule, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
) -> Tensor:
    """Per-datum SVDBK loss (methods.md §2 divided by n).

    mean_B[-log N(y_i; mu_i, s2_i) + ||L'phi_i||² / (2 s2_i)] + KL / n
    + mean_B[(max_B ||phi||² - ||phi_i||²) / (2 s2_i)], s2_i = s2 or s2(tests_i).
    """
    out = module.dbk(X)
    s2 = module.dbk.noise_var(tests)
    q = module.dbk.q
    kl = gaussian_kl_standard(q.mean, q.scale_tril())
    trace = ((out.phi_sq.max() - out.phi_sq) / (2.0 * s2)).mean()
    return elbo_loss(out.mean, out.var_f, y, s2, kl=kl, n=n_total) + trace


class SVDBKExactModule(nn.Module):
    """Basis network, noise, constant mean and the cached eq. 12 posterior.

    Buffers: ``max_phi_sq`` (max_train ||phi||²), ``w_mean`` = A^{-1}Phi'S_hat^{-1}(y - c) (r,)
    and ``chol_a`` = L_A (r, r), A = I + Phi'S_hat^{-1}Phi.
    """

    max_phi_sq: Tensor
    w_mean: Tensor
    chol_a: Tensor

    def __init__(self, d: int, options: SVDBKOptions):
        super().__init__()
        o, gen = options, torch.Generator().manual_seed(options.seed)
        self.network, self.expansion = o.basis_network(d, gen)
        self.noise = make_noise(o.noise, init=o.noise_init, noise_power=o.noise_power)
        self.const_mean = nn.Parameter(torch.zeros(()))
        self.register_buffer("max_phi_sq", torch.zeros(()))
        self.register_buffer("w_mean", torch.zeros(o.rank))
        self.register_buffer("chol_a", torch.eye(o.rank))

    def features(self, x: Tensor) -> Tensor:
        """phi(x), (b, r)."""
        return self.expansion(self.network(x))

    def noise_var(self, tests: Tensor | None = None) -> Tensor:
        """s2 (0-d) or s2(tests_i)."""
        return self.noise.variance(tests)

    def network_parameters(self) -> list[nn.Parameter]:
        """The network's parameters (weight decay)."""
        return list(self.network.parameters())

    def other_parameters(self) -> list[nn.Parameter]:
        """RBF basis, noise and constant mean (no weight decay)."""
        ids = {id(p) for p in self.network.parameters()}
        return [p for p in self.parameters() if id(p) not in ids]

    @torch.no_grad()
    def set_posterior(
        self, batches: Iterator[tuple[Tensor, Tensor, Tensor]], max_phi_sq: Tensor
    ) -> None:
        """Cache eq. 12's posterior from chunks ``(phi, y, s2)`` of the training data.

        S_hat_i = s2_i + max_phi_sq - ||phi_i||²; A = I + Phi'S_hat^{-1}Phi = L_A L_A' (float64,
        jitter :data:`A_JITTER`); w_mean = A^{-1}Phi'S_hat^{-1}(y - c) (two triangular solves).
        """
        top = max_phi_sq.double()
        c = self.const_mean.detach().double()
        reweighted = (
            (phi.double(), y.double(), s2.double() + top - phi.double().pow(2).sum(-1))
            for phi, y, s2 in batches
        )
        gram, proj = accumulate_statistics(reweighted, mean=c)
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        chol = stable_cholesky(gram + eye, jitter=A_JITTER)
        self.w_mean.copy_(torch.cholesky_solve(proj[:, None], chol).squeeze(-1))
        self.chol_a.copy_(chol)
        self.max_phi_sq.copy_(max_phi_sq)


def svdbk_exact_loss(phi: Tensor, y: Tensor, s2: Tensor, const: Tensor) -> Tensor:
    """Per-datum negative of 001's corrected exact objective (eq. 5 minus eq. 11's trace term).

    -[log N(y; c, Phi Phi' + S) - Σ_i (max_j ||phi_j||² - ||phi_i||²) / (2 s2_i)] / n, S =
    diag(s2_i); log N by the core's Woodbury form in float64.
    """
    n = phi.shape[0]
    s2_n = s2.expand(n)
    phi_sq = phi.pow(2).sum(-1)
    trace = ((phi_sq.max() - phi_sq) / (2.0 * s2_n)).sum()
    log_p = exact_marginal_log_likelihood(
        phi.double(), y.double(), s2_n.double(), mean=const.double()
    )
    return (trace - log_p.to(phi.dtype)) / n


@dataclass(kw_only=True, eq=False, repr=False)
class SVDBKRegressor(TorchBaseline):
    """SVDBK with the test-time variance correction (paper 001; module docstring).

    Parameters
    ----------
    basis
        ``"rbf"`` (DBK-RBF on the residual MLP) or ``"paper"`` (001's 2-layer tanh MLP of width
        ``hidden`` that outputs the r basis functions).
    optimizer
        ``"adamw"`` (decoupled decay) or ``"adam"`` (001: coupled L2 penalty).
    weight_decay
        Decay on the network's parameters only (not q(w), the noise, the mean or the RBF
        basis' inducing points and lengthscales).
    rank, hidden, jitter, noise_init
        r, network width, relative Cholesky jitter of the RBF basis, initial s2 (noise floor
        1e-6).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline`` (``lr`` defaults to 1e-3); ``noise``: ``"constant"`` or
        ``"tests"``.
    """

    model_name = "svdbk"

    basis: str = "rbf"
    optimizer: str = "adamw"
    rank: int = 1024
    hidden: int = 256
    jitter: float = 1e-4
    noise_init: float = 1e-2
    weight_decay: float = 1e-2
    lr: float = 1e-3

    def _validate(self) -> None:
        super()._validate()
        check_basis(self.basis)
        check_optimizer(self.optimizer)

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        return {"d": int(X.shape[1])}

    def _module_options(self) -> SVDBKOptions:
        return SVDBKOptions(
            rank=int(self.rank),
            hidden=int(self.hidden),
            jitter=float(self.jitter),
            noise_init=float(self.noise_init),
            seed=int(self.seed),
            noise=self.noise,
            noise_power=bool(self.noise_power),
            basis=self.basis,
        )

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            return SVDBKModule(sizes["d"], self._module_options())

    def _optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        """Adam or AdamW at ``lr``; ``weight_decay`` on the network's parameters only."""
        assert isinstance(module, SVDBKModule | SVDBKExactModule)
        groups = [
            {"params": module.network_parameters(), "weight_decay": float(self.weight_decay)},
            {"params": module.other_parameters(), "weight_decay": 0.0},
        ]
        if check_optimizer(self.optimizer) == "adam":
            return torch.optim.Adam(groups, lr=self.lr)
        return torch.optim.AdamW(groups, lr=self.lr)

    def _noise(self, module: nn.Module) -> GaussianNoise | TestsNoise:
        if isinstance(module, SVDBKExactModule):
            return module.noise
        assert isinstance(module, SVDBKModule)
        return module.dbk.noise

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SVDBKModule)
        return svdbk_loss(module, X, y, n_total, tests)

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        assert isinstance(module, SVDBKModule)
        module.max_phi_sq.copy_(_max_phi_sq(module, X))

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SVDBKModule)
        out = module.dbk(X)
        noise = module.dbk.noise_var(tests) + (module.max_phi_sq - out.phi_sq).clamp_min(0.0)
        return out.mean, out.var_f, noise

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        """phi(A) phi(B)' (uncorrected prior kernel)."""
        assert isinstance(module, SVDBKModule | SVDBKExactModule)
        return module.features(A) @ module.features(B).T

    def features(self, X: Any) -> Any:
        """phi(X), (n, r) float64 (standardised-target units)."""
        module = self._check_fitted()
        assert isinstance(module, SVDBKModule | SVDBKExactModule)
        with torch.no_grad():
            return module.features(self._tensor(X)).double().cpu().numpy()


def _max_phi_sq(
    module: SVDBKModule | SVDBKExactModule, X: Tensor, chunk_size: int = REFRESH_CHUNK
) -> Tensor:
    """max_i ||phi(x_i)||² over ``X``, in chunks."""
    best = torch.zeros((), dtype=X.dtype, device=X.device)
    for start in range(0, X.shape[0], chunk_size):
        phi = module.features(X[start : start + chunk_size])
        best = torch.maximum(best, phi.pow(2).sum(-1).max())
    return best


@dataclass(kw_only=True, eq=False, repr=False)
class SVDBKExactRegressor(SVDBKRegressor):
    """Exact DBK with the variance correction, 001 eq. 12 (full batch; module docstring).

    For a scalar s2 the posterior is eq. 12's: Lambda_hat = s2 A = Phi'D^{-1}Phi + s2 I with
    D = S_hat / s2. The r×r factorisation is float64; a step costs O(n r²) and holds all n rows,
    so ``fit`` refuses n > ``max_n`` (:class:`~geodbk.baselines.base.ProblemTooLargeError`).

    Parameters
    ----------
    max_n
        Largest training set accepted (default 200,000: a step holds the network's
        activations and Phi for all n rows at once).
    basis, optimizer, weight_decay, rank, hidden, jitter, noise_init
        As in :class:`SVDBKRegressor`.
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``: ``epochs`` are optimiser steps (``batch_size`` unused: full
        batch).
    """

    model_name = "svdbk-exact"
    full_batch = True

    max_n: int = 200_000

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n = int(X.shape[0])
        if n > self.max_n:
            raise ProblemTooLargeError(
                f"svdbk-exact: {n} training points exceed max_n={self.max_n} (full batch: one "
                f"step holds the network's activations and Phi, {n}×{self.rank}, for every row, "
                "O(n r²) time); use svdbk (mini-batch) or raise max_n"
            )
        return {"d": int(X.shape[1])}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            return SVDBKExactModule(sizes["d"], self._module_options())

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        """The corrected exact loss on all the data; caches eq. 12's posterior (detached)."""
        assert isinstance(module, SVDBKExactModule)
        phi = module.features(X)
        s2 = module.noise_var(tests)
        loss = svdbk_exact_loss(phi, y, s2, module.const_mean)
        phi_d = phi.detach()
        module.set_posterior(
            iter([(phi_d, y, s2.detach().expand(phi_d.shape[0]))]),
            phi_d.pow(2).sum(-1).max(),
        )
        return loss

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        """max_train ||phi||² and eq. 12's posterior from the training data, in chunks."""
        assert isinstance(module, SVDBKExactModule)
        top, chunk_size = _max_phi_sq(module, X), REFRESH_CHUNK

        def chunks() -> Iterator[tuple[Tensor, Tensor, Tensor]]:
            for start in range(0, X.shape[0], chunk_size):
                stop = start + chunk_size
                tb = None if tests is None else tests[start:stop]
                phi = module.features(X[start:stop])
                yield phi, y[start:stop], module.noise_var(tb).expand(phi.shape[0])

        module.set_posterior(chunks(), top)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """mu = c + phi*'w_mean, var_f = ||L_A^{-1} phi*||², noise = s2_hat(x*)."""
        assert isinstance(module, SVDBKExactModule)
        phi = module.features(X)
        mean = phi @ module.w_mean + module.const_mean
        v = torch.linalg.solve_triangular(module.chol_a, phi.T, upper=False)
        var_f = v.pow(2).sum(0)
        phi_sq = phi.pow(2).sum(-1)
        noise = module.noise_var(tests) + (module.max_phi_sq - phi_sq).clamp_min(0.0)
        return mean, var_f, noise
