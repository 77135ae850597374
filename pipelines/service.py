"""``geodbk service``: the probability of each service class (BEAD tiers) per cell or place.

From a run's download, upload and latency models, for the typical speed at each place (the
``tile`` quantity; ``--quantity area`` or ``test`` for the others), the probability of meeting
each tier -- download and upload at or above the tier's speeds AND latency at or below
``--latency-ms`` -- with the three targets joined by a Gaussian copula estimated from the
models' validation residuals (:mod:`pipelines.copula`), and from those the probability of each
class (default BEAD tiers 25/3 and 100/20 Mbps with 100 ms: unserved, underserved, served;
:mod:`geodbk.service`).

Writes into ``RUN/service/``:

- ``classes.nc``: the grid of ``geodbk predict`` (same resolution and extent options) with
  ``p_unserved``, ``p_underserved``, ``p_served`` (other tier lists: ``p_<class>`` of
  :func:`geodbk.service.class_names`), ``p_tier_<j>`` (probability of meeting tier j),
  ``service_class`` (int8 code of the most probable class, CF ``flag_values`` /
  ``flag_meanings``, -1 outside the region) and ``in_region``; attributes: tiers, latency,
  quantity and its description, the copula's correlation, quarter, licence;
- ``service_class.tif`` (uint8, 255 outside the region; a colour table from red, unserved, to
  green, served, and the classes as band tags ``flag_values``/``flag_meanings`` and as GDAL
  category names in ``service_class.tif.aux.xml``, which QGIS shows as the legend) and
  ``p_unserved.tif`` (float32, units 1, -9999 outside), GeoTIFF or COG, with the licence and
  quantity in their tags;
- ``headline.json``: the area and tile shares of each class with joint intervals, and the
  classes' check on held-out tiles (:mod:`pipelines.service_check`; a sentence of it in the
  grid's attributes and the rasters' tags too);
- ``classes_<file stem>.parquet`` with ``--at FILE`` instead of the grid;
- ``copula.json``: the grid set's copula: its correlation, the rows it came from and how
  (``--at``: in the file's metadata instead).

A time-aware model's map is of the table's latest quarter, or of ``--quarter Q``. A quarter
other than the latest and a quantity other than ``tile`` add ``_Q`` and ``_QUANTITY`` to every
name (``classes_2022Q4_area.nc``, ``service_class_2022Q4_area.tif``,
``classes_<file stem>_2022Q4_area.parquet``), so that no map replaces another's
(:func:`geodbk.geo.contract.output_name`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geodbk import __version__
from geodbk.atomic import atomic_write_json, staged_folder
from geodbk.errors import DataError
from geodbk.geo.contract import output_name, service_headline
from geodbk.geo.geotiff import DEFAULT_NODATA, band_tags, write_geotiff
from geodbk.geo.grids import DEFAULT_MAX_CELLS, block_rows_for
from geodbk.geo.locations import read_locations
from geodbk.geo.timeaxis import format_quarter, quarter_index
from geodbk.quantities import DEFAULT_MAP_QUANTITY
from geodbk.service import BEAD_TIERS, DEFAULT_LATENCY_MS, Tier
from geodbk.service import class_colours as palette
from pipelines.cli import add_progress_option, call_with_options, stage_parser
from pipelines.gridfile import sweep_spools
from pipelines.predict import (
    _write_grid,
    add_grid_options,
    add_quantity_option,
    check_grid_options,
    map_grid,
)
from pipelines.predict_at import places_source
from pipelines.run_inputs import observed_quarters, region_area_caveat
from pipelines.rundir import (
    RunDir,
    require_run,
    run_licence_attrs,
    target_lock,
)
from pipelines.service_at import write_classes_at
from pipelines.service_check import held_out_check_sentence, with_held_out_check
from pipelines.service_classes import (
    SERVICE_QUANTITY_LABEL,
    Service,
    load_service,
    resolve_tiers,
)
from pipelines.service_headline import HEADLINE_SAMPLES, write_headline

log = logging.getLogger("geodbk")

__all__ = ["CLASS_NODATA", "register", "run_service", "service_dir"]

#: Lock name of the stage (``RUN/.locks/service.lock``).
LOCK = "service"
#: ``service_class`` outside the region: -1 in the grid, 255 in the GeoTIFF.
CLASS_FILL = -1
CLASS_NODATA = 255

EPILOG = """\
examples:
  geodbk service --run runs/hawaii                      # BEAD tiers 25/3, 100/20 Mbps, 100 ms
  geodbk service --run runs/hawaii --format cog
  geodbk service --run runs/hawaii --tiers 10/1,25/3,100/20 --latency-ms 50
  geodbk service --run runs/hawaii --quantity area      # the neighbourhood level f(x)
  geodbk service --run runs/hawaii --at locations.csv   # at a list of places
  geodbk service --run runs/hawaii --quarter 2022Q4     # time-aware models

