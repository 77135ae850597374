"""A run's download, upload and latency models joined into service-class probabilities.

:func:`load_service` checks that the run has the three models (a
:class:`~geodbk.errors.RunDirectoryError` names each missing one and its ``geodbk train``
command), reads them as :class:`pipelines.places.PlacePredictor`\\ s, checks the tiers and the
latency, and estimates the copula (:mod:`pipelines.copula`); :meth:`Service.predict` gives
each place's probability of meeting each tier and of each class (:mod:`geodbk.service`).
``geodbk service`` (grid) and ``geodbk service --at`` share it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geodbk.errors import DataError, RunDirectoryError
from geodbk.geo.contract import QUANTITY_LABELS, TARGETS
from geodbk.quantities import check_quantity
from geodbk.service import (
    BEAD_TIERS,
    DEFAULT_LATENCY_MS,
    Tier,
    check_tiers,
    class_definitions,
    class_names,
    class_probabilities,
    most_probable_class,
    parse_tiers,
    tier_probabilities,
)
from pipelines.copula import COPULA_METHOD, Copula, estimate_copula
from pipelines.places import PlacePredictor, load_place_predictor, places_quarter_status
from pipelines.predict import describe_map_quantity
from pipelines.rundir import RunDir, target_spec

log = logging.getLogger("geodbk")

__all__ = [
    "SERVICE_QUANTITY_LABEL",
    "SERVICE_QUANTITY_TEXT",
    "SERVICE_TARGETS",
    "Service",
    "load_service",
    "require_service_models",
    "resolve_tiers",
]

#: The targets a service class needs, in the copula's order.
SERVICE_TARGETS: tuple[str, ...] = TARGETS
#: What the class probabilities describe, per quantity (outputs' ``quantity_description``).
SERVICE_QUANTITY_TEXT: dict[str, str] = {
    "tile": (
        "typical speed at the tile: what the zoom-16 tile at the place typically gets "
        "(f(x) plus the tile's own offset)"
    ),
    "area": "level of the area: the neighbourhood level f(x), the smooth latent surface",
    "test": "one speed test at the place",
}
#: Short label of each quantity (variables' ``quantity`` attribute, band descriptions).
SERVICE_QUANTITY_LABEL: dict[str, str] = QUANTITY_LABELS


def require_service_models(rd: RunDir) -> None:
    """Raise :class:`RunDirectoryError` naming each of download, upload and latency that has
    no trained model in ``rd``, with the command that trains it."""
    missing = [t for t in SERVICE_TARGETS if not (rd.model_dir(t) / "model.json").is_file()]
    if not missing:
        return
    commands = " and ".join(f"`geodbk train --run {rd.root} --target {t}`" for t in missing)
    folders = ", ".join(str(rd.model_dir(t)) for t in missing)
    raise RunDirectoryError(
        f"service classes need the download, upload and latency models, but {rd.root} has no "
        f"trained {' or '.join(missing)} model (no model.json in {folders}); run {commands} "
        "first"
    )


def resolve_tiers(tiers: str | Sequence[Tier], latency_ms: float) -> tuple[tuple[Tier, ...], float]:
    """Checked tiers (a ``"25/3,100/20"`` string or :class:`Tier`\\ s) and latency, or a
    :class:`DataError` naming ``--tiers`` / ``--latency-ms`` and a valid value."""
    try:
        checked = parse_tiers(tiers) if isinstance(tiers, str) else check_tiers(tiers)
    except ValueError as exc:
        raise DataError(f"--tiers: {exc}") from None
    if not (math.isfinite(latency_ms) and latency_ms > 0):
        raise DataError(
            f"--latency-ms must be a positive number of ms (e.g. 100), got {latency_ms}"
        )
    return checked, float(latency_ms)


@dataclass(frozen=True)
class Service:
    """The three models, the tiers and the copula: everything a class probability needs.

    Attributes
    ----------
    tiers, latency_ms
        Nested speed tiers and the latency every tier needs.
    quantity
        ``tile``, ``area`` or ``test`` (:mod:`geodbk.quantities`).
    predictors
        One :class:`PlacePredictor` per target of :data:`SERVICE_TARGETS`.
    copula
        The copula of the three targets.
    quarter_status
        What the quarter is to the models, as ``geodbk predict`` writes it into a grid
        (``observed``, ``extrapolation beyond 2023Q4``, ...; per target when they differ).
    held_out_check
        The classes scored on held-out tiles
        (:func:`pipelines.service_check.service_held_out_check`), ``None`` when not scored.
    """

    tiers: tuple[Tier, ...]
    latency_ms: float
    quantity: str
    predictors: dict[str, PlacePredictor]
    copula: Copula
    quarter_status: str = ""
    held_out_check: dict[str, Any] | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names, lowest first (:func:`geodbk.service.class_names`)."""
        return class_names(len(self.tiers))

    def class_descriptions(self) -> tuple[str, ...]:
        """What each class means, lowest first (:func:`geodbk.service.class_definitions`)."""
        return class_definitions(self.tiers, self.latency_ms)

    @property
    def tier_labels(self) -> str:
        """``"25/3,100/20"``."""
        return ",".join(t.label for t in self.tiers)

    def thresholds(self) -> np.ndarray:
        """(k, 3) log10 thresholds of the model units: minimum download and upload (kbps),
        maximum latency (ms)."""
        down, up, lat = (target_spec(t) for t in SERVICE_TARGETS)
        return np.array(
            [
                [
                    down.natural_to_log10(t.down_mbps),
                    up.natural_to_log10(t.up_mbps),
                    lat.natural_to_log10(self.latency_ms),
                ]
                for t in self.tiers
            ]
        )

    def predict(self, lon: np.ndarray, lat: np.ndarray) -> dict[str, np.ndarray]:
        """At places (inside the region): ``p_<class>`` for each class, ``p_tier_<j>`` (the
        probability of meeting tier j, j = 1..k) and ``service_class`` (the most probable
        class's index, int8)."""
        n = len(lon)
        mean = np.empty((n, 3))
        sd = np.empty((n, 3))
        for i, target in enumerate(SERVICE_TARGETS):
            q = self.predictors[target].predict(lon, lat, quantity=self.quantity)
            mean[:, i], sd[:, i] = q.mean, q.sd
        if not (np.isfinite(mean).all() and np.isfinite(sd).all() and (sd > 0).all()):
            raise DataError(
                "a model gave non-finite predictions or a zero sd; the model file may be "
                "damaged: retrain it with `geodbk train`"
            )
        tier_p = tier_probabilities(mean, sd, self.thresholds(), self.copula.correlation)
        class_p = class_probabilities(tier_p)
        out = {f"p_{name}": class_p[:, i] for i, name in enumerate(self.classes)}
        out.update({f"p_tier_{j + 1}": tier_p[:, j] for j in range(len(self.tiers))})
        out["service_class"] = most_probable_class(class_p)
        return out

    @property
    def quarter(self) -> str:
        """The predicted quarter: one label when the three agree, else ``download: Q; ...``."""
        labels = {t: p.quarter for t, p in self.predictors.items()}
        if len(set(labels.values())) == 1:
            return next(iter(labels.values()))
        return "; ".join(f"{t}: {q}" for t, q in labels.items())

    def quantity_labels(self) -> dict[str, str]:
        """Each target's quantity label as ``geodbk predict`` names it (``tile: local
        layer``, ``tile: noise floor``, ``area: latent f(x)``, ``test: single speed test
        (tests=1)``)."""
        out = {}
        for t, p in self.predictors.items():
            effect, layer = (None, None) if self.quantity == "area" else (p.effect, p.layer)
            label, _ = describe_map_quantity(
                p.model, self.quantity, 1.0, None, effect=effect, layer=layer
            )
            out[t] = label
        return out

    @property
    def quantity_description(self) -> str:
        """What the probabilities describe (e.g. ``typical speed at the tile: ...``)."""
        return SERVICE_QUANTITY_TEXT[self.quantity]

    def attributes(self, rd: RunDir) -> dict[str, Any]:
        """Metadata every service output carries (grid attributes, parquet metadata)."""
        R = self.copula.correlation
        labels = self.quantity_labels()
        attrs: dict[str, Any] = {
            "tiers": self.tier_labels,
            "tier_down_mbps": [t.down_mbps for t in self.tiers],
            "tier_up_mbps": [t.up_mbps for t in self.tiers],
            "latency_ms": self.latency_ms,
            "classes": " ".join(self.classes),
            "served_rule": (
                f"tier j met when download >= d_j Mbps, upload >= u_j Mbps and latency <= "
                f"{self.latency_ms:g} ms; class 0 meets no tier, class k meets tier k"
            ),
            "quantity": self.quantity,
            "quantity_label": SERVICE_QUANTITY_LABEL[self.quantity],
            "quantity_description": self.quantity_description,
            **{f"quantity_{t}": v for t, v in labels.items()},
            "quarter": self.quarter,
            **({"quarter_status": self.quarter_status} if self.quarter_status else {}),
            **{f"quarter_{t}": p.quarter for t, p in self.predictors.items()},
            **{f"model_path_{t}": rd.relative(rd.model_dir(t)) for t in self.predictors},
            "copula_targets": " ".join(self.copula.targets),
            "copula_correlation": [float(v) for v in R.ravel()],
            "copula_rows": int(self.copula.rows),
            "copula_method": COPULA_METHOD,
        }
        return attrs


