"""Named benchmark protocols: fixed model lists and settings that reproduce a paper's table.

``seed-table2`` is the DBK paper's Table 2 (000, §4.3): DBK-RBF, SV-RBF and SV-DKL with the
paper's settings (the ``paper`` preset, 400 epochs, no early stopping, best epoch by
validation NLL, constant noise, no time input, no tile effect), reported as urban / rural MAE,
NLL and 95% coverage, with the spread of the per-tile 95% interval widths that the paper's
"near-constant intervals" claim rests on (its Figure 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geodbk.errors import DataError
from geodbk.metrics import COVERAGE95, MAE, NLL, WIDTH95, WIDTH_IQR, WIDTH_SD


@dataclass(frozen=True)
class Protocol:
    """A benchmark protocol: the models and the settings it fixes."""

    name: str
    models: tuple[str, ...]
    epochs: int
    preset: str
    noise: str
    title: str


PROTOCOLS: dict[str, Protocol] = {
    "seed-table2": Protocol(
        name="seed-table2",
        models=("sv-rbf", "sv-dkl", "dbk-rbf"),
        epochs=400,
        preset="paper",
        noise="constant",
        title="DBK paper, Table 2 (mobile internet quality, urban / rural)",
    ),
}

#: The paper's labels for the registry's model names in Table 2.
TABLE2_LABELS = {"sv-rbf": "SV-RBF", "sv-dkl": "SV-DKL", "dbk-rbf": "DBK"}


def apply_protocol(
    name: str,
    *,
    models: str | None,
    epochs: int | None,
    preset: str | None,
    noise: str | None,
    time: bool,
    tile_effect: bool,
) -> dict[str, Any]:
    """The benchmark settings of protocol ``name``: its models, epochs, preset and noise.

    ``epochs`` may shorten the protocol (recorded as given); ``models`` may name a subset of the
    protocol's models, so that they can run in separate processes that ``--merge`` into one
    report (the table marks the others "not run yet"). A model outside the protocol, a ``preset``
    or ``noise`` other than the protocol's, ``time`` or ``tile_effect`` is refused with a
    ``DataError`` that names the option, since the result would not be the protocol's table.
    """
    if name not in PROTOCOLS:
        raise DataError(f"unknown --protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    proto = PROTOCOLS[name]
    conflicts = []
    chosen = list(proto.models)
    if models is not None:
        asked = {m.strip() for m in models.split(",") if m.strip()}
        if not asked or not asked <= set(proto.models):
            conflicts.append(f"--models {models} (it trains {','.join(proto.models)})")
        else:
            chosen = [m for m in proto.models if m in asked]
    if preset is not None and preset != proto.preset:
        conflicts.append(f"--preset {preset} (it uses {proto.preset})")
    if noise is not None and noise != proto.noise:
        conflicts.append(f"--noise {noise} (it uses {proto.noise})")
    if time:
        conflicts.append("--time (it pools the quarters)")
    if tile_effect:
        conflicts.append("--tile-effect (it has none)")
    if conflicts:
        raise DataError(
            f"--protocol {name} fixes its models and settings; leave out "
            + "; ".join(conflicts)
            + " or run without --protocol"
        )
    return {
        "models": chosen,
        "epochs": proto.epochs if epochs is None else epochs,
        "preset": proto.preset,
        "noise": proto.noise,
    }


def format_stat(
    stat: dict[str, Any] | None,
    digits: int = 3,
    scale: float = 1.0,
    *,
    unit: str = "",
    same: str = "every seed",
) -> str:
    """``mean ± sd`` over seeds of a summary statistic, ``unit`` after each number; one seed:
    the mean alone; seeds that all gave the same value (a model that ignores the seed): the
    mean and ``(same)``, not a spread of 0 (``same=""``: the mean alone); nothing: ``–``."""
    if not stat or stat.get("mean") is None:
        return "–"
    mean, sd = scale * stat["mean"], stat.get("sd")
    if sd is None or (sd == 0.0 and not same):
        return f"{mean:.{digits}f}{unit}"
    if sd == 0.0:
        return f"{mean:.{digits}f}{unit} ({same})"
    return f"{mean:.{digits}f}{unit} ± {scale * sd:.{digits}f}{unit}"


def table2_lines(report: dict[str, Any]) -> list[str]:
    """Markdown lines of the report in Table 2's layout, then the PI-width spread per group."""
    proto = PROTOCOLS[report["protocol"]]
    epochs = report["budget"]["epochs"]
    lines = [
        f"## {proto.title}",
        "",
        f"Target {report['target']}; {epochs} epochs"
        + ("" if epochs == proto.epochs else f" (the protocol's {proto.epochs} shortened)")
        + f", preset {report['preset']}, {report['budget']['noise']} noise, no early stopping, "
        "best epoch by validation NLL. Lower is better for MAE and NLL; target coverage 95%.",
        "",
        "| method | urban MAE | urban NLL | urban coverage | rural MAE | rural NLL | "
        "rural coverage |",
        "|---|---|---|---|---|---|---|",
    ]
    widths = [
        "",
        "Spread of the per-tile 95% interval widths (log10; the paper's Figure 8: near-constant "
        "widths have a spread near 0):",
        "",
        "| method | urban width | urban width sd | urban width IQR | rural width | "
        "rural width sd | rural width IQR |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in proto.models:
        entry = report["models"].get(name)
        label = TABLE2_LABELS.get(name, name)
        summary = entry.get("summary") if entry else None
        if not summary:
            status = "not run yet" if entry is None else "failed"
            if entry is not None and entry["failures"]:
                status += ": " + entry["failures"][0]["reason"][:100]
            lines.append(f"| {label} | {status} ||||||")
            widths.append(f"| {label} | {status.split(':')[0]} ||||||")
            continue
        quality, spread = [], []
        for group in ("urban", "rural"):
            g = summary[group]
            quality += [
                format_stat(g[MAE]),
                format_stat(g[NLL]),
                format_stat(g[COVERAGE95], digits=1, scale=100, unit="%"),
            ]
            spread += [format_stat(g[WIDTH95]), format_stat(g[WIDTH_SD]), format_stat(g[WIDTH_IQR])]
        lines.append(f"| {label} | " + " | ".join(quality) + " |")
        widths.append(f"| {label} | " + " | ".join(spread) + " |")
    return [*lines, *widths, ""]
