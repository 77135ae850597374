"""Sparse-variational baselines built on the core's DBK model (methods.md §1 and §2).

All of them share the core's basis, q(w) = N(m, LL'), noise, objectives, training loop and
bundles; they differ only in the backbone, the basis and the objective. SV-RBF, SV-DKL, PP-DKL
and VBLL are ``DBKRegressor``s, so they take the same ``noise="constant"|"tests"`` option
(``fit(..., tests=...)``, ``predict_dist(..., tests=..., quantity=...)``) as DBK (issue 9); SVDBK, a
``TorchBaseline``, has the same option through the base class (s2_i = s2_floor +
s2_meas / tests_i^p in place of s2 below):

* **SV-RBF** — SVGP on the raw inputs: identity backbone, whitened RBF-ARD inducing-point basis
  phi(x) = chol(Kzz + jI)^{-1} k_Z(x) (Z uniform in [-1,1]^d, l = sqrt(d)), ELBO with the
  base-kernel correction var_f(x) = ||L'phi||² + k~(x,x) - ||phi||² (= GPyTorch's whitened
  ``VariationalStrategy`` + ``VariationalELBO``):
  loss = mean_B[-log N(y; mu, s2) + var_f / (2 s2)] + KL / n.
* **SV-DKL** — the same on the residual-MLP backbone g(x) (``DBKRegressor(objective="elbo")``).
* **PP-DKL** — PPGP on g(x): mean_B[-log N(y; mu, var_f + s2)] + (β/n) KL with the same
  correction (β = 1, GPyTorch's ``PredictiveLogLikelihood`` default).
* **VBLL** — the ELBO on the SiLU basis, no correction.
* **SVDBK** — the companion paper's DBK (§2): ELBO data term (KL weight 1) plus the trace term
  mean_B((max_B ||phi||² - ||phi_i||²) / (2 s2_i)) (weight 1), no correction in training; at
  test time heteroscedastic noise s2_hat(x) = s2(x) + max(0, max_train ||phi||² - ||phi(x)||²)
  and predictive var = ||L'phi*||² + s2_hat(x*) (``quantity="latent"``: ||L'phi*||² only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from geodbk.baselines.base import TorchBaseline
from geodbk.bases import RBFInducingBasis
from geodbk.estimator import DBKRegressor
from geodbk.likelihoods import GaussianNoise, TestsNoise
from geodbk.model import DBKModel
from geodbk.objectives import elbo_loss, gaussian_kl_standard


class SVRBFRegressor(DBKRegressor):
    """SV-RBF: SVGP with an RBF-ARD kernel on the raw inputs (identity backbone).

    Same options and contract as :class:`~geodbk.estimator.DBKRegressor` (``hidden`` is unused:
    the basis acts on x itself); the default objective is the ELBO with the base-kernel variance
    correction, i.e. standard whitened SVGP.
    """

    model_name = "sv-rbf"

    # Every parameter is spelled out (scikit-learn reads them from this signature); only the
    # defaults of ``objective`` and ``lr`` differ from DBKRegressor's.
    def __init__(
        self,
        *,
        expansion: str = "rbf",
        rank: int = 1024,
        hidden: int = 256,
        objective: str = "elbo",
        alpha: float = 0.1,
        beta: float = 0.01,
        batch_size: int = 1024,
        epochs: int = 400,
        lr: float = 0.01,
        weight_decay: float = 1e-2,
        patience: int = 50,
        device: str = "auto",
        seed: int = 0,
        jitter: float = 1e-4,
        dtype: str = "float32",
        noise_init: float = 1e-2,
        noise_floor: float = 1e-6,
        noise: str = "constant",
        noise_power: bool = False,
        noise_urban: bool = False,
    ) -> None:
        super().__init__(
            expansion=expansion,
            rank=rank,
            hidden=hidden,
            objective=objective,
            alpha=alpha,
            beta=beta,
            batch_size=batch_size,
            epochs=epochs,
            lr=lr,
            weight_decay=weight_decay,
            patience=patience,
            device=device,
            seed=seed,
            jitter=jitter,
            dtype=dtype,
            noise_init=noise_init,
            noise_floor=noise_floor,
            noise=noise,
            noise_power=noise_power,
            noise_urban=noise_urban,
        )

    def _build_model(self, input_dim: int, device: torch.device) -> DBKModel:
        """A DBKModel whose backbone is the identity and whose basis lives on R^d."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            gen = torch.Generator().manual_seed(int(self.seed))
            model = DBKModel(
                input_dim,
                expansion="rbf",
                rank=int(self.rank),
                hidden=1,
                jitter=float(self.jitter),
                noise_init=float(self.noise_init),
                noise_floor=float(self.noise_floor),
                noise=str(self.noise),
                noise_power=bool(self.noise_power),
                generator=gen,
            )
            model.backbone = nn.Identity()  # type: ignore[assignment]
            model.basis = RBFInducingBasis(
                input_dim, int(self.rank), jitter=float(self.jitter), generator=gen
            )
        return model.to(
            device=device, dtype=torch.float64 if self.dtype == "float64" else torch.float32
        )

    def save(self, path: Any, *, metadata: dict[str, Any] | None = None) -> Any:
        """Save like ``DBKRegressor`` with ``metadata["baseline"] = "sv-rbf"`` recorded."""
        meta = dict(metadata) if metadata is not None else dict(getattr(self, "metadata_", {}))
        meta.setdefault("baseline", self.model_name)
        return super().save(path, metadata=meta)


