"""The map's own calibration: does the tile quantity cover what well-measured tiles get?

For each held-out (test) tile with at least ``min_tests`` speed tests over its test rows, the
tile's level is the tests-weighted mean of its log10 values, ``L = sum w y / sum w`` (``w``:
tests). The map's prediction of that level is the same average of the quantity at each test
row's quarter: mean ``sum w m / sum w`` and sd ``sum w s / sum w`` (the quarters taken fully
correlated, the widest case), and the level's own noise ``sum w² n / (sum w)²`` (``n``: each
row's observation noise under the same model) is added to its variance, with the part its
testers carry across quarters (``p``, at tiles without history) taken fully correlated:
``(sum w sqrt(p) / sum w)²``. Reported per quantity
(``tile``: what maps show, an unmeasured tile stated as a map states it, at a typical
training row's tests; ``area``: the smooth f(x)), overall, urban and rural: the share of
tiles whose level lies inside the 95% interval, the median |error| (log10) and the share off by
more than a factor 2 (|error| > log10 2). The tile quantity is also scored on the less measured
test tiles, with ``LESS_MEASURED_TESTS`` to ``min_tests - 1`` tests (``tile_less_measured``):
their levels carry more of their own noise, which each score holds, and they are more like the
map's typical tile (on Hawaii a busy tile's level strays less from its neighbourhood's than a
typical tile's). With the coverage comes its 95% confidence interval over the group's tiles
(exact binomial, :func:`geodbk.metrics.share_interval`): a hundred tiles measure a coverage to
about ±4 points. Neighbouring tiles share errors, so the tiles are fewer
independent checks than their count, and that interval is, if anything, too narrow. So each
group also has the interval counted by place (:func:`geodbk.metrics.share_interval_by_place`:
a tile's place is its held-out block on a block split, its zoom-12 parent tile otherwise,
:func:`geodbk.geo.blocks.calibration_places`), with the number of places.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from geodbk.geo.blocks import calibration_places, held_out_units
from geodbk.geo.contract import Z95
from geodbk.geo.timeaxis import quarter_indices
from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    MEDIAN_ABS_ERROR,
    OFF_BY_2X,
    PLACES,
    share_interval,
    share_interval_by_place,
)
from geodbk.quantities import predict_quantity
from geodbk.validation import counts_or_one
from pipelines.rundir import model_inputs
from pipelines.threshold_check import SURE_PROB, threshold_check

__all__ = [
    "LESS_MEASURED_TESTS",
    "MIN_TESTS",
    "HeldOutRows",
    "calibration_of_levels",
    "held_out_levels",
    "held_out_rows",
    "map_calibration",
    "map_calibration_of_run",
    "tile_level_errors",
]

#: Tests a held-out tile needs over its test rows to be scored.
MIN_TESTS = 30
#: Tests from which a held-out tile with fewer than ``MIN_TESTS`` is scored as less measured.
LESS_MEASURED_TESTS = 5
LOG10_2 = math.log10(2.0)


def tile_level_errors(
    *,
    tiles: Any,
    y: Any,
    tests: Any,
    urban: Any,
    mean: Any,
    var: Any,
    noise: Any,
    persistent: Any = None,
    places: Any = None,
    min_tests: int = MIN_TESTS,
    max_tests: float = math.inf,
) -> pd.DataFrame:
    """Each scored tile's prediction error of its level and the error's sd (module docstring).

    Parameters
    ----------
    tiles, y, tests, urban
        Test rows: tile id, log10 value, number of tests, urban flag.
    mean, var
        The quantity's mean and variance at each row.
    noise
        Each row's observation-noise variance (for the level's own noise), ``persistent``
        included.
    persistent
        The part of ``noise`` shared by a tile's rows (its testers'); default none.
    places
        Each row's place (:func:`geodbk.geo.blocks.calibration_places`); default its tile.
    min_tests, max_tests
        Tests a tile needs over its rows to be scored, and the count it must stay below.

    Returns
    -------
    pandas.DataFrame
        One row per tile with ``min_tests`` or more tests (fewer than ``max_tests``), sorted by
        tile: ``tile``, ``level`` (log10), ``error`` (prediction minus level, log10), ``sd``,
        ``tests``, ``urban`` and ``place``.
    """
    frame = pd.DataFrame(
        {
            "tile": np.asarray(tiles).astype(str),
            "w": np.asarray(tests, dtype=np.float64),
            "urban": np.asarray(urban, dtype=bool),
        }
    )
    w = frame["w"].to_numpy()
    frame["wy"] = w * np.asarray(y, dtype=np.float64)
    frame["wm"] = w * np.asarray(mean, dtype=np.float64)
    frame["ws"] = w * np.sqrt(np.maximum(np.asarray(var, dtype=np.float64), 0.0))
    shared = np.zeros(w.shape) if persistent is None else np.asarray(persistent, dtype=np.float64)
    frame["w2n"] = w**2 * (np.asarray(noise, dtype=np.float64) - shared)
    frame["wp"] = w * np.sqrt(np.maximum(shared, 0.0))
    frame["place"] = frame["tile"] if places is None else np.asarray(places)
    g = frame.groupby("tile", sort=True)
    sums = {c: g[c].sum().to_numpy() for c in ("w", "wy", "wm", "ws", "w2n", "wp")}
    keep = (sums["w"] >= min_tests) & (sums["w"] < max_tests)
    total = sums["w"][keep]
    sd = np.sqrt(
        (sums["ws"][keep] / total) ** 2
        + sums["w2n"][keep] / total**2
        + (sums["wp"][keep] / total) ** 2
    )
    return pd.DataFrame(
        {
            "tile": np.asarray(g["w"].sum().index)[keep],
            "level": sums["wy"][keep] / total,
            "error": (sums["wm"][keep] - sums["wy"][keep]) / total,
            "sd": sd,
            "tests": total,
            "urban": g["urban"].last().to_numpy()[keep],
            "place": g["place"].first().to_numpy()[keep],
        }
    )


def map_calibration(
    *, min_tests: int = MIN_TESTS, max_tests: int | None = None, **rows: Any
) -> dict[str, Any]:
    """Coverage, median |error| and share off by > 2x of the tiles' levels (module docstring;
    ``rows`` as for :func:`tile_level_errors`), of the tiles with ``min_tests`` or more tests
    (and fewer than ``max_tests``, when given).

    Returns
    -------
    dict
        ``{"tiles", "min_tests", "all", "urban", "rural"}`` (and ``"max_tests"`` when given),
        each group ``{"tiles",
        "coverage95", "coverage95_interval", "places", "coverage95_interval_by_place",
        "median_abs_error", "off_by_2x"}`` (:mod:`geodbk.metrics` names; the intervals are
        the coverage's 95% Clopper-Pearson interval over the group's tiles, and the same at
        the effective size of its places; the latter ``None`` in fewer than two places); a
        group without tiles is left out.
    """
    below = math.inf if max_tests is None else max_tests
    levels = tile_level_errors(min_tests=min_tests, max_tests=below, **rows)
    return calibration_of_levels(levels, min_tests=min_tests, max_tests=max_tests)


def calibration_of_levels(
    levels: pd.DataFrame, *, min_tests: int, max_tests: int | None = None
) -> dict[str, Any]:
    """:func:`map_calibration` of tiles already scored by :func:`tile_level_errors` (with
    ``min_tests`` and ``max_tests``, recorded in the result)."""
    err, sd = levels["error"].to_numpy(), levels["sd"].to_numpy()
    is_urban = levels["urban"].to_numpy(bool)
    out: dict[str, Any] = {"tiles": len(levels), "min_tests": int(min_tests)}
    if max_tests is not None:
        out["max_tests"] = int(max_tests)
    for name, m in (("all", np.ones_like(is_urban)), ("urban", is_urban), ("rural", ~is_urban)):
        if not m.any():
            continue
        covered = np.abs(err[m]) <= Z95 * sd[m]
        places = levels["place"].to_numpy()[m]
        by_place = share_interval_by_place(covered, places)
        out[name] = {
            "tiles": int(m.sum()),
            COVERAGE95: float(covered.mean()),
            COVERAGE95_INTERVAL: list(share_interval(int(covered.sum()), int(m.sum()))),
            PLACES: int(pd.unique(places).size),
            COVERAGE95_INTERVAL_BY_PLACE: None if by_place is None else list(by_place),
            MEDIAN_ABS_ERROR: float(np.median(np.abs(err[m]))),
            OFF_BY_2X: float((np.abs(err[m]) > LOG10_2).mean()),
        }
    return out


def map_calibration_of_run(
    rd: Any,
    spec: Any,
    model: Any,
    tile_model: Any,
    *,
    metadata: dict[str, Any],
    chunk: int,
    min_tests: int = MIN_TESTS,
    thresholds: Sequence[tuple[str, float]] = (),
) -> dict[str, Any]:
    """:func:`map_calibration` of a run's test split for the ``tile`` and ``area`` quantities,
    and of its less measured test tiles for the ``tile`` quantity (``tile_less_measured``:
    :data:`LESS_MEASURED_TESTS` to ``min_tests - 1`` tests).

    ``thresholds`` (label, natural units), when given, add ``thresholds``: the tile
    quantity's :func:`pipelines.threshold_check.threshold_check` at each, on the well and the
    less measured tiles (``{"sure", "min_tests", "less_min_tests", "rows": [{"label",
    "threshold", "well_measured", "less_measured"}]}``).

    ``tile_model`` is the model's tile effect or local layer (``None``: the tile quantity is
    f(x) plus the noise floor). On a block split, ``held_out_blocks`` counts the blocks the
    scored tiles lie in: tiles of one block share their errors, so the check is nearer that
    many independent places than its tile count.
    """
    result: dict[str, Any] = {"min_tests": min_tests, "quantity": "tile"}
    held = held_out_rows(rd, spec, metadata=metadata, chunk=chunk, min_tests=min_tests)
    if held is None:
        return result
    if held.blocks is not None:
        result["held_out_blocks"] = held.blocks
    area = held.scored(model, None, "area")
    result["area"] = map_calibration(**area, **held.rows)
    tile = held.scored(model, tile_model, "tile")
    well = tile_level_errors(**tile, **held.rows)
    result["tile"] = calibration_of_levels(well, min_tests=min_tests)
    less = tile_level_errors(
        **tile, **held.rows | {"min_tests": LESS_MEASURED_TESTS, "max_tests": min_tests}
    )
    if min_tests > LESS_MEASURED_TESTS:
        result["tile_less_measured"] = calibration_of_levels(
            less, min_tests=LESS_MEASURED_TESTS, max_tests=min_tests
        )
    if thresholds:
        result["thresholds"] = _threshold_rows(spec, well, less, thresholds, min_tests)
    return result


def _threshold_rows(
    spec: Any,
    well: pd.DataFrame,
    less: pd.DataFrame,
    thresholds: Sequence[tuple[str, float]],
    min_tests: int,
) -> dict[str, Any]:
    """:func:`pipelines.threshold_check.threshold_check` of the tile quantity at each
    threshold, on the well-measured and the less measured test tiles (``well``, ``less``:
    their :func:`tile_level_errors`)."""
    out = []
    for label, value in thresholds:
        t = spec.natural_to_log10(value)
        above = spec.higher_is_better
        out.append(
            {
                "label": label,
                "threshold": float(value),
                "well_measured": threshold_check(well, threshold=t, above=above),
                "less_measured": threshold_check(less, threshold=t, above=above),
            }
        )
    return {
        "sure": SURE_PROB,
        "min_tests": int(min_tests),
        "less_min_tests": LESS_MEASURED_TESTS,
        "rows": out,
    }


def held_out_levels(
    rd: Any,
    spec: Any,
    model: Any,
    tile_model: Any,
    *,
    quantity: str,
    metadata: dict[str, Any],
    chunk: int,
    min_tests: int = MIN_TESTS,
    max_tests: float = math.inf,
) -> pd.DataFrame | None:
    """:func:`tile_level_errors` of ``quantity`` at the run's test tiles with ``min_tests``
    or more tests (fewer than ``max_tests``), scored as :func:`map_calibration_of_run` scores
    them (``tile_model``: the tile effect or local layer, used by the ``tile`` quantity);
    ``None`` without test rows or their ``tests`` column."""
    held = held_out_rows(rd, spec, metadata=metadata, chunk=chunk, min_tests=min_tests)
    if held is None:
        return None
    scored = held.scored(model, tile_model if quantity == "tile" else None, quantity)
    return tile_level_errors(**scored, **held.rows | {"max_tests": max_tests})


@dataclass(frozen=True)
class HeldOutRows:
    """A run's test rows as the map calibration scores them.

    Attributes
    ----------
    X
        The rows' model inputs.
    common
        The keyword arguments of :func:`geodbk.quantities.predict_quantity` at the rows.
    rows
        The keyword arguments of :func:`tile_level_errors` other than the predictions.
    blocks
        On a block split, the held-out blocks the tiles with ``min_tests`` or more tests lie
        in; else ``None``.
    """

    X: np.ndarray
    common: dict[str, Any]
    rows: dict[str, Any]
    blocks: int | None

    def scored(self, model: Any, effect: Any, quantity: str) -> dict[str, Any]:
        """``mean``, ``var``, ``noise`` and ``persistent`` of ``quantity`` at the rows, with
        the rows' own noise under the same model: var(test) - var(quantity) (for f alone, all
        of the GP's noise)."""
        q = predict_quantity(model, self.X, quantity=quantity, effect=effect, **self.common)
        t = predict_quantity(model, self.X, quantity="test", effect=effect, **self.common)
        return {
            "mean": q.mean,
            "var": q.var,
            "noise": t.var - q.var,
            "persistent": t.persistent_var,
        }


