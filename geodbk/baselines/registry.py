"""Model names → constructors with a shared budget (epochs, batch size, rank, width, seed).

Every constructor returns an estimator with the ``DBKRegressor`` contract (fit / predict →
``Prediction`` / kernel / save / load). ``build_model(name, ...)`` applies the shared budget;
per-model options can be overridden with ``overrides``. Every model takes
``noise="constant"|"tests"`` (tests-aware s2_i = s2_floor + s2_meas / tests_i^p, issue 9) with
``fit(..., tests=, tests_val=)`` and ``predict(..., tests=, quantity=)``, e.g.
``build_model("cagp", ..., overrides={"noise": "tests"})``.

=============  ==============================================================================
name           model
=============  ==============================================================================
dbk-rbf        DBKRegressor(expansion="rbf", objective="dppgp")
dbk-silu       DBKRegressor(expansion="silu", objective="dppgp")
exact-dbk      DBKRegressor(expansion="rbf", objective="exact") (full batch, exact MML)
exact-rbf      exact RBF-ARD GP (full batch; refuses n > max_n)
sv-rbf         SVGP, RBF-ARD on the raw inputs (ELBO)
sv-dkl         SVGP on the residual-MLP backbone (ELBO)
pp-dkl         PPGP on the backbone (β = 1)
vbll           ELBO on the SiLU basis
svdbk          DBK-RBF with the ELBO + trace term and the test-time variance correction
cagp           CaGP-Opt (full batch, Matérn-3/2, block-sparse actions in Morton order)
solve-gp       SOLVE-GP (whitened, Matérn-3/2, M = M2 = rank)
softki         SoftKI (m = rank points, learnable temperature)
=============  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from geodbk.baselines.cagp import CaGPRegressor
from geodbk.baselines.exact_rbf import ExactRBFRegressor
from geodbk.baselines.softki import SoftKIRegressor
from geodbk.baselines.solvegp import SolveGPRegressor
from geodbk.baselines.svgp import SVDBKRegressor, SVRBFRegressor, pp_dkl, sv_dkl, vbll
from geodbk.estimator import DBKRegressor

MODEL_NAMES: tuple[str, ...] = (
    "dbk-rbf",
    "dbk-silu",
    "exact-dbk",
    "exact-rbf",
    "sv-rbf",
    "sv-dkl",
    "pp-dkl",
    "vbll",
    "svdbk",
    "cagp",
    "solve-gp",
    "softki",
)

#: Models trained full batch (one optimiser step per epoch).
FULL_BATCH: frozenset[str] = frozenset({"exact-dbk", "exact-rbf", "cagp"})


def _dbk(**defaults: Any) -> Callable[..., Any]:
    def make(**kwargs: Any) -> DBKRegressor:
        return DBKRegressor(**{**defaults, **kwargs})

    return make


#: name → (constructor, which shared budget options it takes)
CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "dbk-rbf": _dbk(expansion="rbf", objective="dppgp"),
    "dbk-silu": _dbk(expansion="silu", objective="dppgp"),
    "exact-dbk": _dbk(expansion="rbf", objective="exact"),
    "exact-rbf": ExactRBFRegressor,
    "sv-rbf": SVRBFRegressor,
    "sv-dkl": sv_dkl,
    "pp-dkl": pp_dkl,
    "vbll": vbll,
    "svdbk": SVDBKRegressor,
    "cagp": CaGPRegressor,
    "solve-gp": SolveGPRegressor,
    "softki": SoftKIRegressor,
}


def parse_model_list(text: str) -> list[str]:
    """Split ``"dbk-rbf,sv-dkl"`` (or ``"all"``) into known model names; ``ValueError`` otherwise."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(MODEL_NAMES)
    unknown = [n for n in names if n not in CONSTRUCTORS]
    if unknown or not names:
        raise ValueError(
            f"unknown model(s) {unknown or text!r}; choose from {', '.join(MODEL_NAMES)} or 'all'"
        )
    return names


def build_model(
    name: str,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    rank: int = 256,
    hidden: int = 64,
    device: str = "cpu",
    patience: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Construct model ``name`` with the shared budget.

    ``rank`` is r for the DBK family, the number of inducing points for SV-*, M = M2 for
    SOLVE-GP and m for SoftKI; CaGP uses min(512, 2·rank) actions. ``hidden`` is the backbone
    width. ``patience`` defaults to ``epochs`` (no early stopping inside the budget).
    """
    if name not in CONSTRUCTORS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    pat = epochs if patience is None else patience
    common: dict[str, Any] = {
        "epochs": epochs,
        "batch_size": batch_size,
        "seed": seed,
        "device": device,
    }
    # Initial noise: dPPGP models keep the seed's s2 = 1e-2 (their var_f absorbs the residual
    # variance). Every model that can explain residuals only through s2 (ELBO, PPGP, exact
    # marginal likelihood) starts at s2 = 0.5 in standardised units, close to GPyTorch's
    # softplus(0) = 0.69: from 1e-2 at lr 1e-3 the noise cannot grow within a short budget
    # (Adam moves the raw parameter by about lr per step) and the model stays over-confident.
    deep = {**common, "rank": rank, "hidden": hidden, "patience": max(pat, 1)}
    if name in ("dbk-rbf", "dbk-silu"):
        kwargs = deep
    elif name in ("exact-dbk", "sv-dkl", "pp-dkl", "vbll", "sv-rbf", "svdbk"):
        kwargs = {**deep, "noise_init": 0.5}
    elif name == "solve-gp":
        kwargs = {**common, "num_inducing": rank, "num_orthogonal": rank, "patience": pat}
    elif name == "softki":
        kwargs = {**common, "num_points": rank, "patience": pat}
    elif name == "cagp":
        kwargs = {**common, "n_actions": min(512, 2 * rank), "patience": pat}
    else:  # exact-rbf
        kwargs = {**common, "patience": pat}
    kwargs.update(overrides or {})
    return CONSTRUCTORS[name](**kwargs)
