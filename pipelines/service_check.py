"""The service classes' own check: do held-out tiles fall in the classes the map expects?

For each held-out (test) tile with all three targets measured, scored in two groups as the
report's map calibration scores one target (``well_measured``: ``MIN_TESTS`` or more speed
tests of each target over its test rows; ``less_measured``: ``LESS_MEASURED_TESTS`` to
``MIN_TESTS - 1``, more like the map's typical tile), its level of each target is the tests-weighted mean of its log10 values (as the report's map
calibration, :mod:`pipelines.map_calibration`), and its **observed class** is the class of
those three levels: tier ``j`` met when download and upload are at or above the tier's speeds
and latency at or below the latency limit. The map's probability of each class at the tile
comes from each target's prediction of that level (the map's quantity averaged over the test
rows' quarters, the level's own noise in its variance), joined by the class map's copula, as
:meth:`pipelines.service_classes.Service.predict` joins the map's.

Per class, over all scored tiles and urban and rural: the **expected share** (the mean
probability, what the map's headline states for these tiles), the **observed share** with its
95% confidence interval counted by place (:func:`geodbk.metrics.share_interval_by_place`:
neighbouring tiles share errors), and whether the expected share lies inside it. Per map class
(the most probable one): how many tiles the map gives it and the share of those whose level is
in it. Overall: the share of tiles whose most probable class is their observed class, the mean
probability of the observed class and the Brier score ``mean_i sum_c (p_ic - [c_i = c])²``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from geodbk.metrics import PLACES, share_interval, share_interval_by_place, tests_range
from geodbk.service import (
    class_probabilities,
    level_classes,
    most_probable_class,
    tier_probabilities,
)
from pipelines.map_calibration import LESS_MEASURED_TESTS, MIN_TESTS, held_out_levels
from pipelines.service_classes import SERVICE_TARGETS, Service

log = logging.getLogger("geodbk")

__all__ = [
    "held_out_check_sentence",
    "service_check",
    "service_held_out_check",
    "with_held_out_check",
]


def service_check(
    *,
    class_p: np.ndarray,
    observed: np.ndarray,
    urban: np.ndarray,
    places: np.ndarray,
    classes: tuple[str, ...],
) -> dict[str, Any]:
    """The module docstring's scores of ``class_p`` (n, classes) against each tile's
    ``observed`` class index (n,), over all tiles, urban and rural (``places``: each tile's
    place for the intervals).

    Returns
    -------
    dict
        ``{"all", "urban", "rural"}`` (a group without tiles left out), each ``{"tiles",
        "places", "classes": {name: {"expected_share", "observed_share",
        "observed_interval", "consistent"}}, "map_class": {name: {"tiles", "observed_same"}},
        "most_probable_agrees", "p_observed_class", "brier"}`` (``observed_interval`` by place,
        or by tile with fewer than two places; ``observed_same`` ``None`` for a class the map
        gives no tile).
    """
    p = np.asarray(class_p, dtype=np.float64)
    obs = np.asarray(observed, dtype=np.int64)
    is_urban = np.asarray(urban, dtype=bool)
    labels = np.asarray(places)
    called = most_probable_class(p).astype(np.int64)
    onehot = np.eye(len(classes))[obs]
    out: dict[str, Any] = {}
    for group, m in (("all", np.ones_like(is_urban)), ("urban", is_urban), ("rural", ~is_urban)):
        n = int(m.sum())
        if not n:
            continue
        per_class = {}
        for c, name in enumerate(classes):
            hits = obs[m] == c
            interval = share_interval_by_place(hits, labels[m]) or share_interval(
                int(hits.sum()), n
            )
            expected = float(p[m, c].mean())
            per_class[name] = {
                "expected_share": expected,
                "observed_share": float(hits.mean()),
                "observed_interval": [float(v) for v in interval],
                "consistent": bool(interval[0] <= expected <= interval[1]),
            }
        map_class = {}
        for c, name in enumerate(classes):
            given = m & (called == c)
            map_class[name] = {
                "tiles": int(given.sum()),
                "observed_same": float((obs[given] == c).mean()) if given.any() else None,
            }
        out[group] = {
            "tiles": n,
            PLACES: int(pd.unique(labels[m]).size),
            "classes": per_class,
            "map_class": map_class,
            "most_probable_agrees": float((called[m] == obs[m]).mean()),
            "p_observed_class": float(p[m][np.arange(n), obs[m]].mean()),
            "brier": float(((p[m] - onehot[m]) ** 2).sum(axis=1).mean()),
        }
    return out


def service_held_out_check(
    rd: Any, service: Service, *, min_tests: int = MIN_TESTS
) -> dict[str, Any] | None:
    """:func:`service_check` of ``service`` on ``rd``'s test tiles with all three targets
    measured: ``well_measured`` (``min_tests`` or more tests of each target) and
    ``less_measured`` (:data:`~pipelines.map_calibration.LESS_MEASURED_TESTS` to
    ``min_tests - 1``), each ``{"min_tests", "max_tests", "tiles", "all", "urban", "rural"}``
    (``None`` without such tiles), with ``{"quantity", "classes", "method"}`` (``classes``:
    the class names, lowest first, as the groups' keys are not ordered in JSON). ``None`` for
    the ``test`` quantity (a class of one test is not a tile's level), without a test split
    with tests, or without any such tile."""
    if service.quantity == "test":
        return None
    frames = []
    for target in SERVICE_TARGETS:
        p = service.predictors[target]
        tile_model = p.layer if p.layer is not None else p.effect
        chunk = int(p.metadata.get("config", {}).get("predict_chunk_size", 65536))
        levels = held_out_levels(
            rd,
            p.spec,
            p.model,
            tile_model,
            quantity=service.quantity,
            metadata=p.metadata,
            chunk=chunk,
            min_tests=min(LESS_MEASURED_TESTS, min_tests),
        )
        if levels is None:
            return None
        frames.append(levels.set_index("tile"))
    joined = frames[0][["urban", "place"]].join(
        [
            f[["level", "error", "sd", "tests"]].add_suffix(f"_{t}")
            for f, t in zip(frames, SERVICE_TARGETS, strict=True)
        ],
        how="inner",
    )
    level, error, sd, each_tests = (
        joined[[f"{name}_{t}" for t in SERVICE_TARGETS]].to_numpy(np.float64)
        for name in ("level", "error", "sd", "tests")
    )
    tests = each_tests.min(axis=1) if len(joined) else np.zeros(0)  # the least measured target
    thresholds = service.thresholds()
    class_p = class_probabilities(
        tier_probabilities(level + error, sd, thresholds, service.copula.correlation)
    )
    observed = level_classes(level, thresholds)
    parts: dict[str, Any] = {}
    for part, low, high in (
        ("well_measured", min_tests, None),
        ("less_measured", LESS_MEASURED_TESTS, min_tests),
    ):
        m = (tests >= low) & (tests < (math.inf if high is None else high))
        if not m.any():
            parts[part] = None
            continue
        parts[part] = {
            "min_tests": int(low),
            "max_tests": high,
            "tiles": int(m.sum()),
            **service_check(
                class_p=class_p[m],
                observed=observed[m],
                urban=joined["urban"].to_numpy(bool)[m],
                places=joined["place"].to_numpy()[m],
                classes=service.classes,
            ),
        }
    if not any(parts.values()):
        return None
    return {
        "quantity": service.quantity,
        "classes": list(service.classes),
        "method": (
            "held-out test tiles with all three targets measured: each tile's class from its "
            "tests-weighted download, upload and latency levels, against the class "
            "probabilities of the models' predictions of those levels joined by the copula"
        ),
        **parts,
    }


def held_out_check_sentence(check: dict[str, Any] | None) -> str:
    """One sentence of a :func:`service_held_out_check` (``""`` without one): per group of
    tiles, each class's expected and observed share, an observed share whose 95% interval
    leaves out the expected one starred."""
    if not check:
        return ""
    said = []
    names = check["classes"]
    for part in check.get("well_measured"), check.get("less_measured"):
        if not part or not part.get("all"):
            continue
        whole = part["all"]
        expected = " / ".join(_pct(whole["classes"][c]["expected_share"]) for c in names)
        observed = " / ".join(
            _pct(whole["classes"][c]["observed_share"])
            + ("" if whole["classes"][c]["consistent"] else "*")
            for c in names
        )
        said.append(
            f"of {whole['tiles']} test tiles with {tests_range(part)} tests the map expected "
            f"{expected} {' / '.join(names)} and {observed} were"
        )
    if not said:
        return ""
    starred = any("*" in part for part in said)
    return (
        "Held-out check: "
        + "; ".join(said)
        + (" (* outside the observed share's 95% confidence interval by place)" if starred else "")
        + "."
    )


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def with_held_out_check(service: Service, rd: Any) -> Service:
    """``service`` with its :func:`service_held_out_check` on ``rd``, logged."""
    check = service_held_out_check(rd, service)
    if check is None:
        log.info(
            "service: no held-out check (the %s quantity, or no test tiles with %d+ tests and "
            "all three targets)",
            service.quantity,
            MIN_TESTS,
        )
    else:
        log.info("service: %s", held_out_check_sentence(check))
    return replace(service, held_out_check=check)
