"""What a run directory's files mean, shared by the library, the pipelines and the dashboard.

The targets with their tile-table columns and units, the 95% normal quantile every interval
uses and the default thresholds of the exceedance layers. Nothing here imports more than the
standard library, so the dashboard reads it without the model stack.
"""

from __future__ import annotations

from dataclasses import dataclass

from geodbk.errors import DataError

__all__ = [
    "DEFAULT_THRESHOLDS",
    "PLACES_OUTPUT_COLUMNS",
    "PREDICTIONS_KEY",
    "QUANTITY_LABELS",
    "SERVICE_KEY",
    "TARGETS",
    "TARGET_INFO",
    "Z95",
    "TargetInfo",
    "output_name",
    "service_headline",
    "target_info",
]

#: The 0.975 quantile of the standard normal: 95% intervals are ``mean -+ Z95 sd``.
Z95 = 1.959963984540054

#: Parquet key-value metadata of a ``predict --at`` file (``predictions/TARGET_STEM.parquet``)
#: and of a ``service --at`` file (``service/classes_STEM.parquet``): what it holds (JSON).
PREDICTIONS_KEY = b"geodbk_predictions"
SERVICE_KEY = b"geodbk_service"

#: The columns ``predict --at`` adds after the places file's own, in order.
PLACES_OUTPUT_COLUMNS = (
    "quadkey",
    "lon",
    "lat",
    "mean",
    "sd",
    "lower",
    "upper",
    "median",
    "lower_natural",
    "upper_natural",
    "tile_history",
    "tile_pull",
    "quantity",
    "quarter",
    "quarter_status",
    "located",
    "outside_region",
)

#: Each quantity's name in outputs (legends, band descriptions, variables' ``quantity``
#: attribute); a grid's tile quantity adds how it was made, e.g. ``(local layer)``.
QUANTITY_LABELS: dict[str, str] = {
    "area": "area: neighbourhood level f(x)",
    "tile": "tile: what the tile here typically gets",
    "test": "test: one speed test",
}


@dataclass(frozen=True)
class TargetInfo:
    """One modelled target.

    Attributes
    ----------
    name
        ``download``, ``upload`` or ``latency``.
    column
        The tile table's column in its raw unit (kbps for speeds, ms for latency).
    unit
        The natural unit shown to users (``Mbps`` or ``ms``).
    divisor
        Raw value / divisor = natural value (1000 for kbps to Mbps).
    higher_is_better
        True for speeds, False for latency.
    """

    name: str
    column: str
    unit: str
    divisor: float
    higher_is_better: bool

    @property
    def log_column(self) -> str:
        """The tile table's modelled column, log10 of :attr:`column`."""
        return f"log10_{self.name}"


#: The targets, in display order.
TARGET_INFO: dict[str, TargetInfo] = {
    "download": TargetInfo("download", "avg_d_kbps", "Mbps", 1000.0, True),
    "upload": TargetInfo("upload", "avg_u_kbps", "Mbps", 1000.0, True),
    "latency": TargetInfo("latency", "avg_lat_ms", "ms", 1.0, False),
}
#: Target names, in display order.
TARGETS: tuple[str, ...] = tuple(TARGET_INFO)


def target_info(name: str) -> TargetInfo:
    """The :class:`TargetInfo` of ``name``, or a :class:`DataError` that lists the targets."""
    if name not in TARGET_INFO:
        raise DataError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGET_INFO[name]


#: Default thresholds in natural units (FCC speed benchmarks 25/3 and 100/20 Mbps; 100 ms).
DEFAULT_THRESHOLDS: dict[str, tuple[float, ...]] = {
    "download": (25.0, 100.0),
    "upload": (3.0, 20.0),
    "latency": (100.0,),
}


def output_name(name: str, *, quarter: str | None = None, quantity: str = "tile") -> str:
    """A file name (without extension) for an output of ``name``: ``_QUARTER`` added for a
    quarter other than the table's latest, ``_QUANTITY`` for a quantity other than ``tile`` (the
    default), so that outputs of two quarters or quantities of one input never replace each
    other."""
    when = f"_{quarter}" if quarter else ""
    return f"{name}{when}{'' if quantity == 'tile' else f'_{quantity}'}"


def service_headline(grid_name: str) -> str:
    """The headline file of a service classes grid: ``classes[_Q][_QUANTITY].nc`` ->
    ``headline[_Q][_QUANTITY].json``."""
    stem = grid_name.rsplit(".", 1)[0]
    return f"headline{stem.removeprefix('classes')}.json"