def sv_dkl(**kwargs: Any) -> DBKRegressor:
    """SV-DKL: ELBO (with the correction) on the residual-MLP backbone and RBF basis."""
    return DBKRegressor(**{"expansion": "rbf", "objective": "elbo", **kwargs})


def pp_dkl(**kwargs: Any) -> DBKRegressor:
    """PP-DKL: PPGP (β = 1, with the correction) on the backbone and RBF basis."""
    return DBKRegressor(**{"expansion": "rbf", "objective": "ppgp", "beta": 1.0, **kwargs})


def vbll(**kwargs: Any) -> DBKRegressor:
    """VBLL: ELBO on the SiLU (Bayesian-last-layer) basis, no correction."""
    return DBKRegressor(**{"expansion": "silu", "objective": "elbo", **kwargs})


class SVDBKModule(nn.Module):
    """A core :class:`DBKModel` plus the training-set maximum of ||phi||² (test-time correction)."""

    max_phi_sq: Tensor

    def __init__(
        self,
        d: int,
        *,
        rank: int,
        hidden: int,
        jitter: float,
        noise_init: float,
        seed: int,
        noise: str = "constant",
        noise_power: bool = False,
    ):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.dbk = DBKModel(
            d,
            expansion="rbf",
            rank=rank,
            hidden=hidden,
            jitter=jitter,
            noise_init=noise_init,
            noise=noise,
            noise_power=noise_power,
            generator=gen,
        )
        self.register_buffer("max_phi_sq", torch.zeros(()))


def svdbk_loss(
    module: SVDBKModule, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
) -> Tensor:
    """Per-datum SVDBK loss (methods §2 divided by n).

    mean_B[-log N(y_i; mu_i, s2_i) + ||L'phi_i||² / (2 s2_i)] + KL / n
    + mean_B[(max_B ||phi||² - ||phi_i||²) / (2 s2_i)], s2_i = s2 or s2(tests_i).
    """
    out = module.dbk(X)
    s2 = module.dbk.noise_var(tests)
    q = module.dbk.q
    kl = gaussian_kl_standard(q.mean, q.scale_tril())
    trace = ((out.phi_sq.max() - out.phi_sq) / (2.0 * s2)).mean()
    return elbo_loss(out.mean, out.var_f, y, s2, kl=kl, n=n_total) + trace


class SVDBKRegressor(TorchBaseline):
    """SVDBK with the test-time variance correction (companion paper).

    Parameters
    ----------
    rank, hidden, jitter, noise_init
        As in ``DBKRegressor`` (DBK-RBF basis on the residual-MLP backbone).
    weight_decay
        AdamW weight decay on the backbone only (as the core's loop).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline`` (``lr`` defaults to 1e-3); ``noise``: ``"constant"`` or
        ``"tests"``.
    """

    model_name = "svdbk"

    def __init__(
        self,
        *,
        rank: int = 1024,
        hidden: int = 256,
        jitter: float = 1e-4,
        noise_init: float = 1e-2,
        weight_decay: float = 1e-2,
        epochs: int = 100,
        batch_size: int = 1024,
        lr: float = 1e-3,
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
        self.rank = rank
        self.hidden = hidden
        self.jitter = jitter
        self.noise_init = noise_init
        self.weight_decay = weight_decay

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        return {"d": int(X.shape[1])}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return SVDBKModule(
                sizes["d"],
                rank=self.rank,
                hidden=self.hidden,
                jitter=self.jitter,
                noise_init=self.noise_init,
                seed=self.seed,
                noise=self.noise,
                noise_power=self.noise_power,
            )

    def _optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        assert isinstance(module, SVDBKModule)
        groups = [
            {"params": module.dbk.backbone_parameters(), "weight_decay": self.weight_decay},
            {"params": module.dbk.other_parameters(), "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=self.lr)

    def _noise(self, module: nn.Module) -> GaussianNoise | TestsNoise:
        assert isinstance(module, SVDBKModule)
        return module.dbk.noise

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SVDBKModule)
        return svdbk_loss(module, X, y, n_total, tests)

    def _refresh(
        self,
        module: nn.Module,
        X: Tensor,
        y: Tensor,
        tests: Tensor | None = None,
        chunk_size: int = 65536,
    ) -> None:
        assert isinstance(module, SVDBKModule)
        best = torch.zeros((), dtype=X.dtype, device=X.device)
        for start in range(0, X.shape[0], chunk_size):
            phi = module.dbk.features(X[start : start + chunk_size])
            best = torch.maximum(best, phi.pow(2).sum(-1).max())
        module.max_phi_sq.copy_(best)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SVDBKModule)
        out = module.dbk(X)
        noise = module.dbk.noise_var(tests) + (module.max_phi_sq - out.phi_sq).clamp_min(0.0)
        return out.mean, out.var_f, noise

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, SVDBKModule)
        return module.dbk.features(A) @ module.dbk.features(B).T

    def features(self, X: Any) -> Any:
        """phi(X), (n, r) float64 (standardised-target units)."""
        module = self._check_fitted()
        assert isinstance(module, SVDBKModule)
        with torch.no_grad():
            return module.dbk.features(self._tensor(X)).double().cpu().numpy()
