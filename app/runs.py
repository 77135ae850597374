"""Run discovery, safe path resolution and a per-run inventory of what the pipelines wrote.

The path rule
-------------
The *runs folder* is chosen by whoever starts the server (``--runs-dir`` after ``--`` on the
``streamlit run`` command line, else the ``GEODBK_RUNS_DIR`` environment variable, else
``runs/`` in the working directory). A person using the page can only pick a run *inside* it:
a typed value is resolved (``..`` collapsed, symlinks followed) and must name a directory
strictly below the resolved runs folder, otherwise it is refused. Every file the app opens is
``RUN / <fixed name>`` with ``TARGET`` drawn from a fixed list, so no user input reaches a path
outside the chosen runs folder.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.quarters import extra_grid_paths, trend_grid_files
from geodbk.geo.contract import TARGET_INFO, TARGETS

#: Natural units of each target.
UNITS: dict[str, str] = {t: i.unit for t, i in TARGET_INFO.items()}
#: Column of the tile table holding each target in its raw unit.
RAW_COLUMNS: dict[str, str] = {t: i.column for t, i in TARGET_INFO.items()}
#: Divisor taking the raw column to natural units (kbps -> Mbps).
RAW_TO_NATURAL: dict[str, float] = {t: i.divisor for t, i in TARGET_INFO.items()}

DEMO_RUN_NAME = "demo"
#: The one command that builds the demo run (shown when it is missing).
DEMO_COMMAND = "make demo   (or: geodbk demo --run runs/demo)"


class UnsafePathError(ValueError):
    """A user-supplied run path that does not resolve to a directory inside the runs folder."""


def runs_root_from(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> Path:
    """Return the runs folder chosen by the operator.

    Parameters
    ----------
    argv
        Script arguments (those after ``--`` on ``streamlit run app -- ...``).
    environ
        Environment mapping; ``GEODBK_RUNS_DIR`` is read from it.

    Returns
    -------
    Path
        ``--runs-dir DIR`` if given, else ``$GEODBK_RUNS_DIR``, else ``./runs``.
    """
    for i, arg in enumerate(argv):
        if arg == "--runs-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--runs-dir="):
            return Path(arg.split("=", 1)[1])
    if environ.get("GEODBK_RUNS_DIR"):
        return Path(environ["GEODBK_RUNS_DIR"])
    return Path.cwd() / "runs"


def run_from_argv(argv: list[str]) -> str | None:
    """Return the ``--run NAME`` script argument (the run to open first), if any."""
    for i, arg in enumerate(argv):
        if arg == "--run" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--run="):
            return arg.split("=", 1)[1]
    return None


def discover_runs(root: Path) -> list[str]:
    """List the run directories directly inside ``root``.

    Parameters
    ----------
    root
        The runs folder.

    Returns
    -------
    list of str
        Names of non-hidden sub-directories that resolve inside ``root``; runs that hold
        pipeline outputs come first (alphabetically), then empty or foreign directories.
    """
    if not root.is_dir():
        return []
    names: list[tuple[int, str]] = []
    for child in root.iterdir():
        if child.name.startswith(".") or not child.is_dir():
            continue
        try:
            resolve_run(root, child.name)
        except UnsafePathError:
            continue
        looks_like_run = any(
            (child / part).exists() for part in ("tiles.parquet", "grids", "models", "report")
        )
        names.append((0 if looks_like_run else 1, child.name))
    return [name for _, name in sorted(names)]


def resolve_run(root: Path, value: str) -> Path:
    """Resolve a user-typed run name or path safely inside the runs folder.

    Parameters
    ----------
    root
        The runs folder (set by the operator, never by the page).
    value
        A run name (``demo``), a relative path below ``root`` (``hawaii/2023``), a path relative
        to the working directory that lands inside ``root`` (``runs/demo``), or an absolute path
        inside ``root``.

    Returns
    -------
    Path
        The resolved run directory (it may not exist; callers report that).

    Raises
    ------
    UnsafePathError
        If the value is empty, contains control characters, or resolves (after ``..`` and
        symlinks) to ``root`` itself or anywhere outside it.
    """
    text = value.strip()
    if not text:
        raise UnsafePathError("No run given.")
    if any(ord(ch) < 32 for ch in text):
        raise UnsafePathError("The run path contains control characters.")
    base = root.resolve()
    typed = Path(text)
    forms = [typed] if typed.is_absolute() else [base / typed, Path.cwd() / typed]
    inside: list[Path] = []
    for form in forms:
        resolved = form.resolve()
        if resolved != base and resolved.is_relative_to(base):
            if resolved.exists():
                return resolved
            inside.append(resolved)
    if inside:
        return inside[0]
    raise UnsafePathError(
        f"'{text}' is not inside the runs folder {base}. Only directories inside it can be "
        "opened; start the app with `streamlit run app -- --runs-dir DIR` to use another folder."
    )


@dataclass(frozen=True)
class TargetFiles:
    """The files one target has in a run directory (fixed names only)."""

    target: str
    model_dir: Path
    grid: Path
    export: Path
    report_dir: Path

    @property
    def has_model(self) -> bool:
        """Whether a model bundle is present (``model.json`` exists)."""
        return (self.model_dir / "model.json").is_file()

    @property
    def has_grid(self) -> bool:
        """Whether the predictive grid exists."""
        return self.grid.is_file()

    @property
    def has_report(self) -> bool:
        """Whether the report's metrics exist."""
        return (self.report_dir / "metrics.json").is_file()

    @property
    def has_export(self) -> bool:
        """Whether the GeoTIFF export exists."""
        return self.export.is_file()

    @property
    def available(self) -> bool:
        """Whether anything at all exists for this target."""
        return (
            self.has_model
            or self.has_grid
            or self.has_report
            or self.has_export
            or bool(self.quarter_grid_paths())
        )

    def quarter_grid_paths(self) -> dict[str, Path]:
        """Grids of other quarters, ``grids/TARGET_YYYYQq.nc``, by quarter (a directory listing;
        only names of exactly that form)."""

        return extra_grid_paths(self.grid.parent, self.target)

    def trend_files(self) -> list[Any]:
        """Trend grids ``grids/TARGET_trend_Q1_Q2.nc`` as :class:`app.quarters.TrendFile`."""

        return trend_grid_files(self.grid.parent, self.target)

    @property
    def quarters_export(self) -> Path:
        """The NetCDF export of the quarters' grids, ``exports/TARGET_quarters.nc``
        (``geodbk export --format netcdf``)."""
        return self.export.parent / f"{self.target}_quarters.nc"

    def extra_exports(self) -> list[Path]:
        """Per-quarter and trend GeoTIFFs ``exports/TARGET_Q.tif``, ``TARGET_trend_Q1_Q2.tif``."""
        import re

        folder = self.export.parent
        if not folder.is_dir():
            return []
        pattern = re.compile(
            rf"^{re.escape(self.target)}_(\d{{4}}Q[1-4]|trend_\d{{4}}Q[1-4]_\d{{4}}Q[1-4])\.tif$"
        )
        return sorted(c for c in folder.iterdir() if pattern.match(c.name) and c.is_file())


