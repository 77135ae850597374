"""``geodbk export``: GeoTIFF / COG uncertainty maps from the predictive grids.

For each target, reads ``RUN/grids/TARGET.nc`` and writes ``RUN/exports/TARGET.tif``, one
float32 band per grid variable (band description = "NAME: QUANTITY", e.g. "std: test: single
speed test (tests=1)", "NAME: flag" for 0/1 and class flags, or the name for older grids; band units the
variable's ``units``, e.g. "log10 avg_d_kbps", "Mbps", "1"; nodata -9999 outside the region;
DEFLATE; COG with overviews for ``--format cog``; band tags the variable's ``long_name``,
``quantity`` and ``threshold``) and ``RUN/exports/TARGET.json``, the
provenance sidecar: run, target, model path, config hash, grid file, bands, their units and
long names, format, created,
geodbk version, and the grid's quarter (``time_aware``, ``quarter``, ``quarter_status``; trend
exports also ``product``, ``first_quarter``, ``last_quarter``, ``years``).

Time-aware models (``geodbk train --time``): ``--quarter Q`` exports the grid of quarter Q
(``grids/TARGET_Q.nc``, or ``grids/TARGET.nc`` when Q is the latest table quarter) to
``exports/TARGET_Q.tif`` (+ ``.json``); ``--trend Q1:Q2`` exports
``grids/TARGET_trend_Q1_Q2.nc`` to ``exports/TARGET_trend_Q1_Q2.tif``. The band descriptions of
a time-aware grid name its quarter (``mean: tile: what the tile here typically gets (local
layer), 2023Q4``) or the trend's period
(``change_per_year: latent mean f(x), change per year 2019Q4→2023Q4``).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from geodbk import __version__
from geodbk.atomic import atomic_path, json_text
from geodbk.errors import DataError, ModelFileError, RunDirectoryError
from geodbk.geo.contract import TARGETS
from geodbk.geo.geotiff import DEFAULT_NODATA, band_tags, write_geotiff
from geodbk.geo.timeaxis import format_quarter, quarter_index, resolve_quarters
from pipelines.cli import stage_parser
from pipelines.gridfile import grid_attrs, open_grid, sweep_spools
from pipelines.held_out_check import held_out_check, held_out_tags
from pipelines.rundir import (
    LICENCE_KEYS,
    RunDir,
    model_config_hash,
    read_json,
    require_grid,
    require_model,
    require_run,
    run_licence_attrs,
    stale_model_message,
    target_lock,
    target_spec,
    time_scaling_of,
)
from pipelines.time_options import add_time_options, parse_trend
from pipelines.timestack import check_same_quantity, write_time_stack

log = logging.getLogger("geodbk")

#: What ``geodbk export --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Write GeoTIFF or Cloud-Optimized GeoTIFF maps from the grids of `geodbk predict`.

For each target, reads RUN/grids/TARGET.nc and writes RUN/exports/TARGET.tif (one float32 band
per grid variable, each band described as "NAME: QUANTITY" with its units: log10 kbps or ms,
Mbps, ms, or 1 for probabilities and 0/1 flags; nodata -9999 outside the region,
DEFLATE; --format cog adds overviews) and RUN/exports/TARGET.json, the provenance sidecar (run,
target, model, config hash, grid, bands, quarter, licence, geodbk version). The data licence
is also written into the GeoTIFF tags. --format netcdf writes the quarters' grids into one
NetCDF-4 file with a time dimension instead. Details: docs/cli.md, "geodbk export".
"""

