"""``geodbk predict``: evaluate a trained model on a regular grid over the region.

Writes ``RUN/grids/TARGET.nc`` (variables and attributes: docs/architecture.md,
"grids/TARGET.nc"), evaluated and written in row blocks of at most ~262k cells by
:class:`pipelines.gridfile.GridWriter`, then moved into place atomically, so memory stays
bounded for any grid size. What the map shows is a named quantity (``--quantity``,
:mod:`geodbk.quantities`, docs/quantities.md): ``tile`` (default; f(x) plus the tile's offset
from the tile effect and local layer), ``area`` (f(x)) or ``test`` (``--tests K`` tests from
``--devices M`` devices). ``mean``/``std`` (log10), the 95% interval ``mean ± 1.96 std``, the
natural-unit median ``10**mean`` and one exceedance probability per threshold describe that
quantity; every grid also holds the parts (``area_mean``, ``std_f``, ``tile_*``, ``test_sd``),
except that an area map of a model with a tile effect leaves out the tile and test parts.

A pooled model maps all quarters at once; a time-aware model maps ``--quarter SPEC`` (the latest
table quarter to ``grids/TARGET.nc``, any other Q to ``grids/TARGET_Q.nc``; a quarter after the
last training quarter is logged as an extrapolation). ``--trend Q1:Q2`` writes
``grids/TARGET_trend_Q1_Q2.nc``: ``change_per_year = (f(x, Q2) - f(x, Q1)) / years`` of the
latent mean with ``sd = y_sd ||L'(phi(x, Q2) - phi(x, Q1))|| / years`` from the joint
posterior, ``p_improved`` and ``ratio_per_year = 10**change_per_year``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtr
from tqdm import tqdm

from geodbk import __version__
from geodbk.errors import DataError
from geodbk.exceedance import exceedance_probability
from geodbk.geo.contract import QUANTITY_LABELS, Z95
from geodbk.geo.frame import frame_bounds, geometry_in_frame
from geodbk.geo.grids import DEFAULT_MAX_CELLS, Grid, block_rows_for, make_grid, region_mask
from geodbk.geo.longitude import native_longitude, wrap_longitude
from geodbk.geo.parquet_batches import iter_parquet_batches
from geodbk.geo.quadkey import MAX_ZOOM
from geodbk.geo.timeaxis import (
    extrapolation_of,
    quarter_index,
    resolve_quarters,
    years_between,
)
from geodbk.predictive import noise_kwargs
from geodbk.quantities import (
    DEFAULT_MAP_QUANTITY,
    QUANTITIES,
    check_quantity,
    describe_quantity,
    observation_noise_variance,
    predict_quantity,
)
from pipelines.bundles import load_model
from pipelines.cli import add_progress_option, call_with_options, stage_parser
from pipelines.gridfile import GridWriter, fill_value, grid_attrs, stored_alike
from pipelines.layers import load_map_layers
from pipelines.places import map_quarter_status, time_extrapolation_warning
from pipelines.predict_at import check_tests_devices, run_predict_at, tests_text
from pipelines.run_inputs import (
    observed_quarters,
    pooled_label,
    read_region,
    read_urban,
    tile_codes,
)
from pipelines.rundir import (
    RunDir,
    TargetSpec,
    check_thresholds,
    load_tiles,
    locked_stage,
    model_config_hash,
    model_inputs,
    require_run,
    run_licence_attrs,
    scale_lonlat,
    scaling_of,
    target_spec,
    time_scaling_of,
)
from pipelines.time_options import add_time_options, parse_trend

log = logging.getLogger("geodbk")

#: What ``geodbk predict --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Map a trained target on a regular grid over the region, or at a list of places (--at).

Writes RUN/grids/TARGET.nc, a compressed NetCDF-4 file (CF-1.8; open it with
xarray.open_dataset) with NaN outside the region. For the quantity the map shows (--quantity,
default tile) it holds the median (mean_natural, in Mbps or ms), the 95% interval
(pi_lower_natural, pi_upper_natural, pi_width_natural), the same on the log10 scale, and one
exceedance probability per threshold (p_below_25mbps = P(speed < 25 Mbps); latency:
p_above_100ms). Every grid also holds the parts of each quantity (area_mean, std_f, tile_mean,
tile_sd, tile_offset, tile_pull, tile_history, test_sd; an area map of a model with a tile
effect holds only area_mean and std_f, since it does not evaluate the effect) and names its
quantity, quarter, noise and licence in its attributes.

A pooled model maps all quarters at once. A time-aware model (geodbk train --time) maps the
quarters of --quarter (default the latest; the latest goes to grids/TARGET.nc, any other Q to
grids/TARGET_Q.nc), and --trend Q1:Q2 writes grids/TARGET_trend_Q1_Q2.nc: the change per year
of the neighbourhood level with its 95% interval and P(improved). Details: docs/cli.md,
"geodbk predict".
"""

EPILOG = """\
examples:
  geodbk predict --run runs/hawaii --target download
  geodbk predict --run runs/hawaii --target download --resolution 0.01
  geodbk predict --run runs/hawaii --target upload --tile-zoom 14 --thresholds 3 10 20
  geodbk predict --run runs/hawaii --target download --quarter 2022Q4   # time-aware models
  geodbk predict --run runs/hawaii --target download --quarter all
  geodbk predict --run runs/hawaii --target download --trend 2019Q4:2023Q4
  geodbk predict --run runs/hawaii --target download --quantity area    # the smooth f(x)
  geodbk predict --run runs/hawaii --target download --at locations.csv  # a list of places

What the maps show (--quantity): tile (default) = what a zoom-16 tile at the place typically
gets, informed by the tile's own measured history where it has one; area = the neighbourhood
level f(x); test = one speed test (--tests K: the average of K tests). Every tile or test grid
also holds area_mean, tile_mean, tile_offset, tile_sd, test_sd and tile_history
(docs/quantities.md).

Default resolution: the size of a zoom-16 Ookla tile at the region's central latitude,
coarsened (if needed) so the grid has at most 1,000,000 cells. Default extent: the region's
bounding box cut to the observed tiles + 0.05 deg (--extent region: the whole box).
Default thresholds: download 25 100 Mbps, upload 3 20 Mbps, latency 100 ms.
--quarter/--trend need a time-aware model (geodbk train --time); the latest table quarter is
written to grids/TARGET.nc, another quarter Q to grids/TARGET_Q.nc, a trend to
grids/TARGET_trend_Q1_Q2.nc.
exit codes: 0 ok, 2 usage, 3 bad data, 4 missing/bad model, 5 missing run directory.
"""