@dataclass(frozen=True)
class RunInventory:
    """What a run directory holds, with the command that makes each missing piece."""

    path: Path
    exists: bool
    tiles: Path
    region: Path
    urban_areas: Path
    ingest_report: Path
    targets: dict[str, TargetFiles] = field(default_factory=dict)

    @property
    def has_tiles(self) -> bool:
        """Whether ``tiles.parquet`` exists."""
        return self.tiles.is_file()

    def available_targets(self) -> list[str]:
        """Targets with at least one output, in :data:`TARGETS` order."""
        return [t for t in TARGETS if self.targets[t].available]

    def command(self, stage: str, target: str | None = None) -> str:
        """The ``geodbk`` command that produces a stage's output for this run."""
        run = display_path(self.path)
        if stage == "demo":
            return f"geodbk demo --run {run}"
        if stage == "ingest":
            return f"geodbk ingest --run {run} ...   (or geodbk demo --run {run})"
        if stage == "service":  # it joins the three targets: train the missing ones first
            untrained = [t for t in TARGETS if not self.targets[t].has_model]
            steps = [f"geodbk train --run {run} --target {t}" for t in untrained]
            return "\n".join([*steps, f"geodbk service --run {run}"])
        if stage == "summarize":
            return f"geodbk summarize --run {run} --target {target or 'download'} --areas FILE"
        return f"geodbk {stage} --run {run} --target {target or 'download'}"


def display_path(path: Path) -> str:
    """Show ``path`` relative to the working directory when it is below it (the working
    directory itself in full)."""
    try:
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
    return str(path.resolve()) if shown == "." else shown


def inventory(run: Path) -> RunInventory:
    """Describe a run directory (cheap: only ``stat`` calls, nothing is read)."""
    targets = {
        t: TargetFiles(
            target=t,
            model_dir=run / "models" / t,
            grid=run / "grids" / f"{t}.nc",
            export=run / "exports" / f"{t}.tif",
            report_dir=run / "report" / t,
        )
        for t in TARGETS
    }
    return RunInventory(
        path=run,
        exists=run.is_dir(),
        tiles=run / "tiles.parquet",
        region=run / "region.geojson",
        urban_areas=run / "urban_areas.geojson",
        ingest_report=run / "ingest_report.json",
        targets=targets,
    )


def to_natural(log10_values: Any, target: str) -> Any:
    """Model scale (log10 of kbps or ms) to natural units (Mbps or ms)."""
    return 10.0 ** np.asarray(log10_values, dtype=np.float64) / RAW_TO_NATURAL[target]


def natural_to_log10(value: float, target: str) -> float:
    """A natural-unit value (Mbps or ms) on the model's log10 scale (kbps or ms)."""
    return math.log10(value * RAW_TO_NATURAL[target])