EPILOG = """\
examples:
  geodbk export --run runs/hawaii --target download
  geodbk export --run runs/hawaii --all --format cog
  geodbk export --run runs/hawaii --all runs/georgia runs/newmexico   # several runs at once
  geodbk export --run runs/hawaii --target download --quarter 2022Q4  # time-aware models
  geodbk export --run runs/hawaii --target download --trend 2019Q4:2023Q4

--quarter Q writes exports/TARGET_Q.tif from the grid of quarter Q; --trend Q1:Q2 writes
exports/TARGET_trend_Q1_Q2.tif (both need a time-aware model and `geodbk predict` run first).
Every quarter of --quarter SPEC (all: every quarter of the table) needs its grid, in every format:
a missing one stops the export before its first file, naming each missing quarter and the
`geodbk predict --quarter` command; several runs are all checked before any is written.
--format netcdf stacks the grids of --quarter (without it: every quarter of the table with a
grid, for a time-aware model, extrapolated quarters only when --quarter names them; the pooled
grid as one time step otherwise) into exports/TARGET_quarters.nc with dimensions (time, y, x):
time is the middle of each quarter, time_bnds its first day and the next quarter's first day,
quarter its label (xarray.open_dataset decodes them).
A grid predicted from an earlier model (another config hash, or trained since) stops the export
with exit 5 and the predict command; a model trained on an earlier ingest is warned about.
exit codes: 0 ok, 2 usage, 3 --quarter/--trend for a pooled model, 4 missing model,
5 missing run directory or grid, or a grid older than its model (run predict first).
"""


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command."""
    p = stage_parser(
        subparsers,
        "export",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
        run="run directory",
    )
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN2", help="more run directories")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--target", choices=list(TARGETS), help="one target")
    g.add_argument("--all", action="store_true", help="every trained target (the default)")
    p.add_argument(
        "--format",
        choices=["gtiff", "cog", "netcdf"],
        default="gtiff",
        help="GeoTIFF (default), Cloud-Optimised GeoTIFF, or netcdf: one NetCDF-4 file "
        "exports/TARGET_quarters.nc with the quarters as a CF time dimension",
    )
    add_time_options(
        p,
        quarter="time-aware models: export the grid of this quarter (2023Q2, 2022Q1:2023Q4, all) "
        "to exports/TARGET_Q.tif",
        trend="time-aware models: export the trend grid to exports/TARGET_trend_Q1_Q2.tif",
    )


def _main(args: argparse.Namespace) -> int:
    options = {"target": args.target, "fmt": args.format, "quarter": args.quarter}
    # every run's inputs are checked before the first file of any run is written
    jobs = [
        j for run in [args.run, *args.runs] for j in plan_export(run, **options, trend=args.trend)
    ]
    for job in jobs:
        write_export(job, fmt=args.format)
    return 0


def grid_variables(ds: Any) -> list[str]:
    """Band order: the float (y, x) variables of a grid, ``in_region`` excluded."""
    return [
        str(n)
        for n, v in ds.data_vars.items()
        if v.dims == ("y", "x") and n != "in_region" and v.dtype.kind == "f"
    ]


def grid_period(ds: Any) -> str | None:
    """What the grid's time is, for band descriptions: ``2023Q4`` (a time-aware quarter grid),
    ``change per year 2019Q4→2023Q4`` (a trend grid), or ``None`` (pooled or older grids)."""
    attrs = ds.attrs
    if attrs.get("product") == "trend":
        return f"change per year {attrs.get('first_quarter')}→{attrs.get('last_quarter')}"
    if int(attrs.get("time_aware", 0) or 0) == 1 and attrs.get("quarter"):
        return str(attrs["quarter"])
    return None


#: 0/1 variables of a grid without CF ``flag_values`` (``is_flag`` knows them by name).
FLAG_VARIABLES = ("tile_history",)


def is_flag(ds: Any, name: str) -> bool:
    """Whether a grid variable is a flag (0/1 or class codes), not a quantity: CF
    ``flag_values``/``flag_meanings``, or one of :data:`FLAG_VARIABLES`."""
    attrs = ds[name].attrs
    return name in FLAG_VARIABLES or "flag_values" in attrs or "flag_meanings" in attrs


def band_units(ds: Any, bands: list[str]) -> list[str]:
    """The ``units`` attribute of each band (``log10 avg_d_kbps``, ``Mbps``, ``1``; ``""``
    where a grid has none), for the GeoTIFF's band units and the sidecar."""
    return [str(ds[b].attrs.get("units", "")) for b in bands]


def band_descriptions(ds: Any, bands: list[str]) -> list[str]:
    """``"NAME: QUANTITY"`` per band (e.g. ``std: test: single speed test (tests=1)``, ``std_f:
    area: neighbourhood level f(x)``), ``"NAME: flag"`` for flags (:func:`is_flag`: no quantity), or the bare
    name for grids written before the ``quantity`` attribute; grids of a time-aware model
    append the quarter (``std_f: area: neighbourhood level f(x), 2023Q4``) or the trend's period
    (``change_per_year: latent mean f(x), change per year 2019Q4→2023Q4``)."""
    period = grid_period(ds)
    out = []
    for b in bands:
        q = "flag" if is_flag(ds, b) else ds[b].attrs.get("quantity")
        text = f"{b}: {q}" if q else b
        if period:
            text = f"{text}, {period}" if q else f"{text}: {period}"
        out.append(text)
    return out


