"""The sidebar: choose the run (safely), the target and the overlays; build a :class:`RunContext`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from app import loaders
from app.basemap import BASEMAP_CREDIT, BASEMAP_STYLE, basemap_available
from app.kernel import RefPoint, preset_points
from app.quarters import (
    QuarterGrid,
    TrendFile,
    attr_flag,
    grid_quarter,
    is_quarter,
    is_time_aware,
    model_quarters,
    quarter_key,
    sort_quarter_grids,
)
from app.runs import (
    DEMO_COMMAND,
    DEMO_RUN_NAME,
    TARGETS,
    UNITS,
    RunInventory,
    TargetFiles,
    UnsafePathError,
    discover_runs,
    display_path,
    inventory,
    resolve_run,
    run_from_argv,
    runs_root_from,
)


@dataclass
class RunContext:
    """Everything the tabs need to know about the chosen run and target."""

    root: Path
    inv: RunInventory
    target: str
    show_region: bool
    show_urban: bool
    #: Map style URL of the base map (``None``: no base map).
    basemap: str | None = None

    @property
    def unit(self) -> str:
        """Natural unit of the target."""
        return UNITS[self.target]

    @property
    def files(self) -> TargetFiles:
        """The chosen target's files."""
        return self.inv.targets[self.target]

    def cmd(self, stage: str) -> str:
        """The command that builds a stage's output for this run and target."""
        return self.inv.command(stage, self.target)

    # -- cached reads (each raises LoadError on a bad file) ---------------------------------
    def tiles(self) -> loaders.TileTable:
        """The tile table."""
        path = self.inv.tiles
        return loaders.load_tiles(str(path), loaders.stamp(path))

    def grid(self, path: Path | None = None) -> loaders.Grid:
        """The predictive grid of the target (``grids/TARGET.nc``, or another quarter's file)."""
        path = self.files.grid if path is None else path
        return loaders.load_grid(str(path), loaders.stamp(path), self.target)

    def trend(self, trend: TrendFile) -> loaders.Grid:
        """A trend grid (change per year between two quarters)."""
        return loaders.load_trend(str(trend.path), loaders.stamp(trend.path), self.target)

    def pooled_label(self) -> str:
        """``pooled 2019Q1:2023Q4`` from the tile table's quarters (grids without attributes)."""
        if not self.inv.has_tiles:
            return ""
        try:
            meta = loaders.load_tile_metadata(str(self.inv.tiles), loaders.stamp(self.inv.tiles))
        except loaders.LoadError:
            return ""
        qs = sorted(
            (str(q) for q in meta.get("quarters") or [] if is_quarter(str(q))), key=quarter_key
        )
        if not qs:
            return ""
        return f"pooled {qs[0]}:{qs[-1]}" if len(qs) > 1 else f"pooled {qs[0]}"

    def quarter_grids(self) -> list[QuarterGrid]:
        """The target's predictive grids (``grids/TARGET.nc`` and ``grids/TARGET_Q.nc``),
        ordered by their ``quarter`` attribute (a file without one: its file name's quarter;
        an old ``TARGET.nc`` without one: ``pooled FIRST:LAST`` of the tile table)."""
        out: list[QuarterGrid] = []
        files = self.files
        if files.has_grid:
            attrs = self.grid().attrs
            aware = attr_flag(attrs, "time_aware")
            recorded = bool(attrs.get("quarter")) or aware
            quarter, status = grid_quarter(attrs, "" if recorded else self.pooled_label())
            out.append(QuarterGrid(quarter, status, files.grid, True, aware))
        for q, path in files.quarter_grid_paths().items():
            attrs = loaders.load_grid_attrs(str(path), loaders.stamp(path))
            quarter, status = grid_quarter(attrs, q)
            out.append(QuarterGrid(quarter, status, path, False, attr_flag(attrs, "time_aware")))
        return sort_quarter_grids(out)

    def model_metadata(self) -> dict[str, Any]:
        """The model bundle's metadata (``model.json`` ``metadata``); ``{}`` without a model."""
        if not self.files.has_model:
            return {}
        md = self.model_json().get("metadata")
        return md if isinstance(md, dict) else {}

    def stale_model(self) -> str | None:
        """Why the target's model (and the maps made from it) no longer match the run's tile
        table, or ``None``: the model records the ``ingest_id`` it was trained on, and a later
        ingest wrote another."""
        try:
            trained = (self.model_metadata().get("tiles_metadata") or {}).get("ingest_id")
            if not trained or not self.inv.has_tiles:
                return None
            tiles = self.inv.tiles
            current = loaders.load_tile_metadata(str(tiles), loaders.stamp(tiles)).get("ingest_id")
        except loaders.LoadError:
            return None
        if not current or current == trained:
            return None
        return (
            f"The {self.target} model was trained on an earlier ingest of this run: tiles.parquet "
            "has been re-ingested since (another region, split or data), so its maps and report "
            f"describe the old table. Retrain with `{self.cmd('train')}`."
        )

    def time_aware(self) -> bool:
        """Whether the target's model takes the quarter as an input (``inputs`` lists ``t``)."""
        return is_time_aware(self.model_metadata())

    def model_quarter_options(self) -> list[str]:
        """Quarters a time-aware model can be evaluated at in the kernel and inspect tabs: the
        model's quarters (``metadata["quarters"]``, its time range) and every quarter grid."""
        qs = set(model_quarters(self.model_metadata()))
        qs |= {g.quarter for g in self.quarter_grids() if is_quarter(g.quarter)}
        return sorted(qs, key=quarter_key)

    def current_quarter(self) -> str | None:
        """The quarter of ``grids/TARGET.nc`` (the default map), else the model's latest."""
        if self.files.has_grid:
            attrs = loaders.load_grid_attrs(str(self.files.grid), loaders.stamp(self.files.grid))
            quarter, _ = grid_quarter(attrs)
            if is_quarter(quarter):
                return quarter
        qs = model_quarters(self.model_metadata())
        return qs[-1] if qs else None

    def region(self) -> dict[str, Any] | None:
        """The region boundary GeoJSON, or None when absent."""
        path = self.inv.region
        if not path.is_file():
            return None
        return loaders.load_geojson(str(path), loaders.stamp(path))

    def urban_areas(self) -> dict[str, Any] | None:
        """The urban-area outlines GeoJSON, or None when absent."""
        path = self.inv.urban_areas
        if not path.is_file():
            return None
        return loaders.load_geojson(str(path), loaders.stamp(path))

    def model_json(self) -> dict[str, Any]:
        """The model bundle's ``model.json`` (read without loading torch)."""
        path = self.files.model_dir / "model.json"
        doc = loaders.load_json(str(path), loaders.stamp(path))
        if not isinstance(doc, dict):
            raise loaders.LoadError(f"{path} does not hold a JSON object.")
        return doc

    def model(self) -> Any:
        """The fitted ``DBKRegressor`` (cached per bundle)."""
        path = self.files.model_dir / "weights.safetensors"
        stamp = loaders.stamp(path)
        return loaders.load_model(str(self.files.model_dir), stamp)

    def scaling(self) -> dict[str, float]:
        """The lon/lat -> [-1, 1] input scaling (model metadata, else the tile table)."""
        try:
            sc = self.model_json().get("metadata", {}).get("input_scaling")
        except loaders.LoadError:
            sc = None
        keys = ("lon_min", "lon_max", "lat_min", "lat_max")
        if isinstance(sc, dict) and all(k in sc for k in keys):
            return {k: float(sc[k]) for k in keys}
        scaled = self.tiles().scaling()
        if scaled is None:
            raise loaders.LoadError(f"{self.inv.tiles} records no lon/lat scaling.")
        return scaled

    def presets(self) -> list[RefPoint]:
        """Urban, rural and remote reference points chosen from the tiles."""
        return _presets(str(self.inv.tiles), loaders.stamp(self.inv.tiles))