#: Log10-scale variables and the natural-unit variables derived from them.
LOG_VARS = ("mean", "std", "std_f", "pi_lower", "pi_upper", "pi_width")
NATURAL_VARS = ("mean_natural", "pi_lower_natural", "pi_upper_natural", "pi_width_natural")
#: Variables of a trend grid (``--trend``), besides ``in_region``.
TREND_VARS = (
    "change_per_year",
    "change_lower",
    "change_upper",
    "p_improved",
    "ratio_per_year",
    "ratio_lower",
    "ratio_upper",
)
#: The latent layer (95% credible interval of f(x), noise excluded).
LATENT_VARS = (
    "latent_pi_lower",
    "latent_pi_upper",
    "latent_pi_lower_natural",
    "latent_pi_upper_natural",
)


def register(subparsers: Any) -> None:
    """Add the ``predict`` sub-command."""
    p = stage_parser(
        subparsers,
        "predict",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
        run="run directory",
        target="trained target",
    )
    add_grid_options(p)
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=None,
        help="thresholds in Mbps (speeds) or ms (latency) for exceedance probabilities",
    )
    p.add_argument(
        "--tests",
        type=float,
        default=1.0,
        metavar="K",
        help="the observation layers are the tile average of K speed tests (default 1: a single "
        "speed test; tests-aware models only, constant-noise models ignore it)",
    )
    p.add_argument(
        "--devices",
        type=float,
        default=None,
        metavar="M",
        help="with a tests+devices model: the K tests come from M distinct devices (default: "
        "M = K, each test from its own device); other models ignore it",
    )
    add_quantity_option(
        p,
        "what the mean, interval and probability layers describe: tile (default) = what a "
        "zoom-16 tile here typically gets, its own history included where it has one; area = "
        "the neighbourhood level f(x); test = one speed test (or --tests K)",
    )
    add_time_options(
        p,
        quarter="time-aware models: quarter(s) to map, e.g. 2023Q2, 2022Q1:2023Q4 or all "
        "(default: the latest quarter of the table, written to grids/TARGET.nc)",
        trend="time-aware models: change per year between two quarters "
        "(grids/TARGET_trend_Q1_Q2.nc)",
    )
    p.add_argument(
        "--at",
        type=Path,
        default=None,
        metavar="FILE",
        help="predict at the places of a parquet/CSV/Excel/GeoJSON/GeoPackage/shapefile-zip file (a 'quadkey' column, "
        "'lon'/'lat' columns or point geometries) instead of a grid; writes "
        "predictions/TARGET_<file stem>.parquet with the file's own columns kept",
    )
    add_progress_option(p)


def _main(args: argparse.Namespace) -> int:
    if args.at is not None:
        if args.trend is not None:
            raise DataError("--at predicts at places for one quarter; drop --trend")
        if args.quarter is not None and ("," in args.quarter or ":" in args.quarter):
            raise DataError(f"--at takes one --quarter (e.g. 2023Q4), got {args.quarter!r}")
    call_with_options(run_predict if args.at is None else run_predict_at, args)
    return 0


#: The ``quantity`` attribute of the area variables (``std_f``, ``area_mean``, ``latent_*``).
AREA_LABEL = QUANTITY_LABELS["area"]
#: The quantity's parts written to every grid, whatever ``--quantity`` is (an area map of a
#: model with a tile effect: only ``area_mean``).
PART_VARS = (
    "area_mean",
    "tile_mean",
    "tile_offset",
    "tile_pull",
    "tile_sd",
    "test_sd",
    "tile_history",
)
#: The parts an area map of a model with a tile effect leaves out (they need the effect).
TILE_PART_VARS = PART_VARS[1:]
#: The parts that only a tile effect fills (0 in every cell of a model without one).
TILE_HISTORY_VARS = ("tile_offset", "tile_pull", "tile_history")


def _pooled_tile_time(observed: Sequence[str]) -> float:
    """A pooled map's tile-effect time step: the table's latest quarter (0 without quarters,
    as the tile effect was then fitted)."""
    return float(quarter_index(observed[-1])) if observed else 0.0


def describe_map_quantity(
    model: Any,
    quantity: str,
    tests: float,
    devices: float | None,
    *,
    effect: Any,
    layer: Any = None,
) -> tuple[str, str]:
    """``(label, description)`` of a grid's quantity: the label names it in each variable's
    ``quantity`` attribute and band description (:data:`geodbk.geo.contract.QUANTITY_LABELS`,
    the tile's with how it was made, ``(local layer)``; ``test: single speed test (tests=1)``);
    the description is the grid's ``quantity_description``."""
    if quantity == "area":
        return AREA_LABEL, "neighbourhood level f(x): the latent mean surface, noise excluded"
    if quantity == "tile":
        if layer is not None:
            return f"{QUANTITY_LABELS['tile']} (local layer)", (
                "what a zoom-16 tile typically gets: f(x) plus the tile's own offset, informed "
                "by the tile's history where it has one and pulled toward its measured "
                "neighbours by a short-range spatial field (local layer)"
            )
        if effect is not None:
            return f"{QUANTITY_LABELS['tile']} (tile effect)", (
                "what a zoom-16 tile typically gets: f(x) plus the tile's own offset, informed "
                "by the tile's history where it has one, else the prior spread of an unseen "
                "tile's offset (tile effect)"
            )
        return f"{QUANTITY_LABELS['tile']} (noise floor)", (
            "what a zoom-16 tile typically gets: f(x) plus the model's noise floor (the limit "
            "of many tests; no tile effect was fitted)"
        )
    text = describe_quantity(model, tests, devices)
    return f"test: {text}", text


def _local_layer_attrs(layer: Any) -> dict[str, Any]:
    """Grid attributes of the local layer's spatial field (none without one)."""
    if layer is None:
        return {}
    p = layer.params
    out = {
        "local_layer_sigma2": float(p.sigma2),
        "local_layer_range_km": float(p.range_km),
        "local_layer_neighbours": int(p.neighbours),
        "local_layer_place_share": float(p.place_share),
        "local_layer_unseen_prior": str(p.unseen_prior),
        **_share_basis_attrs("local_layer", p.place_share_basis),
        **_group_share_attrs("local_layer", p.place_share_by_group),
    }
    for g, v in p.tau2.items():  # refitted with the field: the tau2 the maps use
        out[f"local_layer_tau2_{g}"] = float(v)
    for g, v in (p.rho or {}).items():  # refitted with the field: the rho the maps use
        out[f"local_layer_rho_{g}"] = float(v)
    return out


def _group_share_attrs(prefix: str, by_group: dict[str, float] | None) -> dict[str, float]:
    """``PREFIX_place_share_GROUP``: the place share of each urban / rural group that chose
    its own on its validation tiles (the others take ``PREFIX_place_share``)."""
    return {f"{prefix}_place_share_{g}": float(c) for g, c in (by_group or {}).items()}