def export_paths(
    rd: RunDir, target: str, *, quarter: str | None = None, trend: tuple[str, str] | None = None
) -> tuple[Path, Path]:
    """``(tif, sidecar)``: ``exports/TARGET.tif``, ``exports/TARGET_Q.tif`` (``quarter``) or
    ``exports/TARGET_trend_Q1_Q2.tif`` (``trend``), and the ``.json`` beside it."""
    if trend is not None:
        stem = f"{target}_trend_{trend[0]}_{trend[1]}"
    elif quarter is not None:
        stem = f"{target}_{quarter}"
    else:
        return rd.export_tif(target), rd.export_sidecar(target)
    folder = rd.export_tif(target).parent
    return folder / f"{stem}.tif", folder / f"{stem}.json"


@dataclass(frozen=True)
class ExportJob:
    """One output of ``geodbk export``, planned (its inputs checked) before anything is written:
    the GeoTIFF of one grid (a time-aware model's ``quarter`` or ``trend``, else
    ``grids/TARGET.nc``), or with ``stack`` the NetCDF stack of ``grids`` along time."""

    rd: RunDir
    target: str
    grids: tuple[Path, ...]
    quarter: str | None = None
    trend: tuple[str, str] | None = None
    stack: bool = False

    @property
    def fix(self) -> str:
        """The ``geodbk predict`` command that writes this job's grid."""
        base = f"geodbk predict --run {self.rd.root} --target {self.target}"
        if self.stack:
            return base
        if self.trend is not None:
            return f"{base} --trend {self.trend[0]}:{self.trend[1]}"
        return base if self.quarter is None else f"{base} --quarter {self.quarter}"


def _model_metadata(rd: RunDir, target: str) -> dict[str, Any]:
    """The metadata of ``target``'s ``model.json`` (raises with the train command if absent)."""
    model_json = read_json(require_model(rd, target) / "model.json")
    md = model_json.get("metadata", model_json)
    return md if isinstance(md, dict) else {}


def _grid_quarter(path: Path, fix: str) -> str | None:
    """The ``quarter`` attribute of a grid file."""
    q = grid_attrs(path, fix=fix).get("quarter")
    return str(q) if q is not None else None


def _find_quarter_grid(rd: RunDir, target: str, quarter: str) -> Path | None:
    """The grid of ``quarter``: ``grids/TARGET_Q.nc``, or ``grids/TARGET.nc`` when that one is
    of ``quarter`` (the latest table quarter); ``None`` when there is none."""
    path = rd.grid(target, quarter)
    if path.is_file():
        return path
    current = rd.grid(target)
    fix = f"geodbk predict --run {rd.root} --target {target}"
    if current.is_file() and _grid_quarter(current, fix) == quarter:
        return current
    return None