@st.cache_data(show_spinner=False, max_entries=8)
def _presets(path: str, stamp: loaders.Stamp) -> list[RefPoint]:
    return preset_points(loaders.load_tiles(path, stamp).frame)


def _script_args() -> list[str]:
    return list(sys.argv[1:])


def sidebar() -> RunContext | None:
    """Render the sidebar; return the chosen run's context, or None (a message is shown)."""
    args = _script_args()
    root = runs_root_from(args, os.environ)
    runs = discover_runs(root)
    sb = st.sidebar
    sb.title("geodbk")
    sb.caption("Internet speed maps with calibrated uncertainty")

    wanted = run_from_argv(args) or os.environ.get("GEODBK_RUN") or DEMO_RUN_NAME
    options = runs if runs else [DEMO_RUN_NAME]
    index = options.index(wanted) if wanted in options else 0
    choice = sb.selectbox(
        "Run", options, index=index, key="run", help=f"Runs in {root}", bind="query-params"
    )
    typed = sb.text_input(
        "…or a run path inside the runs folder",
        key="run_path",
        placeholder="e.g. hawaii/2023",
        help="Resolved inside the runs folder only; paths that lead outside it are refused.",
    )
    try:
        run = resolve_run(root, typed or choice)
    except UnsafePathError as exc:
        st.error(f"Cannot open that run: {exc}")
        return None
    inv = inventory(run)

    avail = inv.available_targets()
    tgt_index = TARGETS.index(avail[0]) if avail else 0
    target = sb.selectbox(
        "Target",
        TARGETS,
        index=tgt_index,
        key="target",
        bind="query-params",
        format_func=lambda t: f"{t} ({UNITS[t]})" + ("" if t in avail else " — not built"),
    )
    sb.markdown("**Overlays**")
    show_region = sb.checkbox("Region boundary", value=True, key="show_region")
    show_urban = sb.checkbox(
        "Urban-area outlines",
        value=True,
        key="show_urban",
        disabled=not inv.urban_areas.is_file(),
        help=None if inv.urban_areas.is_file() else "This run has no urban_areas.geojson.",
    )
    online = basemap_available()
    want_basemap = sb.checkbox(
        "Street base map",
        value=online,
        key="show_basemap",
        disabled=not online,
        help=BASEMAP_CREDIT if online else "Offline: the base map's server cannot be reached.",
    )
    sb.caption(f"Runs folder: `{display_path(root)}` · run: `{display_path(run)}`")

    if not inv.exists:
        if not typed and choice == DEMO_RUN_NAME:
            st.title("geodbk dashboard")
            st.info(
                f"The demo run `{display_path(run)}` does not exist yet. Build it (a few "
                f"minutes on a CPU) with:\n\n```\n{DEMO_COMMAND}\n```\n\nthen reload this page."
            )
        else:
            st.error(f"The run directory `{display_path(run)}` does not exist.")
            st.info(f"Create it with:\n\n```\n{inv.command('demo')}\n```")
        return None
    return RunContext(
        root=root,
        inv=inv,
        target=str(target),
        show_region=show_region,
        show_urban=show_urban,
        basemap=BASEMAP_STYLE if (online and want_basemap) else None,
    )