def _share_basis_attrs(prefix: str, basis: dict[str, int] | None) -> dict[str, int]:
    """``PREFIX_place_share_tiles`` and ``_units``: the validation tiles and held-out units
    that chose the place share (none when it was not chosen on validation tiles)."""
    if not basis:
        return {}
    return {f"{prefix}_place_share_{k}": int(basis[k]) for k in ("tiles", "units")}


def _tile_effect_attrs(effect: Any, model: Any) -> dict[str, Any]:
    """Grid attributes of the tile effect's parameters (none without one), with
    ``test_mean_shift``: how far one speed test's mean sits from the tile quantity's (log10;
    the ``test`` quantity's ``tests_shift`` at tests=1, the same at every cell)."""
    if effect is None:
        return {}
    p = effect.params
    out: dict[str, Any] = {f"tile_effect_tau2_{g}": float(v) for g, v in p.tau2.items()}
    out["tile_effect_rho"] = float(p.rho)
    out["tile_effect_latent_scale"] = float(p.latent_scale)
    out["tile_effect_place_share"] = float(p.place_share)
    out.update(_share_basis_attrs("tile_effect", p.place_share_basis))
    out.update(_group_share_attrs("tile_effect", p.place_share_by_group))
    one = noise_kwargs(model, 1.0, urban=np.zeros(1, dtype=bool))
    _, comp = model.noise_components(n=1, **one)
    out["test_mean_shift"] = float(effect.tests_shift(np.asarray(comp).reshape(1, -1))[0])
    return out