def _quarter_spec(quarters: list[str]) -> str:
    """Quarters as one ``--quarter`` value, consecutive ones as a range
    (``2022Q3:2023Q1,2023Q3``)."""
    idx = sorted(quarter_index(q) for q in quarters)
    parts: list[str] = []
    start = prev = idx[0]
    for i in [*idx[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        first, last = format_quarter(start), format_quarter(prev)
        parts.append(first if start == prev else f"{first}:{last}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _quarter_grids(rd: RunDir, target: str, quarters: list[str]) -> list[Path]:
    """The grid of each of ``quarters``, or raise naming every missing quarter and the one
    ``geodbk predict --quarter`` command that writes them all."""
    found = {q: _find_quarter_grid(rd, target, q) for q in quarters}
    missing = [q for q, path in found.items() if path is None]
    if missing:
        first = rd.grid(target, missing[0])
        where = f"{first} is missing" if len(missing) == 1 else f"{first} and others are missing"
        raise RunDirectoryError(
            f"no {target} grid of {', '.join(missing)} ({where}); nothing was exported. Run "
            f"`geodbk predict --run {rd.root} --target {target} --quarter "
            f"{_quarter_spec(missing)}` first"
        )
    return [p for p in found.values() if p is not None]


def _time_jobs(
    rd: RunDir,
    target: str,
    md: dict[str, Any],
    *,
    quarter: str | None,
    trend: tuple[str, str] | None,
) -> list[ExportJob]:
    """The GeoTIFF jobs of a time-aware model's ``quarter`` spec or ``trend``."""
    if trend is not None:
        grid = rd.trend_grid(target, *trend)
        if not grid.is_file():
            raise RunDirectoryError(
                f"{grid} is missing; run `geodbk predict --run {rd.root} --target {target} "
                f"--trend {trend[0]}:{trend[1]}` first"
            )
        return [ExportJob(rd, target, (grid,), trend=trend)]
    quarters = resolve_quarters(quarter, observed=md.get("quarters") or [])
    grids = _quarter_grids(rd, target, quarters)
    return [ExportJob(rd, target, (g,), quarter=q) for q, g in zip(quarters, grids, strict=True)]


def _stack_job(rd: RunDir, target: str, *, quarter: str | None, only: bool) -> ExportJob:
    """The job of ``exports/TARGET_quarters.nc``: the grids of ``quarter`` (a time-aware model;
    default every quarter of the table that has a grid) or the pooled grid."""
    md = _model_metadata(rd, target)
    predict = f"geodbk predict --run {rd.root} --target {target}"
    if time_scaling_of(md) is None:
        if quarter is not None:
            raise DataError(
                f"--quarter needs a time-aware model, but {rd.model_dir(target)} pools all "
                f"quarters; export its pooled grid with --format netcdf and no --quarter"
            )
        grids = [rd.grid(target)]
    else:
        observed = md.get("quarters") or []
        wanted = resolve_quarters(quarter or "all", observed=observed)
        if quarter is None:  # every quarter of the table that has a grid
            have = [q for q in wanted if rd.grid(target, q).is_file()]
            current = rd.grid(target)
            latest = _grid_quarter(current, predict) if current.is_file() else None
            wanted = [q for q in wanted if q in have or q == latest]
        grids = _quarter_grids(rd, target, wanted) if wanted else []
    if not grids or not grids[0].is_file():
        raise RunDirectoryError(
            f"{rd.grid(target)} is missing; run `{predict}` first"
            + ("" if only else " (or export one target with --target)")
        )
    check_same_quantity(grids, predict=predict)
    return ExportJob(rd, target, tuple(grids), stack=True)


def plan_export(
    run: str | Path,
    *,
    target: str | None = None,
    fmt: str = "gtiff",
    quarter: str | None = None,
    trend: str | None = None,
) -> list[ExportJob]:
    """Check everything an export of ``run`` reads (run, models, every grid, each grid
    predicted from the current model) and return the files to write, without writing any: a
    missing or stale input stops the export before its first file. A model trained on an
    earlier ingest is only warned about, as in ``predict`` and ``report``. The parameters and
    errors are :func:`run_export`'s."""

    jobs = _plan_jobs(run, target=target, fmt=fmt, quarter=quarter, trend=trend)
    models: dict[tuple[Path, str], dict[str, Any]] = {}
    for job in jobs:
        key = (job.rd.root, job.target)
        if key not in models:  # each model read and judged once
            models[key] = _model_metadata(job.rd, job.target)
            if stale := stale_model_message(job.rd, job.target, models[key]):
                log.warning("%s", stale)
        _require_current_grids(job, models[key])
    return jobs


def stale_grid_reason(attrs: dict[str, Any], md: dict[str, Any]) -> str | None:
    """Why a grid with attributes ``attrs`` was not predicted from the model with metadata
    ``md``, or ``None``: its recorded ``model_config_hash`` differs from the model's config
    hash, or its recorded ``model_created`` from the model's ``created`` (grids written before
    that record: the model was trained after the grid was written). Grids or models without
    these records are not judged."""
    recorded = attrs.get("model_config_hash")
    current = model_config_hash(md)
    if recorded and str(recorded) != current:
        return (
            f"it was predicted from a model with config hash {recorded}, the model now has "
            f"{current}"
        )
    recorded_model = str(attrs.get("model_created") or "")
    if recorded_model and md.get("created") and recorded_model != str(md["created"]):
        return (
            f"it was predicted from a model trained at {recorded_model}, the model now was "
            f"trained at {md['created']}"
        )
    made, trained = _timestamp(attrs.get("created")), _timestamp(md.get("created"))
    if not recorded_model and made is not None and trained is not None and trained > made:
        return (
            f"the model was trained at {md.get('created')}, after the grid was written at "
            f"{attrs.get('created')}"
        )
    return None


def _timestamp(value: Any) -> datetime | None:
    """An ISO 8601 ``created`` value as an aware datetime (UTC when it names no zone), or
    ``None`` when absent or unreadable."""
    try:
        stamp = datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _require_current_grids(job: ExportJob, md: dict[str, Any]) -> None:
    """Raise when a grid of ``job`` is older than its model (:func:`stale_grid_reason`),
    naming the grid and the ``geodbk predict`` command that writes it again."""
    stale: list[tuple[Path, str, dict[str, Any]]] = []
    for grid in job.grids:
        attrs = grid_attrs(grid, fix=job.fix)
        reason = stale_grid_reason(attrs, md)
        if reason is not None:
            stale.append((grid, reason, attrs))
    if not stale:
        return
    grid, reason, _ = stale[0]
    fix = job.fix
    quarters = [str(a["quarter"]) for _, _, a in stale if int(a.get("time_aware", 0) or 0) == 1]
    if job.stack and len(quarters) == len(stale):
        fix = f"{fix} --quarter {_quarter_spec(quarters)}"
    more = f" (and {len(stale) - 1} more of its grids)" if len(stale) > 1 else ""
    raise RunDirectoryError(
        f"{grid}{more} is older than the {job.target} model in {job.rd.model_dir(job.target)}: "
        f"{reason}; its export would show the old model's map under the new model's name. "
        f"Run `{fix}` first"
    )


def _plan_jobs(
    run: str | Path,
    *,
    target: str | None,
    fmt: str,
    quarter: str | None,
    trend: str | None,
) -> list[ExportJob]:
    """:func:`plan_export` without the check of the grids against their models."""
    if quarter is not None and trend is not None:
        raise DataError("give --quarter or --trend, not both")
    if fmt == "netcdf" and trend is not None:
        raise DataError(
            "--format netcdf stacks quarter grids; a trend is one map: export it with "
            "--format gtiff or cog"
        )
    rd = require_run(run)
    if target is not None:
        target_spec(target)
    targets = [target] if target else rd.trained_targets()
    if not targets:
        raise ModelFileError(
            f"no trained model in {rd.root / 'models'}; run `geodbk train --run {rd.root} "
            "--target download` first"
        )
    if fmt == "netcdf":
        return [_stack_job(rd, t, quarter=quarter, only=target is not None) for t in targets]
    jobs: list[ExportJob] = []
    if quarter is None and trend is None:
        for t in targets:
            require_model(rd, t)
            if target is not None:
                grid = require_grid(rd, t)
            elif not rd.grid(t).is_file():
                raise RunDirectoryError(
                    f"{rd.grid(t)} is missing for trained target {t}; run "
                    f"`geodbk predict --run {rd.root} --target {t}` first"
                )
            else:
                grid = rd.grid(t)
            jobs.append(ExportJob(rd, t, (grid,)))
        return jobs
    pair = parse_trend(trend) if trend is not None else None
    flag = "--quarter" if quarter is not None else "--trend"
    for t in targets:
        md = _model_metadata(rd, t)
        if time_scaling_of(md) is None:
            msg = (
                f"{flag} needs a time-aware model, but {rd.model_dir(t)} pools all quarters "
                f"(trained without --time); retrain with `geodbk train --run {rd.root} "
                f"--target {t} --time`"
            )
            if target is not None:
                raise DataError(msg)
            log.warning("skipping %s: %s", t, msg)
            continue
        jobs += _time_jobs(rd, t, md, quarter=quarter, trend=pair)
    if not jobs:
        raise DataError(
            f"{flag}: no trained target of {rd.root} is time-aware; retrain with "
            f"`geodbk train --run {rd.root} --target TARGET --time`"
        )
    return jobs


def write_export(job: ExportJob, *, fmt: str = "gtiff") -> Path:
    """Write one planned export (:func:`plan_export`); return its path.

    Runs under the run's target lock (:func:`pipelines.rundir.target_lock`) and first removes
    what a killed export of the same file left behind.
    """
    with target_lock(job.rd, job.target, stage="export"):
        if job.stack:
            return _write_stack(job)
        return _write_tif(job, fmt=fmt)


def _write_tif(job: ExportJob, *, fmt: str) -> Path:
    """The GeoTIFF and sidecar of one grid (:func:`write_export` holds the lock)."""
    rd, target, quarter, trend = job.rd, job.target, job.quarter, job.trend
    (grid_path,) = job.grids
    model_dir = require_model(rd, target)
    tif, sidecar = export_paths(rd, target, quarter=quarter, trend=trend)
    sweep_spools(tif)
    md = _model_metadata(rd, target)
    with open_grid(grid_path, fix=job.fix, decode_coords="all", chunks={"y": 1024}) as ds:
        log.info("read %s", grid_path)
        bands = grid_variables(ds)
        time_keys = ("time_aware", "quarter", "quarter_status", "product")
        time_info = {k: _plain(ds.attrs[k]) for k in time_keys if k in ds.attrs}
        if ds.attrs.get("product") == "trend":
            for k in ("first_quarter", "last_quarter", "years"):
                time_info[k] = _plain(ds.attrs.get(k))
        licence = (
            {k: str(ds.attrs.get(k, "")) for k in LICENCE_KEYS}
            if "license" in ds.attrs
            else run_licence_attrs(rd)
        )
        provenance = {
            "run": rd.root.resolve().name,
            "target": target,
            "model": rd.relative(model_dir),
            "config_hash": ds.attrs.get("model_config_hash") or md.get("config_hash"),
            "config": md.get("config"),
            "grid": rd.relative(grid_path),
            "grid_created": ds.attrs.get("created"),
            "bands": bands,
            "units": dict(zip(bands, band_units(ds, bands), strict=True)),
            "long_names": {b: str(ds[b].attrs.get("long_name", "")) for b in bands},
            "quantity": ds.attrs.get("quantity"),
            "band_descriptions": band_descriptions(ds, bands),
            "nodata": DEFAULT_NODATA,
            # how often the tile quantity's interval held held-out tiles' levels (the report)
            "held_out_check": held_out_check(
                rd,
                target,
                quantity=ds.attrs.get("quantity"),
                model_created=ds.attrs.get("model_created"),
            ),
            "format": fmt,
            "crs": "EPSG:4326",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "geodbk_version": __version__,
            **licence,
            **time_info,
        }
        tags = {
            "geodbk_target": target,
            "geodbk_run": provenance["run"],
            "geodbk_config_hash": str(provenance["config_hash"]),
            "geodbk_version": __version__,
            **{k: v for k, v in licence.items() if v},
            **{f"geodbk_{k}": str(v) for k, v in time_info.items()},
            **{
                f"geodbk_{k}": str(ds.attrs[k])
                for k in ("quantity", "quantity_description")
                if k in ds.attrs
            },
            **held_out_tags(provenance["held_out_check"]),
        }
        if provenance["quantity"] == "tile" and provenance["held_out_check"] is None:
            log.info(
                "%s: no held-out check of this training's map to record (run `geodbk report "
                "--run %s --target %s`, then export again, to carry it in the tags and sidecar)",
                tif,
                rd.root,
                target,
            )
        _warn_replacing_quantity(
            rd, target, sidecar, tif, quantity=provenance["quantity"], quarter=quarter
        )
        # the sidecar is written first and moved into place right after the GeoTIFF: a
        # failure (a full disk) leaves the earlier pair as it was
        with atomic_path(sidecar) as sidecar_tmp:
            sidecar_tmp.write_text(json_text(provenance), encoding="utf-8")
            write_geotiff(
                ds,
                tif,
                variables=bands,
                fmt=fmt,
                tags=tags,
                descriptions=provenance["band_descriptions"],
                units=band_units(ds, bands),
                band_tags=band_tags(ds, bands),
            )
    log.info("wrote %s (%d bands, %s) and %s", tif, len(bands), fmt, sidecar)
    return tif


def _warn_replacing_quantity(
    rd: RunDir, target: str, sidecar: Path, tif: Path, *, quantity: Any, quarter: str | None
) -> None:
    """Warn when ``tif`` (as its ``sidecar`` records) maps another quantity than the grid
    now exported, which replaces it, naming both and the command that maps the old one
    (with ``--quarter`` for the export of one quarter)."""
    if not quantity or not sidecar.is_file():
        return
    try:
        old = json.loads(sidecar.read_text(encoding="utf-8")).get("quantity")
    except (OSError, ValueError, AttributeError):
        return
    if old and old != quantity:
        log.warning(
            "%s holds the %s quantity's map; it is replaced by the %s quantity's (copy it "
            "first to keep it; `geodbk predict --run %s --target %s%s --quantity %s` and "
            "`geodbk export` write it again)",
            tif,
            old,
            quantity,
            rd.root,
            target,
            f" --quarter {quarter}" if quarter else "",
            old,
        )


def _plain(value: Any) -> Any:
    """A NetCDF attribute as a JSON value (numpy scalars to Python numbers)."""
    return value.item() if hasattr(value, "item") else value


def _write_stack(job: ExportJob) -> Path:
    """``exports/TARGET_quarters.nc``: the job's grids along a CF time dimension
    (:func:`pipelines.timestack.write_time_stack`; :func:`write_export` holds the lock)."""
    rd, target, grids = job.rd, job.target, list(job.grids)
    out = rd.export_tif(target).parent / f"{target}_quarters.nc"
    with open_grid(grids[0], fix=job.fix) as first, open_grid(grids[-1], fix=job.fix) as last:
        span = f"{first.attrs.get('quarter', '?')}–{last.attrs.get('quarter', '?')}"
        quantity = str(last.attrs.get("quantity", ""))
        if len(grids) == 1:
            span = str(last.attrs.get("quarter", "?"))
    attrs = {
        "title": f"geodbk {target} predictive grids by quarter, {span}",
        "product": "quarters",
        "quarter": span,
        "quarter_status": "per time step: the quarter_status coordinate",
        "source_grids": " ".join(rd.relative(g) for g in grids),
        "geodbk_version": __version__,
    }
    _warn_replacing_stack(out, span, quantity=quantity)
    write_time_stack(out, grids, attrs=attrs)
    log.info("wrote %s (%d time steps)", out, len(grids))
    return out


def _warn_replacing_stack(out: Path, span: str, *, quantity: str) -> None:
    """Warn when the stack ``out`` holds other quarters than ``span`` or another quantity
    than ``quantity``, those of the stack now written, which replaces it (``--quarter`` of
    fewer quarters, or grids mapped again with ``predict --quantity``)."""
    if not out.is_file():
        return
    try:
        attrs = grid_attrs(out, fix="geodbk export --format netcdf")
        before, was = str(attrs.get("quarter", "")), str(attrs.get("quantity", ""))
    except DataError:  # an unreadable stack is replaced without a word on what it held
        return
    if (before and before != span) or (was and quantity and was != quantity):
        log.warning(
            "%s holds the stack of %s (%s quantity); it is replaced by that of %s (%s "
            "quantity; copy it first to keep it)",
            out,
            before,
            was,
            span,
            quantity,
        )


def run_export(
    run: str | Path,
    *,
    target: str | None = None,
    fmt: str = "gtiff",
    quarter: str | None = None,
    trend: str | None = None,
) -> list[Path]:
    """Export ``target`` (or every trained target) of ``run``; return the written files.

    Every input is checked first (:func:`plan_export`): a missing grid of any target or
    quarter stops the export before it writes its first file.

    Parameters
    ----------
    run
        Run directory.
    target
        One target; ``None``: every trained target.
    fmt
        ``gtiff``, ``cog`` or ``netcdf`` (one NetCDF-4 file of the quarters' grids along a
        time dimension).
    quarter
        Time-aware models: quarter(s) whose grids to export (``2023Q2``, ``2022Q1:2023Q4``,
        ``all``) to ``exports/TARGET_Q.tif``; every quarter asked for needs its grid.
    trend
        Time-aware models: ``Q1:Q2``, the trend grid to export to
        ``exports/TARGET_trend_Q1_Q2.tif``.

    Raises
    ------
    RunDirectoryError
        Missing run directory or grid (with the predict command to run; a quarter spec names
        every missing quarter), or a grid predicted from an earlier model
        (:func:`stale_grid_reason`).
    ModelFileError
        ``target`` untrained, or no target trained at all.
    DataError
        ``quarter``/``trend`` for a pooled model (with ``--all``: when no target is
        time-aware; pooled targets are skipped with a warning), or both given.
    """
    jobs = plan_export(run, target=target, fmt=fmt, quarter=quarter, trend=trend)
    return [write_export(job, fmt=fmt) for job in jobs]
