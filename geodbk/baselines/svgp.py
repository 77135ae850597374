"""Sparse-variational baselines built on the core's DBK model (methods.md §1).

All of them share the core's basis, q(w) = N(m, LL'), noise, objectives, training loop and
bundles; they differ only in the backbone, the basis and the objective. They are
``DBKRegressor``s, so they take the same ``noise="constant"|"tests"`` option
(``fit(..., tests=...)``, ``predict_dist(..., tests=..., quantity=...)``) as DBK
(s2_i = s2_floor + s2_meas / tests_i^p in place of s2 below). SVDBK is in
:mod:`geodbk.baselines.svdbk`.

* **SV-RBF** — SVGP on the raw inputs: identity backbone, whitened RBF-ARD inducing-point basis
  phi(x) = chol(Kzz + jI)^{-1} k_Z(x) (Z uniform in [-1,1]^d, l = sqrt(d)), ELBO with the
  base-kernel correction var_f(x) = ||L'phi||² + k~(x,x) - ||phi||² (= GPyTorch's whitened
  ``VariationalStrategy`` + ``VariationalELBO``):
  loss = mean_B[-log N(y; mu, s2) + var_f / (2 s2)] + KL / n.
* **SV-DKL** — the same on the residual-MLP backbone g(x) (``DBKRegressor(objective="elbo")``).
* **PP-DKL** — PPGP on g(x): mean_B[-log N(y; mu, var_f + s2)] + (β/n) KL with the same
  correction (β = 1, GPyTorch's ``PredictiveLogLikelihood`` default).
* **VBLL** — the ELBO on the SiLU basis, no correction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from geodbk.bases import RBFInducingBasis
from geodbk.estimator import DBKRegressor
from geodbk.model import DBKModel


@dataclass(kw_only=True, eq=False, repr=False)
class SVRBFRegressor(DBKRegressor):
    """SV-RBF: SVGP with an RBF-ARD kernel on the raw inputs (identity backbone).

    Same options and contract as :class:`~geodbk.estimator.DBKRegressor` (``hidden`` is unused:
    the basis acts on x itself); the default objective is the ELBO with the base-kernel variance
    correction, i.e. standard whitened SVGP, and ``lr`` defaults to 0.01.
    """

    model_name = "sv-rbf"

    objective: str = "elbo"
    lr: float = 0.01

    def _make_model(self, input_dim: int, generator: torch.Generator, **changes: Any) -> DBKModel:
        """A DBKModel whose backbone is the identity and whose basis lives on R^d."""
        model = super()._make_model(input_dim, generator, expansion="rbf", hidden=1, **changes)
        model.backbone = nn.Identity()  # type: ignore[assignment]
        model.basis = RBFInducingBasis(
            input_dim, int(self.rank), jitter=float(self.jitter), generator=generator
        )
        return model

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