def predict_block(
    model: Any,
    spec: TargetSpec,
    X: np.ndarray,
    thresholds: Sequence[float],
    *,
    chunk_size: int,
    tests: float = 1.0,
    devices: float | None = None,
    urban: np.ndarray | None = None,
    quantity: str = "test",
    effect: Any = None,
    layer: Any = None,
    tiles: Any = None,
    times: np.ndarray | float | None = None,
    xy: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """All grid variables for inputs ``X`` (n, 2), as 1-D float64 arrays.

    ``mean``, ``std``, the interval, natural-unit and exceedance variables describe
    ``quantity`` (:mod:`geodbk.quantities`: ``area``, ``tile`` or ``test``; ``test`` is the tile
    average of ``tests`` speed tests from ``devices`` devices, ``tests=1``: a single test).
    Whatever the quantity, ``area_mean``/``std_f`` (and ``latent_*``, ``area_mean -+ 1.96
    std_f``) are the area quantity f(x), ``tile_mean``/``tile_sd`` the tile quantity,
    ``tile_offset`` the tile's offset (0 without history), ``tile_pull`` the neighbouring
    tiles' part of it (local layer), ``tile_history`` 1 where the tile has history in
    ``effect``, and ``test_sd`` one speed test (K = 1). ``effect`` is the model's tile effect
    (``None``: the tile quantity uses the noise floor) and ``layer`` its local layer (then
    ``xy``, km positions, is needed), with each row's zoom-16 ``tiles`` and time step
    ``times``; ``urban`` (n,) bool is each row's class (the noise floor
    of ``noise_urban`` models, which then also get the variable ``urban``, and the ``tau²``
    group of a grouped tile effect).
    """

    q = predict_quantity(
        model,
        X,
        quantity=quantity,
        effect=effect,
        layer=layer,
        tiles=tiles,
        times=times,
        xy=xy,
        urban=urban,
        tests=tests,
        devices=devices,
        chunk_size=chunk_size,
    )
    # f's and the tile's moments; the quantity's are the very same arrays where they coincide,
    # so the grid writer encodes each array once
    area = (q.area_mean, np.sqrt(q.area_var))
    tile = (q.mean, q.sd) if quantity == "tile" else (q.area_mean + q.offset, np.sqrt(q.tile_var))
    mean, std = {"area": area, "tile": tile}.get(quantity, (q.mean, q.sd))
    interval = _interval(spec, mean, std)
    latent = interval if quantity == "area" else _interval(spec, *area)
    out = {
        "mean": mean,
        "std": std,
        "std_f": area[1],
        "pi_lower": interval["lower"],
        "pi_upper": interval["upper"],
        "pi_width": interval["upper"] - interval["lower"],
        "mean_natural": spec.to_natural(mean),
        "pi_lower_natural": interval["lower_natural"],
        "pi_upper_natural": interval["upper_natural"],
        "pi_width_natural": interval["upper_natural"] - interval["lower_natural"],
        "latent_pi_lower": latent["lower"],
        "latent_pi_upper": latent["upper"],
        "latent_pi_lower_natural": latent["lower_natural"],
        "latent_pi_upper_natural": latent["upper_natural"],
    }
    for t in thresholds:
        # the bad side of t: P(speed <= t) or P(latency >= t)
        out[spec.threshold_name(t)] = exceedance_probability(
            mean, std, spec.natural_to_log10(t), above=not spec.higher_is_better
        )
    out["area_mean"] = q.area_mean
    out["tile_mean"] = tile[0]
    out["tile_offset"] = q.offset
    out["tile_pull"] = q.pull
    out["tile_sd"] = tile[1]
    single = q.noise_var
    if tests != 1 or devices is not None:
        # one test's noise, keeping what does not average over tests (the testers' parts)
        averaged = observation_noise_variance(
            model, len(mean), effect=effect, urban=urban, tests=tests, devices=devices
        )
        single = observation_noise_variance(model, len(mean), effect=effect, urban=urban)
        single = single + np.maximum(q.noise_var - averaged, 0.0)
    out["test_sd"] = np.sqrt(q.tile_var + single)
    out["tile_history"] = q.seen.astype(np.float64)
    if "urban" in noise_kwargs(model, tests, devices, urban=urban):
        out["urban"] = np.asarray(urban, dtype=np.float64)
    return out


def _interval(spec: TargetSpec, mean: np.ndarray, sd: np.ndarray) -> dict[str, np.ndarray]:
    """The 95% interval ``mean -+ Z95 sd`` (log10) and its bounds in natural units."""
    lower, upper = mean - Z95 * sd, mean + Z95 * sd
    return {
        "lower": lower,
        "upper": upper,
        "lower_natural": spec.to_natural(lower),
        "upper_natural": spec.to_natural(upper),
    }


def trend_block(
    model: Any,
    spec: TargetSpec,
    X_from: np.ndarray,
    X_to: np.ndarray,
    *,
    years: float,
    chunk_size: int,
) -> dict[str, np.ndarray]:
    """Trend variables between inputs ``X_from`` (quarter Q1) and ``X_to`` (Q2), 1-D float64.

    With ``(m, v)`` the mean and variance of ``f(x, Q2) - f(x, Q1)`` from
    :meth:`geodbk.DBKRegressor.predict_change` (joint posterior, latent f, log10 units)::

        change_per_year = m / years,  change_lower/upper = (m -+ 1.96 sqrt(v)) / years
        p_improved      = Phi(m / sqrt(v)) (speeds), Phi(-m / sqrt(v)) (latency)
        ratio_*         = 10**change_*

    ``p_improved`` is 1, 0 or 0.5 where ``v = 0`` (by the sign of ``m``).
    """
    if years <= 0:
        raise DataError(f"a trend needs a later second quarter (years = {years:g})")
    mean, var = model.predict_change(X_from, X_to, chunk_size=chunk_size)
    mean = np.asarray(mean, dtype=np.float64)
    sd = np.sqrt(np.maximum(np.asarray(var, dtype=np.float64), 0.0))
    at_zero = np.where(mean > 0, np.inf, np.where(mean < 0, -np.inf, 0.0))  # sd = 0
    z = np.divide(mean, sd, out=at_zero, where=sd > 0)
    p_up = ndtr(z)
    out = {
        "change_per_year": mean / years,
        "change_lower": (mean - Z95 * sd) / years,
        "change_upper": (mean + Z95 * sd) / years,
        "p_improved": p_up if spec.higher_is_better else 1.0 - p_up,
    }
    for src, dst in (
        ("change_per_year", "ratio_per_year"),
        ("change_lower", "ratio_lower"),
        ("change_upper", "ratio_upper"),
    ):
        out[dst] = np.power(10.0, out[src])
    return out


def _trend_var_attrs(spec: TargetSpec, first: str, last: str) -> dict[str, dict[str, str]]:
    per_year = f"log10 {spec.column} per year"
    better = "higher" if spec.higher_is_better else "lower"
    rel = ">" if spec.higher_is_better else "<"
    attrs = {
        "change_per_year": {
            "long_name": f"change per year of log10 {spec.name}, {first} to {last}",
            "units": per_year,
        },
        "change_lower": {"long_name": "95% interval of the change, lower", "units": per_year},
        "change_upper": {"long_name": "95% interval of the change, upper", "units": per_year},
        "p_improved": {
            "long_name": f"P(f({last}) {rel} f({first})): {spec.name} {better} in {last}",
            "units": "1",
        },
        "ratio_per_year": {
            "long_name": f"factor per year of the median {spec.name} (10**change_per_year)",
            "units": "1",
        },
        "ratio_lower": {"long_name": "95% interval of the factor per year, lower", "units": "1"},
        "ratio_upper": {"long_name": "95% interval of the factor per year, upper", "units": "1"},
    }
    for a in attrs.values():
        a["quantity"] = "latent mean f(x)"
    return attrs


def _var_attrs(
    spec: TargetSpec,
    thresholds: Sequence[float],
    quantity: str,
    *,
    tile_label: str,
    test_label: str,
    tile_effect: bool = True,
    local_layer: bool = True,
) -> dict[str, dict[str, str]]:
    """Per-variable attributes; ``quantity`` labels the variables of the grid's quantity,
    ``tile_label``/``test_label`` the tile and one-test parts. Without a ``tile_effect`` (or
    a ``local_layer``) the parts it would fill are 0 in every cell, and their names say so:
    a measured tile's history is then not used, not absent."""
    lg = f"log10 {spec.column}"
    attrs = {
        "mean": {"long_name": f"predictive mean of log10 {spec.name}", "units": lg},
        "std": {"long_name": "predictive sd of the grid's quantity", "units": lg},
        "std_f": {"long_name": "latent sd (noise excluded)", "units": lg},
        "pi_lower": {"long_name": "95% prediction interval, lower", "units": lg},
        "pi_upper": {"long_name": "95% prediction interval, upper", "units": lg},
        "pi_width": {"long_name": "95% prediction interval width", "units": lg},
        "mean_natural": {
            "long_name": f"predictive median {spec.name} of the grid's quantity",
            "units": spec.unit,
        },
        "pi_lower_natural": {"long_name": "95% PI lower", "units": spec.unit},
        "pi_upper_natural": {"long_name": "95% PI upper", "units": spec.unit},
        "pi_width_natural": {"long_name": "95% PI width", "units": spec.unit},
        "latent_pi_lower": {"long_name": "95% credible interval of f(x), lower", "units": lg},
        "latent_pi_upper": {"long_name": "95% credible interval of f(x), upper", "units": lg},
        "latent_pi_lower_natural": {"long_name": "95% CI of f(x), lower", "units": spec.unit},
        "latent_pi_upper_natural": {"long_name": "95% CI of f(x), upper", "units": spec.unit},
        "urban": {
            "long_name": "urban (1) or rural (0): the noise floor class of the cell centre",
            "units": "1",
            "quantity": "urban/rural class (RUN/urban_areas.geojson)",
        },
    }
    attrs.update(
        {
            "area_mean": {"long_name": f"mean of log10 {spec.name}, area quantity", "units": lg},
            "tile_mean": {"long_name": f"mean of log10 {spec.name}, tile quantity", "units": lg},
            "tile_offset": {
                "long_name": "posterior mean of the tile's own offset (tile_mean - area_mean)",
                "units": lg,
            },
            "tile_pull": {
                "long_name": "the measured neighbouring tiles' part of tile_offset (local layer)",
                "units": lg,
            },
            "tile_sd": {"long_name": "sd of the tile quantity", "units": lg},
            "test_sd": {"long_name": "sd of one speed test (tests=1)", "units": lg},
            "tile_history": {
                "long_name": "1 where the cell's zoom-16 tile has measured history, else 0",
                "units": "1",
            },
        }
    )
    unused = {} if tile_effect else dict.fromkeys(TILE_HISTORY_VARS, "tile effect")
    if tile_effect and not local_layer:
        unused["tile_pull"] = "local layer"
    for name, missing in unused.items():
        attrs[name]["long_name"] += f"; 0 everywhere: the model has no {missing}"
    fixed = {
        "std_f": AREA_LABEL,
        "area_mean": AREA_LABEL,
        "tile_mean": tile_label,
        "tile_offset": tile_label,
        "tile_pull": tile_label,
        "tile_sd": tile_label,
        "tile_history": tile_label,
        "test_sd": test_label,
    }
    for name, a in attrs.items():
        if name == "urban":
            continue
        if name in fixed:
            a["quantity"] = fixed[name]
        elif name.startswith("latent_"):
            a["quantity"] = AREA_LABEL
        else:
            a["quantity"] = quantity
    for t in thresholds:
        rel = "<" if spec.higher_is_better else ">"
        attrs[spec.threshold_name(t)] = {
            "long_name": f"P({spec.name} {rel} {t:g} {spec.unit})",
            "units": "1",
            "threshold": f"{t:g}",
            "quantity": quantity,
        }
    return attrs


#: Margin (degrees) around the observed tiles for ``extent="tiles"``.
TILE_MARGIN_DEG = 0.05


def tiles_west_of(region_extent: tuple[float, float, float, float]) -> float:
    """The west end of the turn of longitude the tiles' lon/lat extent is taken in: a degree
    west of the region's frame (:attr:`geodbk.geo.regions.Region.extent`), so that a region
    across the 180° meridian has a contiguous extent of tiles."""
    return float(region_extent[0]) - 1.0


def cut_to_tiles(
    region_extent: tuple[float, float, float, float],
    tiles_extent: tuple[float, float, float, float] | None,
) -> tuple[float, float, float, float]:
    """The region's box (in its frame) cut to the tiles' lon/lat extent plus
    :data:`TILE_MARGIN_DEG`; the region's box when the cut is empty or there are no tiles."""
    if tiles_extent is None:
        return region_extent
    m = TILE_MARGIN_DEG
    box = (
        max(region_extent[0], tiles_extent[0] - m),
        max(region_extent[1], tiles_extent[1] - m),
        min(region_extent[2], tiles_extent[2] + m),
        min(region_extent[3], tiles_extent[3] + m),
    )
    return box if box[2] > box[0] and box[3] > box[1] else region_extent


def grid_bounds(
    rd: RunDir, region_extent: tuple[float, float, float, float], *, extent: str
) -> tuple[float, float, float, float]:
    """Bounding box of the grid: the region's (in its frame), or :func:`cut_to_tiles`."""
    if extent == "region":
        return region_extent
    if extent != "tiles":
        raise DataError(f"extent must be 'tiles' or 'region', got {extent!r}")

    west = tiles_west_of(region_extent)
    lo = np.array([np.inf, np.inf])
    hi = -lo
    for cols in iter_parquet_batches(rd.tiles, columns=["lon", "lat"]):  # O(batch) memory
        lon = wrap_longitude(np.asarray(cols["lon"], dtype=np.float64), west=west)
        xy = np.column_stack([lon, cols["lat"]]).astype(np.float64)
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy):
            lo, hi = np.minimum(lo, xy.min(axis=0)), np.maximum(hi, xy.max(axis=0))
    if not np.isfinite(lo).all():
        return region_extent
    return cut_to_tiles(region_extent, (float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1])))