def load_service(
    rd: RunDir,
    *,
    tiers: str | Sequence[Tier] = BEAD_TIERS,
    latency_ms: float = DEFAULT_LATENCY_MS,
    quantity: str = "tile",
    quarter: str | None = None,
) -> Service:
    """Check the options, read the three models and estimate the copula.

    Raises
    ------
    DataError
        Bad tiers, latency, quantity or quarter; too few validation rows for the copula.
    RunDirectoryError
        A model missing (each named, with its ``geodbk train`` command).
    """
    checked, latency = resolve_tiers(tiers, latency_ms)
    try:
        check_quantity(quantity)
    except ValueError as exc:
        raise DataError(f"--quantity: {exc}") from None
    require_service_models(rd)
    # the test quantity loads each model's tile effect and local layer, which the copula needs
    predictors = {
        t: load_place_predictor(rd, t, quantity="test", quarter=quarter) for t in SERVICE_TARGETS
    }
    labels = {t: p.quarter for t, p in predictors.items()}
    if len(set(labels.values())) > 1:
        log.warning(
            "the three models describe different periods (%s): the classes join them as they "
            "are; retrain them alike (all with --time, or all pooled) for one period",
            "; ".join(f"{t} {q}" for t, q in labels.items()),
        )
    copula = estimate_copula(rd, predictors)
    status = {t: places_quarter_status(rd, p, quantity=quantity)[1] for t, p in predictors.items()}
    return Service(
        tiers=checked,
        latency_ms=latency,
        quantity=quantity,
        predictors=predictors,
        copula=copula,
        quarter_status=(
            next(iter(status.values()))
            if len(set(status.values())) == 1
            else "; ".join(f"{t}: {s}" for t, s in status.items())
        ),
    )