def held_out_rows(
    rd: Any, spec: Any, *, metadata: dict[str, Any], chunk: int, min_tests: int = MIN_TESTS
) -> HeldOutRows | None:
    """Read the test rows of ``spec``'s target from ``tiles.parquet`` (a few columns; the
    test split is a tenth of the table); ``None`` without test rows or their ``tests``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    names = set(pq.read_schema(rd.tiles).names)
    cols = ["quadkey", "quarter", "x1", "x2", "urban", spec.log_column]
    cols += [c for c in ("tests", "devices", "lon", "lat") if c in names]
    test = pq.read_table(
        rd.tiles,
        columns=cols,
        filters=(pc.field("split") == "test") & pc.is_finite(pc.field(spec.log_column)),
    ).to_pandas()
    if test.empty or "tests" not in test:
        return None
    tests = counts_or_one(test["tests"].to_numpy())
    split = (metadata.get("tiles_metadata") or {}).get("split")
    lon, lat = (test[c].to_numpy() if c in test else None for c in ("lon", "lat"))
    units = held_out_units(lon, lat, split) if lon is not None and lat is not None else None
    # a block split's places are its held-out blocks, found once
    places = units if units is not None else calibration_places(test["quadkey"], lon=lon, lat=lat)
    blocks = None
    if units is not None:
        per_tile = pd.DataFrame({"tile": test["quadkey"], "tests": tests, "unit": units})
        per_tile = per_tile.groupby("tile").agg(tests=("tests", "sum"), unit=("unit", "first"))
        blocks = int(per_tile.loc[per_tile["tests"] >= min_tests, "unit"].nunique())
    devices = counts_or_one(test["devices"].to_numpy()) if "devices" in test else None
    quarters = test["quarter"].astype(str).to_numpy()
    time_aware = bool(metadata.get("time_scaling"))
    X = model_inputs(
        test[["x1", "x2"]].to_numpy(np.float64), metadata, quarter=quarters if time_aware else None
    )
    common = {
        "tiles": test["quadkey"].astype(str).to_numpy(),
        "times": quarter_indices(quarters).astype(np.float64),
        "urban": test["urban"].to_numpy(bool),
        "tests": tests,
        "devices": devices,
        "chunk_size": chunk,
        # the map as drawn: an unmeasured tile at a typical training row's tests, as every
        # map states it (its level's own noise stays its rows')
        "own_testers": False,
    }
    rows = {
        "tiles": common["tiles"],
        "y": test[spec.log_column].to_numpy(np.float64),
        "tests": tests,
        "urban": common["urban"],
        "places": places,
        "min_tests": min_tests,
    }
    return HeldOutRows(X=X, common=common, rows=rows, blocks=blocks)