def map_grid(
    rd: RunDir,
    *,
    resolution: float | None,
    tile_zoom: int | None,
    max_cells: int,
    extent: str,
    force: bool = False,
    n_vars: int = 40,
) -> tuple[Any, Grid]:
    """The region (union of ``RUN/region.geojson``) and the grid ``geodbk predict`` maps:
    :func:`grid_bounds` of ``extent``, :func:`~geodbk.geo.grids.make_grid` of the resolution
    (default: zoom-16 cells coarsened to ``max_cells``), refused by :func:`check_grid_size`
    when too coarse, or larger than ``max_cells`` at an explicit resolution without ``force``."""
    geom = read_region(rd)
    bounds = grid_bounds(rd, frame_bounds(geom), extent=extent)
    grid = make_grid(bounds, resolution=resolution, tile_zoom=tile_zoom, max_cells=max_cells)
    explicit = resolution is not None or tile_zoom is not None
    check_grid_size(grid, bounds, max_cells=max_cells, force=force or not explicit, n_vars=n_vars)
    return geom, grid


def crs_attributes() -> dict[str, Any]:
    """Attributes of the ``spatial_ref`` variable for EPSG:4326, as rioxarray's ``write_crs``
    writes them: pyproj's CF grid mapping of rasterio's CRS, with GDAL's WKT as ``crs_wkt``
    and ``spatial_ref``. Made from rasterio and pyproj: importing rioxarray (and dask's arrays
    with it) would cost a map about 0.35 s."""
    return dict(_crs_attributes())


@functools.cache
def _crs_attributes() -> dict[str, Any]:
    import pyproj
    from rasterio.crs import CRS

    crs = CRS.from_epsg(4326)
    attrs: dict[str, Any] = pyproj.CRS.from_user_input(crs).to_cf()
    attrs["spatial_ref"] = attrs["crs_wkt"] = crs.to_wkt()
    return attrs