Needs the download, upload and latency models (`geodbk train --run RUN --target T` for each).
A place meets a tier when download >= DOWN and upload >= UP Mbps and latency <= --latency-ms;
unserved = meets no tier, underserved = meets the first but not the second, served = meets the
second. The three targets are joined by a Gaussian copula of the models' residuals on the
validation split (RUN/service/copula.json). Writes RUN/service/classes.nc (p_unserved,
p_underserved, p_served, p_tier_1, p_tier_2, service_class, in_region), service_class.tif,
p_unserved.tif and headline.json, or with --at RUN/service/classes_<file stem>.parquet. Another
quarter than the latest and another quantity than tile add _QUARTER and _QUANTITY to each name
(classes_2022Q4_area.nc, classes_<file stem>_area.parquet): no map replaces another's.
Each output also says how the classes fared on the run's test tiles: the class of each
tile's tests-weighted levels against the map's expected share of each class (headline.json
held_out_check, a sentence in the grid's attributes and the GeoTIFF tags, the report).
exit codes: 0 ok, 2 usage, 3 bad option or data (--tiers, --latency-ms, --at file), 4 damaged
model, 5 missing run directory or model (the message gives the train command).
"""


def register(subparsers: Any) -> None:
    """Add the ``service`` sub-command."""
    p = stage_parser(
        subparsers,
        "service",
        _main,
        description=(
            "Probability that each cell (or each place of a file) is unserved, underserved or\n"
            "served: download AND upload at the tiers' speeds AND latency at most --latency-ms,\n"
            "from the three models joined by a copula of their validation residuals."
        ),
        epilog=EPILOG,
        run="run directory",
    )
    p.add_argument(
        "--tiers",
        default=",".join(t.label for t in BEAD_TIERS),
        metavar="D/U,...",
        help="nested speed tiers DOWN/UP in Mbps, lowest first (default %(default)s: the BEAD "
        "tiers; below the first = unserved, below the second = underserved)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=DEFAULT_LATENCY_MS,
        metavar="MS",
        help="latency at or below which a place can count as served at any tier "
        "(default %(default)g)",
    )
    add_quantity_option(
        p,
        "what the classes are of: tile (default) = the typical speed of the zoom-16 tile "
        "at the place; area = the neighbourhood level f(x); test = one speed test",
    )
    p.add_argument(
        "--at",
        type=Path,
        default=None,
        metavar="FILE",
        help="classes at the places of a parquet/CSV/Excel/GeoJSON/GeoPackage/shapefile-zip file (a 'quadkey' column, "
        "'lon'/'lat' columns or point geometries) instead of a grid; writes "
        "service/classes_<file stem>.parquet with the file's own columns kept",
    )
    p.add_argument(
        "--quarter",
        default=None,
        metavar="Q",
        help="time-aware models: the quarter to classify, e.g. 2023Q2 (default: the table's "
        "latest)",
    )
    add_grid_options(p, verb="write")
    p.add_argument(
        "--format",
        dest="fmt",
        choices=["gtiff", "cog"],
        default="gtiff",
        help="GeoTIFF (default) or Cloud-Optimised GeoTIFF for the two rasters",
    )
    p.add_argument(
        "--headline-samples",
        type=int,
        default=HEADLINE_SAMPLES,
        metavar="S",
        help="joint posterior samples of the headline shares of area and tiles in each class "
        "(service/headline.json; default %(default)s; 0 skips them)",
    )
    add_progress_option(p)


def _main(args: argparse.Namespace) -> int:
    call_with_options(run_service, args)
    return 0


def service_dir(rd: RunDir) -> Path:
    """``RUN/service``."""
    return rd.root / "service"


def _other_quarter(rd: RunDir, service: Service, quarter: str | None) -> str | None:
    """``quarter`` as ``2022Q4`` when it is not the table's latest (time-aware models), else
    None: the quarter a file name carries (:func:`geodbk.geo.contract.output_name`)."""
    if quarter is None:
        return None
    label = format_quarter(quarter_index(quarter))
    latest = {observed_quarters(rd, p.metadata)[-1] for p in service.predictors.values()}
    return None if latest == {label} else label


def _suffix(rd: RunDir, service: Service, quarter: str | None) -> str:
    """What the grid set's names add to ``classes``: ``_Q`` for a quarter other than the
    latest, ``_QUANTITY`` for a quantity other than ``tile`` (``classes_2022Q4_area.nc``)."""
    return output_name("", quarter=_other_quarter(rd, service, quarter), quantity=service.quantity)


def _variables(service: Service) -> dict[str, tuple[Any, dict[str, Any]]]:
    """The grid's variables (``in_region`` is added by the writer)."""
    label = SERVICE_QUANTITY_LABEL[service.quantity]
    names = service.classes
    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    for name, text in zip(names, service.class_descriptions(), strict=True):
        out[f"p_{name}"] = (
            np.float32,
            {"long_name": f"P({name}): {text}", "units": "1", "quantity": label},
        )
    for j, tier in enumerate(service.tiers, start=1):
        out[f"p_tier_{j}"] = (
            np.float32,
            {
                "long_name": (
                    f"P(tier {j} met: download >= {tier.down_mbps:g} Mbps, upload >= "
                    f"{tier.up_mbps:g} Mbps, latency <= {service.latency_ms:g} ms)"
                ),
                "units": "1",
                "tier": tier.label,
                "quantity": label,
            },
        )
    out["service_class"] = (
        np.int8,
        {
            "long_name": "most probable service class",
            "flag_values": np.arange(len(names), dtype=np.int8),
            "flag_meanings": " ".join(names),
            "_FillValue": CLASS_FILL,
            "quantity": label,
        },
    )
    return out


def _common_attrs(rd: RunDir, service: Service) -> dict[str, Any]:
    """Attributes of the grid: the service's, the run's licence and provenance."""
    return {
        "title": f"geodbk service classes ({service.tier_labels} Mbps, {service.quarter})",
        "product": "service_classes",
        **service.attributes(rd),
        **(
            {"held_out_check": said}
            if (said := held_out_check_sentence(service.held_out_check))
            else {}
        ),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        **run_licence_attrs(rd),
    }


def _write_classes_grid(
    rd: RunDir,
    service: Service,
    out: Path,
    grid_options: dict[str, Any],
    *,
    progress: bool = True,
) -> Path:
    """Evaluate the classes on ``geodbk predict``'s grid (``grid_options``: the keyword
    arguments of :func:`pipelines.predict.map_grid`) and write ``out`` (NetCDF)."""
    variables = _variables(service)
    geom, grid = map_grid(rd, **grid_options, n_vars=len(variables) + 1)
    attrs = {
        **_common_attrs(rd, service),
        "resolution_deg": [grid.dx, grid.dy],
        "extent": grid_options["extent"],
    }
    log.info("service classes (%s Mbps, latency <= %g ms)", service.tier_labels, service.latency_ms)
    return _write_grid(
        out,
        grid,
        geom,
        block_rows=block_rows_for(grid.shape[1]),
        variables=variables,
        attrs=attrs,
        evaluate=service.predict,
        progress=progress,
    )


def _raster_tags(rd: RunDir, grid_attrs: dict[str, Any]) -> dict[str, str]:
    """GeoTIFF tags: the licence, the quantity, the tiers, the copula and provenance."""
    keys = (
        "quantity",
        "quantity_description",
        "tiers",
        "latency_ms",
        "classes",
        "quarter",
        "quarter_status",
        "copula_targets",
        "copula_rows",
        "held_out_check",
        "created",
    )
    tags = {f"geodbk_{k}": str(grid_attrs[k]) for k in keys if k in grid_attrs}
    corr = np.asarray(grid_attrs.get("copula_correlation", []), dtype=np.float64)
    tags["geodbk_copula_correlation"] = " ".join(f"{v:.6g}" for v in corr.ravel())
    tags["geodbk_run"] = rd.root.resolve().name
    tags["geodbk_version"] = __version__
    licence = {k: str(grid_attrs.get(k, "")) for k in ("source", "license", "license_url")}
    licence["license_terms"] = str(grid_attrs.get("license_terms", ""))
    return {**tags, **{k: v for k, v in licence.items() if v}}


def class_colours(n_classes: int) -> dict[int, tuple[int, int, int, int]]:
    """The colour table of ``service_class.tif``: :func:`geodbk.service.class_colours` (the
    dashboard's), and :data:`CLASS_NODATA` transparent."""
    return {**palette(n_classes), CLASS_NODATA: (0, 0, 0, 0)}


def _export_rasters(
    rd: RunDir, grid_path: Path, *, folder: Path, suffix: str, fmt: str
) -> list[Path]:
    """``service_class{suffix}.tif`` (uint8, with a colour table, the classes as band tags and
    as GDAL category names in ``service_class{suffix}.tif.aux.xml``) and
    ``p_unserved{suffix}.tif`` (float32) from the grid into ``folder``, with the licence and
    quantity in their tags and band descriptions."""
    written = []
    with xr.open_dataset(grid_path, decode_coords="all", chunks={"y": 1024}) as ds:
        tags = _raster_tags(rd, dict(ds.attrs))
        label = str(ds.attrs.get("quantity_label", ds.attrs.get("quantity", "")))
        names = str(ds.attrs["classes"]).split()
        codes = ", ".join(f"{i} {n}" for i, n in enumerate(names))
        flags = {
            "flag_values": " ".join(str(i) for i in range(len(names))),
            "flag_meanings": " ".join(names),
        }
        bands: dict[str, dict[str, Any]] = {
            "service_class": {
                "descriptions": [f"service_class: most probable class ({codes}); {label}"],
                "dtype": "uint8",
                "nodata": CLASS_NODATA,
                "units": [""],
                "band_tags": [{**band_tags(ds, ["service_class"])[0], **flags}],
                "colormap": class_colours(len(names)),
                "category_names": names,
            },
            "p_unserved": {
                "descriptions": [f"p_unserved: P(unserved); {label}"],
                "dtype": "float32",
                "nodata": DEFAULT_NODATA,
                "units": ["1"],
                "band_tags": band_tags(ds, ["p_unserved"]),
            },
        }
        for name, options in bands.items():
            tif = folder / f"{name}{suffix}.tif"
            write_geotiff(
                ds,
                tif,
                variables=[name],
                fmt=fmt,
                tags={**tags, "geodbk_band": name},
                **options,
            )
            log.info("wrote %s (%s)", tif, fmt)
            written.append(tif)
    return written


class _FinalNames(logging.Filter):
    """Names a staged file by the path it is moved to, in the messages of the ``geodbk``
    logger: the staging folder is gone once the set is in place."""

    def __init__(self, stage: Path, final: Path) -> None:
        super().__init__()
        self.stage, self.final = str(stage), str(final)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.stage in message:
            record.msg, record.args = message.replace(self.stage, self.final), ()
        return True


@contextlib.contextmanager
def _final_names_in_logs(stage: Path, final: Path) -> Iterator[None]:
    """While a set is written into ``stage``, log its files under ``final`` (their paths once
    :func:`geodbk.atomic.staged_folder` has moved them)."""
    names = _FinalNames(stage, final)
    log.addFilter(names)
    try:
        yield
    finally:
        log.removeFilter(names)


def _write_grid_set(
    rd: RunDir,
    service: Service,
    copula: dict[str, Any],
    *,
    suffix: str,
    fmt: str,
    headline_samples: int,
    grid_options: dict[str, Any],
    progress: bool = True,
) -> Path:
    """Write the class grid, its two rasters, the headline and the copula into ``RUN/service``
    as one set (staged, then moved in together: a failure leaves the earlier set whole);
    return the grid's final path."""
    folder = service_dir(rd)
    final_grid = folder / f"classes{suffix}.nc"
    _warn_replacing_other_tiers(final_grid, service)
    for name in (final_grid.name, f"service_class{suffix}.tif", f"p_unserved{suffix}.tif"):
        sweep_spools(folder / name)  # what a writer killed before the staged sets left
    with staged_folder(folder) as stage, _final_names_in_logs(stage, folder):
        grid = _write_classes_grid(
            rd, service, stage / final_grid.name, grid_options, progress=progress
        )
        _export_rasters(rd, grid, folder=stage, suffix=suffix, fmt=fmt)
        if headline_samples:
            headline = write_headline(
                rd,
                service,
                grid,
                stage / service_headline(final_grid.name),
                samples=headline_samples,
                grid_name=final_grid,
            )
            log.info(
                "share of area %s",
                ", ".join(
                    f"{c} {100 * v['mean']:.1f}% (90%: {100 * v['lower']:.1f}-"
                    f"{100 * v['upper']:.1f}%)"
                    for c, v in ((c, headline["area"][c]) for c in service.classes)
                ),
            )
            if caveat := region_area_caveat(rd):
                log.warning("%s", caveat)
        atomic_write_json(stage / f"copula{suffix}.json", copula)
    old_headline = folder / service_headline(final_grid.name)
    if not headline_samples and old_headline.is_file():
        old_headline.unlink()  # it described the earlier classes grid
        log.info("removed %s (no headline asked for this grid)", old_headline)
    return final_grid


def _warn_replacing_other_tiers(grid: Path, service: Service) -> None:
    """Warn when ``grid`` holds the classes of other tiers or another latency, which the new
    set replaces (the grid set's names carry the quarter and the quantity, not the tiers)."""
    if not grid.is_file():
        return
    try:
        with xr.open_dataset(grid) as ds:
            tiers, latency = str(ds.attrs.get("tiers", "")), ds.attrs.get("latency_ms")
    except (OSError, ValueError):
        return
    new = (service.tier_labels, float(service.latency_ms))
    if tiers and latency is not None and (tiers, float(latency)) != new:
        log.warning(
            "%s holds the classes of tiers %s Mbps with latency <= %g ms; they are replaced by "
            "those of %s Mbps with latency <= %g ms (copy RUN/service first to keep both)",
            grid,
            tiers,
            float(latency),
            *new,
        )


def run_service(
    run: str | Path,
    *,
    tiers: str | Sequence[Tier] = BEAD_TIERS,
    latency_ms: float = DEFAULT_LATENCY_MS,
    quantity: str = DEFAULT_MAP_QUANTITY,
    at: str | Path | None = None,
    quarter: str | None = None,
    resolution: float | None = None,
    tile_zoom: int | None = None,
    max_cells: int = DEFAULT_MAX_CELLS,
    extent: str = "tiles",
    force: bool = False,
    fmt: str = "gtiff",
    headline_samples: int = HEADLINE_SAMPLES,
    progress: bool = True,
) -> Path:
    """Write the service classes of ``run`` (see the module docstring); return the grid's
    path, or the parquet's with ``at``.

    Parameters
    ----------
    run
        Run directory with trained download, upload and latency models.
    tiers
        Nested tiers, ``"25/3,100/20"`` or :class:`geodbk.service.Tier`\\ s (default BEAD).
    latency_ms
        Latency a place must not exceed to meet any tier.
    quantity
        ``tile`` (default: the typical speed at the tile), ``area`` or ``test``.
    at
        A file of places (:func:`geodbk.geo.locations.read_locations`) instead of the grid.
    quarter
        Time-aware models: the quarter (default the table's latest); pooled models refuse it.
    resolution, tile_zoom, max_cells, extent, force
        The grid, as for :func:`pipelines.predict.run_predict`.
    fmt
        ``gtiff`` or ``cog`` for the rasters.
    headline_samples
        Joint samples of the headline shares (``service/headline{suffix}.json``,
        :func:`pipelines.service_headline.write_headline`); 0 skips them. Grid only.
    progress
        A progress bar over the grid's blocks (only when stderr is a terminal).

    Raises
    ------
    DataError
        Bad tiers, latency, quantity, grid options, ``at`` file or quarter; too few validation
        rows for the copula.
    RunDirectoryError
        No run directory, or a missing model (each named with its ``geodbk train`` command).
    """
    resolve_tiers(tiers, latency_ms)
    if fmt not in ("gtiff", "cog"):
        raise DataError(f"--format must be gtiff or cog, got {fmt!r}")
    if not 0 <= headline_samples <= 100_000:
        raise DataError(
            f"--headline-samples must be between 0 and 100000 (e.g. 500), got {headline_samples}"
        )
    if quarter is not None and ("," in quarter or ":" in quarter):
        raise DataError(f"--quarter takes one quarter (e.g. 2023Q4), got {quarter!r}")
    grid_options: dict[str, Any] = {}  # the grid's: map_grid's keyword arguments
    if at is None:
        grid_options = check_grid_options(
            resolution=resolution,
            tile_zoom=tile_zoom,
            max_cells=max_cells,
            extent=extent,
            force=force,
        )
    rd = require_run(run)
    places = None
    if at is not None:
        places = read_locations(at)
    with target_lock(rd, LOCK, stage="service"):
        service = load_service(
            rd, tiers=tiers, latency_ms=latency_ms, quantity=quantity, quarter=quarter
        )
        service = with_held_out_check(service, rd)
        if places is not None and at is not None:
            out = write_classes_at(  # the copula in its metadata; copula.json is the grid's
                rd,
                service,
                places,
                stem=Path(at).stem,
                quarter=_other_quarter(rd, service, quarter),
                source=places_source(Path(at)),
            )
            log.info("wrote %s", out)  # the grid's writer names classes.nc itself
        else:
            copula = {
                **service.copula.to_dict(),
                "models": {t: rd.relative(rd.model_dir(t)) for t in service.predictors},
                "quarter": service.quarter,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            out = _write_grid_set(
                rd,
                service,
                copula,
                suffix=_suffix(rd, service, quarter),
                fmt=fmt,
                headline_samples=headline_samples,
                grid_options=grid_options,
                progress=progress,
            )
    return out
