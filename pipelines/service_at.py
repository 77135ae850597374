"""``geodbk service --at FILE``: service-class probabilities at the places listed in a file.

Writes ``RUN/service/classes_<file stem>.parquet`` with one row per input row: the input's own
columns (a clash with an output name is renamed ``input_<name>``), then ``quadkey`` (the
zoom-16 tile of the place), ``lon``, ``lat``, ``p_<class>`` for each class (``p_unserved``,
``p_underserved``, ``p_served`` with the BEAD tiers), ``p_tier_<j>`` (probability of meeting
tier j), ``service_class`` (the most probable class's name), ``quantity``, ``quarter`` and
``outside_region`` (True: the place lies outside the run's region; its values are then
missing). The parquet metadata holds the data licence (``geodbk_data_licence``) and the
service's tiers, latency, quantity and copula (``geodbk_service``, JSON).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from geodbk.atomic import atomic_path
from geodbk.geo.locations import Locations
from pipelines.run_inputs import read_region, tile_ids
from pipelines.rundir import RunDir, licence_attrs, licence_schema_metadata, run_licence
from pipelines.service_classes import Service

log = logging.getLogger("geodbk")

__all__ = ["SERVICE_KEY", "output_columns", "write_classes_at"]

#: Parquet key-value metadata holding the service's tiers, quantity and copula (JSON).
SERVICE_KEY = b"geodbk_service"


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
        "outside_region",
    )


def _json_value(value: Any) -> Any:
    """An attribute as JSON (numpy arrays and scalars to lists and numbers)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def write_classes_at(rd: RunDir, service: Service, places: Locations, *, stem: str) -> Path:
    """Class probabilities of ``service`` at ``places``; write and return
    ``RUN/service/classes_<stem>.parquet``."""
    region = read_region(rd)
    inside = np.asarray(shapely.intersects_xy(region, places.lon, places.lat), dtype=bool)
    n = inside.size
    names = output_columns(service)
    probs = [c for c in names if c.startswith("p_")]
    values = {c: np.full(n, np.nan) for c in probs}
    label = np.full(n, None, dtype=object)
    if inside.any():
        got = service.predict(places.lon[inside], places.lat[inside])
        for c in probs:
            values[c][inside] = got[c]
        label[inside] = np.asarray(service.classes, dtype=object)[got["service_class"]]
    ids = places.ids.rename(columns={c: f"input_{c}" for c in places.ids if c in names})
    out = pd.concat(
        [
            ids,
            pd.DataFrame(
                {
                    "quadkey": tile_ids(places.lon, places.lat).astype(str),
                    "lon": places.lon,
                    "lat": places.lat,
                    **values,
                    "service_class": pd.array(label, dtype="string"),
                    "quantity": service.quantity,
                    "quarter": service.quarter,
                    "outside_region": ~inside,
                }
            ),
        ],
        axis=1,
    )
    meta_service = {k: _json_value(v) for k, v in service.attributes(rd).items()}
    path = rd.root / "service" / f"classes_{stem}.parquet"
    table = pa.Table.from_pandas(out, preserve_index=False)
    meta = {
        **(table.schema.metadata or {}),
        **licence_schema_metadata(licence_attrs(run_licence(rd))),
        SERVICE_KEY: json.dumps(meta_service, sort_keys=True).encode(),
    }
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
    log.info(
        "wrote %s (%d places from %s, %d outside the region; %s quantity, %s)",
        path,
        n,
        places.source,
        int((~inside).sum()),
        service.quantity,
        service.quarter,
    )
    return path