@locked_stage("predict")
def run_predict(
    run: str | Path,
    *,
    target: str,
    resolution: float | None = None,
    tile_zoom: int | None = None,
    thresholds: Sequence[float] | None = None,
    max_cells: int = DEFAULT_MAX_CELLS,
    max_block_cells: int = 262_144,
    extent: str = "tiles",
    tests: float = 1.0,
    devices: float | None = None,
    quarter: str | Sequence[str] | None = None,
    trend: str | None = None,
    quantity: str = DEFAULT_MAP_QUANTITY,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Predict ``target`` on the region grid and write ``RUN/grids/TARGET.nc``; return its path.

    Parameters
    ----------
    run
        Run directory with ``region.geojson`` and a trained ``models/TARGET``.
    target
        ``download``, ``upload`` or ``latency``.
    resolution, tile_zoom
        Cell size in degrees, or the size of a tile of this zoom (exclusive).
    thresholds
        Natural-unit thresholds (default :data:`geodbk.geo.contract.DEFAULT_THRESHOLDS`).
    max_cells
        Cap on the default grid size.
    max_block_cells
        Cells evaluated and held in memory at once.
    extent
        ``tiles`` (default): the grid spans the region's bounding box cut to the extent of the
        observed tiles plus a 0.05° margin (a state whose boundary includes remote, untested
        islands is not gridded where the model has no data); ``region``: the whole bounding box.
        Cells outside the region polygons are masked either way.
    tests
        Number of speed tests K the observation layers average (tests-aware models;
        default 1: a single speed test). Recorded in the attributes ``tests`` and ``quantity``.
    devices
        Number of distinct devices M behind those K tests (``tests+devices`` models; default
        ``None``: M = K). A ``tests+devices`` model's grid records it in the attribute
        ``devices`` (M, or K when not given) and in ``quantity`` when it differs from K.
        Time-aware models only: the quarter(s) to map (``2023Q2``, ``2022Q1:2023Q4``, ``all``
        or a list; :func:`geodbk.geo.timeaxis.resolve_quarters`); default the latest quarter of
        the table. The latest table quarter is written to ``grids/TARGET.nc``, another quarter
        Q to ``grids/TARGET_Q.nc``.
    trend
        Time-aware models only: ``Q1:Q2`` writes only the trend grid
        ``grids/TARGET_trend_Q1_Q2.nc`` (see :func:`trend_block`).
    force
        Write a grid of more than ``max_cells`` cells that an explicit ``resolution`` or
        ``tile_zoom`` asks for (refused otherwise, before any work).
    quantity
        What ``mean``, ``std``, the interval and the exceedance probabilities describe:
        ``tile`` (default), ``area`` or ``test`` (:mod:`geodbk.quantities`). Each cell's tile is
        the zoom-16 tile of its centre; its time step the grid's quarter (a pooled model: the
        table's latest quarter).
    progress
        A progress bar over the grid's blocks (only when stderr is a terminal).

    Returns
    -------
    pathlib.Path
        The grid written (with several quarters: the one of the latest quarter asked for).

    Raises
    ------
    DataError
        ``--quarter``/``--trend`` with a pooled model (retrain with ``--time``), both given, or
        a malformed quarter.
    """

    thr = check_thresholds(thresholds, target)
    check_tests_devices(tests, devices)
    if quarter is not None and trend is not None:
        raise DataError("give --quarter or --trend, not both")
    try:
        check_quantity(quantity)
    except ValueError as exc:
        raise DataError(f"--quantity: {exc}") from None
    grid_options = check_grid_options(
        resolution=resolution, tile_zoom=tile_zoom, max_cells=max_cells, extent=extent, force=force
    )

    rd = require_run(run)
    spec = target_spec(target)
    model = load_model(rd, target)
    md: dict[str, Any] = dict(getattr(model, "metadata_", None) or {})
    ts = time_scaling_of(md)
    if ts is None and (quarter is not None or trend is not None):
        flag = "--quarter" if quarter is not None else "--trend"
        raise DataError(
            f"{flag} needs a time-aware model, but {rd.model_dir(target)} pools all quarters "
            f"(trained without --time); retrain with `geodbk train --run {rd.root} "
            f"--target {target} --time`"
        )
    observed = observed_quarters(rd, md)
    trend_pair = parse_trend(trend) if trend is not None else None
    if trend_pair is not None and ts is not None:
        outside = [q for q in trend_pair if ts.is_extrapolation(q)]
        if outside and extrapolation_of(md) == "hold":
            raise DataError(
                f"--trend {trend}: {', '.join(outside)} lies outside the trained quarters "
                f"{ts.first}..{ts.last}, where this model holds the nearest trained quarter's map "
                "(time extrapolation 'hold', chosen at training); a change per year there would "
                "be an artefact. Use two quarters inside the trained range"
            )
    quarters: list[str | None] = [None]
    if ts is not None and trend_pair is None:
        if not observed:
            raise DataError(f"{rd.model_dir(target)}: the model metadata lists no quarters")
        quarters = list(resolve_quarters(quarter, observed=observed))
    scaling = md.get("input_scaling")
    if not scaling:
        scaling = scaling_of(load_tiles(rd)[1], source=rd.tiles)
    geom, grid = map_grid(rd, **grid_options)
    block_rows = block_rows_for(grid.shape[1], max_block_cells=max_block_cells)
    chunk = int(md.get("config", {}).get("predict_chunk_size", 65536))
    common: dict[str, Any] = {
        "target": target,
        "model_path": rd.relative(rd.model_dir(target)),
        "model_config_hash": model_config_hash(md),
        "model_created": str(md.get("created", "")),
        "resolution_deg": [grid.dx, grid.dy],
        "extent": extent,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        "time_aware": int(ts is not None),
        **run_licence_attrs(rd),
    }
    if ts is not None:
        common["trained_quarters"] = f"{ts.first}:{ts.last}"

    def scaled(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        return scale_lonlat(lon, lat, scaling)

    if trend_pair is not None:
        first, last = trend_pair
        years = years_between(first, last)
        assert ts is not None
        notes = [f"{q}: {ts.describe(q)}" for q in trend_pair if ts.is_extrapolation(q)]
        for text in notes:
            log.warning("trend %s:%s: %s", first, last, text)
        attrs = {
            **common,
            "title": f"geodbk {target} trend {first} to {last}",
            "product": "trend",
            "first_quarter": first,
            "last_quarter": last,
            "quarter": f"{first}:{last}",
            "quarter_status": "; ".join(notes) or "observed",
            "years": years,
            "units": f"log10 {spec.column} per year (ratio_*: factor per year, natural units)",
            "natural_units": spec.unit,
            "quantity": "latent mean f(x) (noise excluded)",
            "interval": "95% interval (change -+ 1.96 sd) / years from the joint posterior",
        }
        var_attrs = _trend_var_attrs(spec, first, last)
        variables: dict[str, tuple[Any, dict[str, Any]]] = {
            n: (np.float32, var_attrs[n]) for n in TREND_VARS
        }

        def evaluate_trend(X2: np.ndarray) -> dict[str, np.ndarray]:
            return trend_block(
                model,
                spec,
                model_inputs(X2, md, quarter=first),
                model_inputs(X2, md, quarter=last),
                years=years,
                chunk_size=chunk,
            )

        out = rd.trend_grid(target, first, last)
        log.info("predicting the %s trend %s -> %s (%g years)", target, first, last, years)
        return _write_grid(
            out,
            grid,
            geom,
            block_rows=block_rows,
            variables=variables,
            attrs=attrs,
            evaluate=lambda lon, lat: evaluate_trend(scaled(lon, lat)),
            progress=progress,
        )

    names = [
        *LOG_VARS,
        *NATURAL_VARS,
        *LATENT_VARS,
        *(spec.threshold_name(t) for t in thr),
        *PART_VARS,
    ]
    # an area map does not evaluate the tile effect and the local layer (nor load them), so
    # it leaves out the tile and test parts that need them rather than write the noise
    # floor's in their place
    parts_omitted = quantity == "area" and md.get("tile_effect") is not None
    effect, layer = (None, None) if quantity == "area" else load_map_layers(rd, target, model)
    if parts_omitted:
        names = [n for n in names if n not in TILE_PART_VARS]
    needs_urban = getattr(model, "noise_urban", False) or bool(
        effect is not None and effect.grouped
    )
    urban_geom = read_urban(rd, target=target) if needs_urban else None
    names += ["urban"] if getattr(model, "noise_urban", False) else []
    how = {"effect": effect, "layer": layer}
    label, description = describe_map_quantity(model, quantity, tests, devices, **how)
    tile_label = describe_map_quantity(model, "tile", tests, devices, **how)[0]
    test_label = describe_map_quantity(model, "test", 1.0, None, **how)[0]
    noise_params = (
        model.noise_parameters() if hasattr(model, "noise_parameters") else {"noise": "constant"}
    )
    var_attrs = _var_attrs(
        spec,
        thr,
        label,
        tile_label=tile_label,
        test_label=test_label,
        tile_effect=effect is not None,
        local_layer=layer is not None,
    )
    grid_vars: dict[str, tuple[Any, dict[str, Any]]] = {
        n: (np.float32, var_attrs.get(n, {})) for n in names
    }
    tile_time = _pooled_tile_time(observed) if ts is None else None
    base_attrs = {
        **common,
        "units": f"log10 {spec.column} (natural: {spec.unit})",
        "natural_units": spec.unit,
        "thresholds": list(thr),
        "interval": f"95% interval of the {quantity} quantity: mean +- 1.96 std (log10 scale)",
        "quantity": quantity,
        "quantity_description": description,
        "tile_effect": int(effect is not None),
        "local_layer": int(layer is not None),
        "tile_parts_omitted": int(parts_omitted),
        **_tile_effect_attrs(effect, model),
        **_local_layer_attrs(layer),
        "tests": float(tests),
        **(
            {"devices": float(tests if devices is None else devices)}
            if getattr(model, "devices_aware", False)
            else {}
        ),
        "noise_model": str(noise_params.get("noise", "constant")),
        **{f"noise_{k}": float(v) for k, v in noise_params.items() if k != "noise"},
    }
    written: list[Path] = []
    for q in quarters:
        if q is None:  # pooled model: one surface; a measured tile's offset at the latest quarter
            label, out = pooled_label(observed), rd.grid(target)
            status = map_quarter_status(
                None,
                None,
                observed=observed,
                tile_offsets=effect is not None and quantity != "area",
            )
        else:
            assert ts is not None
            label, status = q, map_quarter_status(ts, q, observed=observed)
            out = rd.grid(target) if q == observed[-1] else rd.grid(target, q)
            if ts.is_extrapolation(q):
                log.warning("%s", time_extrapolation_warning(target, q, ts, md))
        attrs = {
            **base_attrs,
            "title": f"geodbk {target} predictive grid, {label}",
            "quarter": label,
            "quarter_status": status,
        }

        def evaluate(lon: np.ndarray, lat: np.ndarray, q: str | None = q) -> dict[str, np.ndarray]:
            X = model_inputs(scaled(lon, lat), md, quarter=q)
            urban = None
            if urban_geom is not None:
                import shapely

                urban = np.asarray(
                    shapely.intersects_xy(urban_geom, native_longitude(lon), lat), dtype=bool
                )
            return predict_block(
                model,
                spec,
                X,
                thr,
                chunk_size=chunk,
                tests=tests,
                devices=devices,
                urban=urban,
                quantity=quantity,
                effect=effect,
                layer=layer,
                tiles=tile_codes(lon, lat) if effect is not None else None,
                times=float(quarter_index(q)) if q is not None else tile_time,
            )

        log.info("predicting %s for %s", target, label)
        warn_replacing_map(
            out,
            quantity,
            tests=float(tests),
            devices=attrs.get("devices"),
            resolution_deg=(grid.dx, grid.dy),
            extent=extent,
        )
        written.append(
            _write_grid(
                out,
                grid,
                geom,
                block_rows=block_rows,
                variables=grid_vars,
                attrs=attrs,
                evaluate=evaluate,
                progress=progress,
            )
        )
    return written[-1]


def _check_finite(values: dict[str, np.ndarray], names: Sequence[str], *, out: Path) -> None:
    """Refuse to write a grid with non-finite values inside the region (the previous file, if
    any, is kept): the model's parameters or inputs are broken."""
    for name in names:
        bad = int((~np.isfinite(values[name])).sum())
        if bad:
            raise DataError(
                f"the model gave {bad:,} non-finite '{name}' values inside the region, so "
                f"{out} was not written (an earlier file is kept); the model file may be "
                "damaged: retrain it with `geodbk train`"
            )


def add_grid_options(parser: argparse.ArgumentParser, *, verb: str = "write") -> None:
    """The grid options of every stage that evaluates a grid (predict, service, summarize):
    ``--resolution`` or ``--tile-zoom``, ``--max-cells``, ``--force`` and ``--extent``;
    ``verb`` says what ``--force`` allows ("write", "evaluate")."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument(
        "--resolution", type=float, default=None, metavar="DEG", help="cell size in degrees"
    )
    g.add_argument(
        "--tile-zoom", type=int, default=None, metavar="Z", help="cell size of tiles of zoom Z"
    )
    parser.add_argument(
        "--max-cells",
        type=int,
        default=DEFAULT_MAX_CELLS,
        metavar="N",
        help="cap on the grid size: the default resolution is coarsened to it, and an explicit "
        "--resolution / --tile-zoom beyond it is refused without --force (default %(default)s)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"{verb} a grid larger than --max-cells when --resolution or --tile-zoom asks for it",
    )
    parser.add_argument(
        "--extent",
        choices=["tiles", "region"],
        default="tiles",
        help="grid box: the region cut to the observed tiles (default) or the whole region",
    )


def add_quantity_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--quantity`` (one of :data:`geodbk.quantities.QUANTITIES`, default ``tile``) of every
    stage that maps a quantity (predict, service, summarize); ``help`` says what of."""
    parser.add_argument(
        "--quantity", choices=list(QUANTITIES), default=DEFAULT_MAP_QUANTITY, help=help
    )


def check_grid_options(
    *,
    resolution: float | None,
    tile_zoom: int | None,
    max_cells: int,
    extent: str = "tiles",
    force: bool = False,
) -> dict[str, Any]:
    """Refuse a non-finite or non-positive ``--resolution``, a ``--tile-zoom`` outside 1-23
    and a ``--max-cells`` below 1, naming the option and a valid value; return the options
    as the keyword arguments of :func:`map_grid`."""

    if resolution is not None and not (math.isfinite(resolution) and resolution > 0):
        raise DataError(
            f"--resolution must be a positive cell size in degrees (e.g. 0.01), got {resolution}"
        )
    if tile_zoom is not None and not 1 <= int(tile_zoom) <= MAX_ZOOM:
        raise DataError(
            f"--tile-zoom must be a web-mercator zoom from 1 to {MAX_ZOOM} (Ookla tiles: 16), "
            f"got {tile_zoom}"
        )
    if not int(max_cells) >= 1:
        raise DataError(f"--max-cells must be at least 1 (default 1000000), got {max_cells}")
    return {
        "resolution": resolution,
        "tile_zoom": tile_zoom,
        "max_cells": max_cells,
        "extent": extent,
        "force": force,
    }


def check_grid_size(
    grid: Grid,
    bounds: tuple[float, float, float, float],
    *,
    max_cells: int,
    force: bool,
    n_vars: int,
) -> None:
    """Refuse, before any work, a grid too coarse to map (fewer than 2 cells along an axis) and,
    without ``force``, one of more than ``max_cells`` cells (its estimated output size named;
    ``n_vars`` float32 variables). The default resolution is coarsened to about ``max_cells``
    already, so callers pass ``force`` for it."""
    ny, nx = grid.shape
    w, s, e, n = bounds
    if nx < 2 or ny < 2:
        raise DataError(
            f"a {grid.dx:g}° cell gives a {ny} x {nx} grid over the map's box "
            f"({e - w:.3g}° x {n - s:.3g}°): too coarse to map; use --resolution below "
            f"{min(e - w, n - s) / 2:.3g}"
        )
    if grid.size > max_cells and not force:
        gb = grid.size * n_vars * 4 / 1e9
        raise DataError(
            f"a {ny:,} x {nx:,} grid has {grid.size:,} cells (about {gb:.1f} GB of output), "
            f"more than --max-cells {max_cells:,}; use a coarser --resolution, raise "
            "--max-cells, or pass --force to write it"
        )


def warn_replacing_map(
    out: Path,
    quantity: str,
    *,
    tests: float | None = None,
    devices: float | None = None,
    resolution_deg: tuple[float, float] | None = None,
    extent: str | None = None,
) -> None:
    """Warn when ``out`` holds a map of another quantity, a test quantity of other
    ``tests``/``devices``, or a grid of another cell size or extent, which the new grid
    replaces (the dashboard, export, service and summarize read ``grids/TARGET.nc`` whatever
    it holds)."""
    if not out.is_file():
        return
    try:
        attrs = grid_attrs(out, fix="geodbk predict")
    except DataError:
        return
    old = str(attrs.get("quantity", ""))
    counts = (attrs.get("tests"), attrs.get("devices"))
    old_cells, old_extent = attrs.get("resolution_deg"), attrs.get("extent")
    if resolution_deg is not None and old_cells is not None:
        cells = tuple(float(v) for v in np.atleast_1d(old_cells))
        if len(cells) == 2 and not np.allclose(cells, resolution_deg, rtol=1e-6, atol=0.0):
            option = f"{cells[0]:g}" + ("" if cells[0] == cells[1] else " (tiles: --tile-zoom)")
            log.warning(
                "%s holds a map of %s cells; it is replaced by one of %s cells (run `geodbk "
                "predict` with --resolution %s to write it again)",
                out,
                _cells_text(cells),
                _cells_text(resolution_deg),
                option,
            )
    if extent is not None and old_extent is not None and str(old_extent) != extent:
        log.warning(
            "%s holds a map over the %s extent; it is replaced by one over the %s extent (run "
            "`geodbk predict` with --extent %s to write it again)",
            out,
            old_extent,
            extent,
            old_extent,
        )
    if old == quantity == "test" and tests is not None and counts[0] is not None:
        now = (float(tests), None if devices is None else float(devices))
        was = (float(counts[0]), None if counts[1] is None else float(counts[1]))
        if was != now:
            option = f"--tests {was[0]:g}" + ("" if was[1] is None else f" --devices {was[1]:g}")
            log.warning(
                "%s holds the test quantity's map of %s; it is replaced by that of %s (run "
                "`geodbk predict` with --quantity test %s to write it again)",
                out,
                tests_text(*was),
                tests_text(*now),
                option,
            )
        return
    if old and old != quantity:
        log.warning(
            "%s holds the %s quantity's map; it is replaced by the %s quantity's (run "
            "`geodbk predict` with --quantity %s to write it again)",
            out,
            old,
            quantity,
            old,
        )


def _cells_text(cells: tuple[float, ...]) -> str:
    """``0.01° x 0.01°`` for a cell size (lon, lat) in degrees."""
    return " x ".join(f"{c:.6g}°" for c in cells)


def _write_grid(
    out: Path,
    grid: Grid,
    geom: Any,
    *,
    block_rows: int,
    variables: dict[str, tuple[Any, dict[str, Any]]],
    attrs: dict[str, Any],
    evaluate: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]],
    progress: bool = True,
) -> Path:
    """Evaluate ``evaluate(lon, lat)`` (cell centres inside the region) block by block and
    write the variables (NaN outside the region; an integer variable its ``_FillValue``) plus
    ``in_region`` to ``out``; a progress bar over the blocks when ``progress`` and stderr is a
    terminal."""
    ny, nx = grid.shape
    names = list(variables)
    all_vars = {**variables, "in_region": (bool, {"long_name": "cell centre inside the region"})}
    t0 = time.perf_counter()
    log.info(
        "evaluating a %d x %d grid (%.5f x %.5f deg) in blocks of %d rows",
        ny,
        nx,
        grid.dx,
        grid.dy,
        block_rows,
    )
    writer = GridWriter(
        out,
        x=grid.x,
        y=grid.y,
        variables=all_vars,
        attrs=attrs,
        crs_attrs=crs_attributes(),
        chunk_rows=block_rows,
    )
    n_in = 0
    # the region's GeoJSON mapping once, not per block; the blocks' arrays are reused
    shape = (
        geom if geom.is_empty else geometry_in_frame(geom, west=grid.frame_west).__geo_interface__
    )
    buffers: dict[str, np.ndarray] = {}
    try:
        blocks_iter = tqdm(
            list(grid.row_blocks(block_rows)),
            desc=out.name,
            unit="block",
            disable=not (progress and sys.stderr.isatty()),
            leave=False,
        )
        for rows in blocks_iter:
            mask = region_mask(shape, grid, rows)
            blocks: dict[str, np.ndarray] = {"in_region": mask}
            values: dict[str, np.ndarray] = {}
            if mask.any():
                # the centres of the masked cells in row-major order, without the block's grid
                row_of, col_of = np.nonzero(mask)
                values = evaluate(grid.x[col_of], grid.y[rows][row_of])
                n_in += int(mask.sum())
                _check_finite(values, names, out=out)
            filled: dict[int, str] = {}  # variables holding the same array share one block
            for name in names:
                dtype, var_attrs = variables[name]
                same = filled.get(id(values[name])) if values else None
                if same is not None and stored_alike(variables[same], variables[name]):
                    blocks[name] = blocks[same]
                    continue
                block = buffers.get(name)
                if block is None or block.shape != mask.shape:
                    block = buffers[name] = np.empty(mask.shape, dtype=dtype)
                block.fill(fill_value(dtype, var_attrs))
                if values:
                    block[mask] = values[name]
                    filled[id(values[name])] = name
                blocks[name] = block
            writer.write_rows(rows, blocks, data_mask=mask)
        if n_in == 0:
            raise DataError(
                f"no cell centre of the {ny} x {nx} grid lies inside the region, so {out} would "
                "be empty; use a finer --resolution (or --extent region)"
            )
        writer.close()
    except BaseException:
        writer.abort()
        raise
    log.info(
        "wrote %s (%d of %d cells in the region, %.1f s)",
        out,
        n_in,
        grid.size,
        time.perf_counter() - t0,
    )
    return out
