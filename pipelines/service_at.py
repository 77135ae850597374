"""``geodbk service --at FILE``: service-class probabilities at the places listed in a file.

Writes ``RUN/service/classes_<file stem>.parquet`` (another quarter than the latest or another
quantity than ``tile``: ``classes_<file stem>[_<quarter>][_<quantity>].parquet``) with one row per input row: the input's own
columns (a clash with an output name is renamed ``input_<name>``), then ``quadkey`` (the
zoom-16 tile of the place), ``lon``, ``lat``, ``p_<class>`` for each class (``p_unserved``,
``p_underserved``, ``p_served`` with the BEAD tiers), ``p_tier_<j>`` (probability of meeting
tier j), ``service_class`` (the most probable class's name), ``quantity``, ``quarter``,
``quarter_status`` (as ``geodbk predict`` writes it into a grid) and
``outside_region`` (True: the place lies outside the run's region; its values are then
missing). The parquet metadata holds the data licence (``geodbk_data_licence``) and the
service's tiers, latency, quantity and copula with the places file's name and SHA-256
(``geodbk_service``, JSON: ``at``, ``at_sha256``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import shapely

from geodbk.geo.contract import SERVICE_KEY
from geodbk.geo.locations import Locations
from geodbk.geo.longitude import native_longitude
from geodbk.geo.timeaxis import quarter_text
from pipelines.predict_at import warn_replacing_other_places, write_places
from pipelines.run_inputs import read_region, region_kind
from pipelines.rundir import RunDir, run_licence_attrs
from pipelines.service_classes import SERVICE_QUANTITY_LABEL, Service

__all__ = ["SERVICE_KEY", "output_columns", "write_classes_at"]


def output_columns(service: Service) -> tuple[str, ...]:
    """The columns :func:`write_classes_at` adds after the input's own."""
    return (
        "quadkey",
        "lon",
        "lat",
        *(f"p_{c}" for c in service.classes),
        *(f"p_tier_{j}" for j in range(1, len(service.tiers) + 1)),
        "service_class",
        "quantity",
        "quarter",
        *(("quarter_status",) if service.quarter_status else ()),
        "located",
        "outside_region",
    )


def _json_value(value: Any) -> Any:
    """An attribute as JSON (numpy arrays and scalars to lists and numbers)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def write_classes_at(
    rd: RunDir,
    service: Service,
    places: Locations,
    *,
    stem: str,
    quarter: str | None = None,
    source: dict[str, str] | None = None,
) -> Path:
    """Class probabilities of ``service`` at ``places``; write and return
    ``RUN/service/classes_<stem>[_<quarter>][_<quantity>].parquet`` (:meth:`RunDir.classes_at`;
    ``quarter``: one other than the table's latest). ``source``: the places file's record
    (:func:`pipelines.predict_at.places_source`), kept in the metadata; replacing the classes
    at another file of the same stem is warned about."""
    inside = np.asarray(
        shapely.intersects_xy(read_region(rd), native_longitude(places.lon), places.lat), dtype=bool
    )
    probs = [c for c in output_columns(service) if c.startswith("p_")]
    values = {c: np.full(inside.size, np.nan) for c in probs}
    label = np.full(inside.size, None, dtype=object)
    if inside.any():
        got = service.predict(places.lon[inside], places.lat[inside])
        for c in probs:
            values[c][inside] = got[c]
        label[inside] = np.asarray(service.classes, dtype=object)[got["service_class"]]
    meta_service = {
        **(source or {}),
        **{k: _json_value(v) for k, v in service.attributes(rd).items()},
        "held_out_check": service.held_out_check,
    }
    path = rd.classes_at(stem, quarter=quarter, quantity=service.quantity)
    if source:
        warn_replacing_other_places(path, meta_service, key=SERVICE_KEY)
    return write_places(
        path,
        places,
        inside,
        {**values, "service_class": pd.array(label, dtype="string")},
        quantity=service.quantity,
        quarter=service.quarter,
        quarter_status=service.quarter_status or None,
        licence=run_licence_attrs(rd),
        metadata={SERVICE_KEY: json.dumps(meta_service, sort_keys=True).encode()},
        name=str(meta_service.get("at", stem)),
        region_kind=region_kind(rd),
        description=(
            f"geodbk service --at {meta_service.get('at', stem)}: service classes (tiers "
            f"{service.tier_labels} Mbps, latency <= {service.latency_ms:g} ms) of the "
            f"{SERVICE_QUANTITY_LABEL[service.quantity]}, "
            f"{quarter_text(service.quarter, service.quarter_status)}; p_<class>, p_tier_<j>: "
            "probabilities (0-1); service_class: the most probable class"
        ),
    )
