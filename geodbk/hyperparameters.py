"""The DBK hyperparameters and their defaults, declared once.

:class:`DBKHyperparameters` holds the model and training options that both
:class:`geodbk.DBKRegressor` (its scikit-learn parameters) and the config of ``geodbk train``
(:class:`pipelines.config.TrainConfig`, its YAML keys) have, with the defaults of the seed's
Ookla settings (docs/decisions/defaults.md). Each derives from it and declares only what is
its own: the estimator adds ``jitter``, ``dtype``, ``noise_floor`` and ``noise_urban``; the
pipeline config re-declares ``noise`` and ``noise_init`` (default ``auto`` and ``0``, resolved
from the tile table) and adds its pipeline keys. The training loop takes its options from
these fields (:meth:`geodbk.training.LoopConfig.of`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["KERNEL_UPDATE_EVERY_DPPGP_RBF", "DBKHyperparameters", "finite_at_least"]

#: ``kernel_update_every: 0`` (the default) for DBK-RBF trained with dPPGP: the kernel steps on
#: one mini-batch in 4 (docs/decisions/defaults.md).
KERNEL_UPDATE_EVERY_DPPGP_RBF = 4


def finite_at_least(value: object, low: float, *, strict: bool = False) -> bool:
    """Whether ``value`` is a finite real number ``>= low`` (``> low`` with ``strict``)."""
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    return float(value) > low if strict else float(value) >= low


@dataclass(kw_only=True, eq=False, repr=False)
class DBKHyperparameters:
    """DBK model and training hyperparameters (their meaning: :class:`geodbk.DBKRegressor`).

    Keyword-only fields that are only stored (checked where they are used). No ``__eq__``
    or ``__repr__`` of its own, so that a scikit-learn estimator deriving from it keeps
    ``BaseEstimator``'s (and is hashable by identity); a subclass may generate its own.
    """

    expansion: str = "rbf"
    objective: str = "dppgp"
    rank: int = 1024
    hidden: int = 256
    alpha: float = 0.1
    beta: float = 0.01
    batch_size: int = 1024
    epochs: int = 400
    lr: float = 1e-3
    weight_decay: float = 1e-2
    patience: int = 50
    device: str = "auto"
    seed: int = 0
    noise: str = "constant"
    noise_power: bool = False
    noise_init: float = 1e-2
    kernel_update_every: int = 0

    def out_of_range(self) -> list[tuple[str, str]]:
        """``(name, rule)`` of each numeric hyperparameter outside its range (NaN and infinity
        are outside every range)."""

        rules = [
            ("rank", finite_at_least(self.rank, 1), ">= 1"),
            ("hidden", finite_at_least(self.hidden, 1), ">= 1"),
            ("alpha", finite_at_least(self.alpha, 0), "a finite number >= 0"),
            ("beta", finite_at_least(self.beta, 0), "a finite number >= 0"),
            ("batch_size", finite_at_least(self.batch_size, 1), ">= 1"),
            ("epochs", finite_at_least(self.epochs, 1), ">= 1"),
            ("lr", finite_at_least(self.lr, 0, strict=True), "a finite number > 0"),
            ("weight_decay", finite_at_least(self.weight_decay, 0), "a finite number >= 0"),
            ("patience", finite_at_least(self.patience, 1), ">= 1"),
            ("kernel_update_every", finite_at_least(self.kernel_update_every, 0), ">= 0"),
            (
                "noise_init",
                finite_at_least(self.noise_init, 0) and self.noise_init < 100,
                "0 (default) or a variance in (0, 100)",
            ),
        ]
        return [(name, rule) for name, good, rule in rules if not good]

    def kernel_update_every_allowed(self) -> bool:
        """Whether ``kernel_update_every`` is valid here: ``>= 0``, and above 1 only with the
        RBF basis (a kernel to hold) and a mini-batch objective (not ``exact``)."""
        k = int(self.kernel_update_every)
        return k >= 0 and (k <= 1 or (self.expansion == "rbf" and self.objective != "exact"))

    def resolved_kernel_update_every(self) -> int:
        """``kernel_update_every``, with ``0`` (default) resolved:
        :data:`KERNEL_UPDATE_EVERY_DPPGP_RBF` for the RBF basis with the dPPGP objective, else
        ``1`` (no kernel to hold with the SiLU basis; PPGP, ELBO and exact unmeasured held)."""
        if self.kernel_update_every != 0:
            return int(self.kernel_update_every)
        held = self.expansion == "rbf" and self.objective == "dppgp"
        return KERNEL_UPDATE_EVERY_DPPGP_RBF if held else 1

    @property
    def variance_correction(self) -> bool:
        """Whether training and predictions add the base-kernel variance correction
        ``k~(x,x) - ||phi(x)||^2`` (PPGP and ELBO with the RBF basis)."""
        return self.expansion == "rbf" and self.objective in ("ppgp", "elbo")
