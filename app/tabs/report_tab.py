"""Coverage report tab: urban/rural metrics, calibration, service coverage, downloads."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from app import loaders, maps
from app import params as P
from app.context import RunContext
from app.quarters import quarter_key
from app.runs import TARGETS
from app.ui import lazy_reader, missing
from geodbk.geo.blocks import PLACE_TEXT
from geodbk.geo.splits import split_sentence
from geodbk.geo.timeaxis import quarter_text
from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    CRPS,
    MAE,
    MEDIAN_ABS_ERROR,
    NLL,
    OFF_BY_2X,
    PLACES,
    STD_SUFFIX,
    THRESHOLD_CHECK_HEADER,
    WIDTH95,
    clustered_checks_caveat,
    coverage_verdict,
    tests_range,
    threshold_check_rows,
)

FIGURES: tuple[tuple[str, str], ...] = (
    ("reliability.png", "Reliability: empirical vs nominal coverage of central intervals"),
    ("pi_width_violin.png", "Widths of the 95% prediction intervals, urban vs rural (test rows)"),
    ("service_coverage.png", "Service coverage: share served with ≥ 90% probability"),
    ("sd_maps.png", "Empirical vs predicted sd (held-out tiles, binned)"),
)

METRIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("n", "n"),
    (MAE, "MAE"),
    (NLL, "NLL"),
    (CRPS, "CRPS"),
    (COVERAGE95, "95% coverage"),
    (WIDTH95, "mean 95% PI width"),
    (MAE + STD_SUFFIX, "MAE (std.)"),
    (NLL + STD_SUFFIX, "NLL (std.)"),
)


def metrics_table(metrics: dict[str, Any]) -> pd.DataFrame:
    """Rows urban / rural / all; columns as in :data:`METRIC_COLUMNS` (missing keys -> NaN)."""
    rows = []
    for group in ("urban", "rural", "all"):
        m = metrics.get(group)
        if not isinstance(m, dict):
            continue
        row: dict[str, Any] = {"group": group}
        for key, title in METRIC_COLUMNS:
            value = m.get(key)
            row[title] = float(value) if isinstance(value, int | float) else math.nan
        rows.append(row)
    frame = pd.DataFrame(rows)
    if "n" in frame:
        frame["n"] = frame["n"].astype("Int64")
    return frame


def tile_effect_note(metrics: dict[str, Any]) -> str | None:
    """One sentence on the tile effect the test tiles were scored with (``None``: none), its
    parameters written with their units (:mod:`app.params`)."""
    params = metrics.get("tile_effect")
    if not isinstance(params, dict):
        return None
    without, with_ = _num(params.get("val_nll_without")), _num(params.get("val_nll"))
    fitted = [f"τ² {P.per_group(params.get('tau2'), P.VARIANCE_UNIT)}"]
    if "latent_scale" in params:
        fitted.append(f"λ {P.with_unit(params['latent_scale'], P.LAMBDA_UNIT)}")
    fitted.append(f"ρ {P.with_unit(params.get('rho'), P.RHO_UNIT)}")
    note = (
        "Scored with the tile effect (on by default; `geodbk train --no-tile-effect` leaves it "
        "out): each test tile is shifted by its own persistent offset, learned from its other "
        f"quarters ({'; '.join(fitted)}; validation NLL {without:.3f} without, "
        f"{with_:.3f} with)"
    )
    layer = metrics.get("local_layer")
    if isinstance(layer, dict):
        spatial = [
            f"range {P.with_unit(layer.get('range_km'), P.RANGE_UNIT)}",
            f"σ² {P.with_unit(layer.get('sigma2'), P.VARIANCE_UNIT)}",
        ]
        for name, symbol, unit in (("tau2", "τ²", P.VARIANCE_UNIT), ("rho", "ρ", P.RHO_UNIT)):
            if isinstance(layer.get(name), dict | int | float):
                spatial.append(f"{symbol} refitted {P.per_group(layer[name], unit)}")
        note += (
            f", and the local layer's pull of measured neighbouring tiles ({'; '.join(spatial)})"
        )
        if layer.get("unseen_prior") == "gp":  # geodbk.local_layer.UNSEEN_GP
            note += (
                "; a tile never measured has the GP's own spread of a tile around f(x) at its "
                "tests, which the validation rows of unmeasured tiles preferred to τ²"
            )
    return (
        note + ". The maps' tile and test quantities come from the same layers; the area "
        "quantity is the GP's f(x) alone."
    )


QUARTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("n", "n"),
    (MAE, "MAE"),
    (NLL, "NLL"),
    (COVERAGE95, "95% coverage"),
    (WIDTH95, "mean 95% PI width"),
)


def _num(value: Any) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    )


def by_quarter_frame(metrics: dict[str, Any]) -> pd.DataFrame | None:
    """Long table of ``metrics["by_quarter"]``: one row per quarter and group (all / urban /
    rural) with n, MAE, NLL, 95% coverage and mean interval width; None when absent or empty.

    Quarters are in time order; groups without data are left out.
    """

    raw = metrics.get("by_quarter")
    if not isinstance(raw, dict) or not raw:
        return None
    rows: list[dict[str, Any]] = []
    for quarter in sorted(raw, key=lambda q: (quarter_key(str(q)), str(q))):
        entry = raw[quarter]
        if not isinstance(entry, dict):
            continue
        groups = {"all": entry, "urban": entry.get("urban"), "rural": entry.get("rural")}
        for group, m in groups.items():
            if not isinstance(m, dict):
                continue
            row: dict[str, Any] = {"quarter": str(quarter), "group": group}
            row |= {title: _num(m.get(key)) for key, title in QUARTER_COLUMNS}
            if row["n"] == 0 or all(math.isnan(row[t]) for _, t in QUARTER_COLUMNS):
                continue
            rows.append(row)
    return pd.DataFrame(rows) if rows else None


def by_quarter_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per quarter: all-tile metrics plus urban and rural n and coverage."""
    wide = frame[frame["group"] == "all"].drop(columns="group").set_index("quarter")
    for group in ("urban", "rural"):
        part = frame[frame["group"] == group].set_index("quarter")
        wide[f"{group} n"] = part["n"]
        wide[f"{group} coverage"] = part["95% coverage"]
    order = list(dict.fromkeys(frame["quarter"]))
    out = wide.reindex([q for q in order if q in wide.index]).reset_index()
    for col in ("n", "urban n", "rural n"):  # a group without rows in a quarter has n = 0
        out[col] = out[col].fillna(0).astype("Int64")
    return out


_GROUP_COLOURS = alt.Scale(
    domain=["urban", "rural", "all"], range=["#d95f02", "#1b9e77", "#666666"]
)


def _quarter_chart(frame: pd.DataFrame, column: str, title: str) -> alt.LayerChart | alt.Chart:
    """``column`` per quarter (urban, rural, all); the coverage chart gets the 95% line."""
    order = list(dict.fromkeys(frame["quarter"]))
    data = frame.dropna(subset=[column])
    coverage = column == "95% coverage"
    if coverage:
        lo = min(0.8, float(data[column].min()) - 0.02) if len(data) else 0.8
        y_scale = alt.Scale(domain=[max(0.0, lo), 1.0], zero=False, nice=False)
    else:
        y_scale = alt.Scale(zero=False)
    lines = (
        alt.Chart(data)
        .mark_line(point=alt.OverlayMarkDef(size=50))
        .encode(
            x=alt.X("quarter:O", sort=order, title="test quarter", axis=alt.Axis(labelAngle=0)),
            y=alt.Y(f"{column}:Q", scale=y_scale, title=title),
            color=alt.Color("group:N", title=None, scale=_GROUP_COLOURS),
            tooltip=[
                "quarter",
                "group",
                alt.Tooltip("n:Q", format=",d"),
                alt.Tooltip("95% coverage:Q", format=".3f"),
                alt.Tooltip("NLL:Q", format=".3f"),
            ],
        )
        .properties(height=240)
    )
    if not coverage:
        return lines
    nominal = (
        alt.Chart(pd.DataFrame({"y": [0.95]}))
        .mark_rule(color="#999", strokeDash=[4, 3])
        .encode(y=alt.Y("y:Q", scale=y_scale))
    )
    return nominal + lines


def _render_by_quarter(metrics: dict[str, Any]) -> None:
    """The per-quarter charts and table from ``metrics.json`` ``by_quarter`` (if present)."""
    frame = by_quarter_frame(metrics)
    if frame is None:
        return
    st.markdown("#### Calibration per quarter")
    left, right = st.columns(2)
    left.altair_chart(
        _quarter_chart(frame, "95% coverage", "95% coverage"),
        width="stretch",
    )
    right.altair_chart(_quarter_chart(frame, "NLL", "NLL (log10 scale)"), width="stretch")
    _table(
        by_quarter_table(frame),
        percent=("95% coverage", "urban coverage", "rural coverage"),
        fixed=("MAE", "NLL", "mean 95% PI width"),
    )
    st.caption(
        "Test rows grouped by their quarter (metrics.json `by_quarter`); dashed: the nominal "
        "95%. A time-aware model "
        "predicts each tile at its own quarter; on a forecast split the test quarter lies after "
        "the training quarters, so its coverage measures the forecast."
    )


def reliability_frame(
    summary: dict[str, Any] | None, preds: pd.DataFrame | None
) -> pd.DataFrame | None:
    """Coverage-vs-level curves per group, from ``summary.json`` or recomputed from predictions."""
    rel = (summary or {}).get("reliability")
    rows: list[dict[str, Any]] = []
    if isinstance(rel, dict) and rel:
        for group, curve in rel.items():
            for lv, cv in zip(curve.get("levels", []), curve.get("coverage", []), strict=False):
                if cv is not None:
                    rows.append({"group": group, "nominal": float(lv), "empirical": float(cv)})
    elif preds is not None and {"y", "mean", "std", "urban"} <= set(preds.columns):
        from scipy.special import ndtri

        levels = np.round(np.arange(0.5, 0.991, 0.01), 2)
        z = np.abs(((preds["y"] - preds["mean"]) / preds["std"]).to_numpy(dtype=float))
        urban = preds["urban"].to_numpy(dtype=bool)
        for group, mask in (("urban", urban), ("rural", ~urban), ("all", np.ones_like(urban))):
            if mask.any():
                for lv in levels:
                    rows.append(
                        {
                            "group": group,
                            "nominal": float(lv),
                            "empirical": float(np.mean(z[mask] <= ndtri(0.5 + lv / 2))),
                        }
                    )
    return pd.DataFrame(rows) if rows else None


def _reliability_chart(frame: pd.DataFrame) -> alt.LayerChart:
    x_scale = alt.Scale(domain=[0.5, 1.0], zero=False, nice=False)
    y_scale = alt.Scale(domain=[0.4, 1.0], zero=False, nice=False, clamp=True)
    diag = (
        alt.Chart(pd.DataFrame({"nominal": [0.5, 1.0], "empirical": [0.5, 1.0]}))
        .mark_line(color="#999", strokeDash=[4, 3])
        .encode(
            x=alt.X("nominal:Q", scale=x_scale, title="nominal coverage"),
            y=alt.Y("empirical:Q", scale=y_scale, title="empirical coverage"),
        )
    )
    lines = (
        alt.Chart(frame)
        .mark_line(point=alt.OverlayMarkDef(size=12))
        .encode(
            x=alt.X("nominal:Q", scale=x_scale, title="nominal coverage"),
            y=alt.Y("empirical:Q", scale=y_scale, title="empirical coverage"),
            color=alt.Color(
                "group:N",
                title=None,
                scale=alt.Scale(
                    domain=["urban", "rural", "all"], range=["#d95f02", "#1b9e77", "#666666"]
                ),
            ),
            tooltip=[
                "group",
                alt.Tooltip("nominal:Q", format=".2f"),
                alt.Tooltip("empirical:Q", format=".3f"),
            ],
        )
    )
    return (diag + lines).properties(height=300, title="Reliability (on the diagonal = calibrated)")


def service_quarter(summary: dict[str, Any] | None) -> str | None:
    """The quarter the service-coverage rows of ``summary.json`` are judged at (the tiles'
    ``quarter`` with its status where that is not observed or pooled, and the map's where it
    differs); older files: ``time.service_coverage_quarter``; None when unrecorded."""
    rows = (summary or {}).get("service_coverage")
    first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
    quarter = first.get("quarter")
    if not quarter:
        time_info = (summary or {}).get("time")
        old = time_info.get("service_coverage_quarter") if isinstance(time_info, dict) else None
        return str(old) if old else None
    out = quarter_text(quarter, first.get("quarter_status"))
    area = first.get("area_quarter")
    if area and area != quarter:
        out += f"; area column: {quarter_text(area, first.get('area_quarter_status'))}"
    return out


def service_table(summary: dict[str, Any] | None) -> pd.DataFrame | None:
    """The service-coverage rows of ``summary.json`` as percentages."""
    rows = (summary or {}).get("service_coverage")
    if not isinstance(rows, list) or not rows:
        return None
    out = []
    for r in rows:
        if not isinstance(r, dict):
            continue
        pct = {
            k: (100 * r[k] if isinstance(r.get(k), int | float) else math.nan)
            for k in ("tiles", "area", "urban", "rural")
        }
        tile_q = str(r.get("quantity") or "one test")
        area_q = str(r.get("area_quantity") or "grid")
        out.append(
            {
                "served when": r.get("label", r.get("threshold")),
                f"tiles (%), {tile_q}": pct["tiles"],
                f"area (%), {area_q}": pct["area"],
                "urban tiles (%)": pct["urban"],
                "rural tiles (%)": pct["rural"],
            }
        )
    return pd.DataFrame(out)


def map_calibration_table(metrics: dict[str, Any]) -> pd.DataFrame | None:
    """``metrics["map_calibration"]`` as one row per quantity and group, then the tile
    quantity's rows on the less measured test tiles (``tile, 5–29 tests``; ``None`` without
    any)."""
    cal = metrics.get("map_calibration")
    if not isinstance(cal, dict):
        return None
    rows = []
    blocks = [(q, cal.get(q)) for q in ("tile", "area")]
    less = cal.get("tile_less_measured")
    if isinstance(less, dict) and "max_tests" in less:
        blocks.append((f"tile, {tests_range(less)} tests", less))
    for quantity, block in blocks:
        for group in ("all", "urban", "rural"):
            r = (block or {}).get(group)
            if isinstance(r, dict):
                interval = r.get(COVERAGE95_INTERVAL)
                low, high = interval if isinstance(interval, list) else (None, None)
                by_place = r.get(COVERAGE95_INTERVAL_BY_PLACE)
                place_low, place_high = by_place if isinstance(by_place, list) else (None, None)
                # the reading counts places where the file has them, else tiles
                judged = by_place if isinstance(by_place, list) else interval
                rows.append(
                    {
                        "quantity": quantity,
                        "group": group,
                        "tiles": r.get("tiles"),
                        "95% coverage": _num(r.get(COVERAGE95)),
                        "CI low": _num(low),
                        "CI high": _num(high),
                        "places": r.get(PLACES),
                        "CI low by place": _num(place_low),
                        "CI high by place": _num(place_high),
                        "reads as": coverage_verdict(judged) if isinstance(judged, list) else "",
                        "median |error| (log10)": _num(r.get(MEDIAN_ABS_ERROR)),
                        "off by > 2×": _num(r.get(OFF_BY_2X)),
                    }
                )
    return pd.DataFrame(rows) if rows else None


def _less_measured_caveat(cal: dict[str, Any]) -> str:
    """The caption's sentence on the ``tile, 5–29 tests`` rows (nothing without them)."""
    less = cal.get("tile_less_measured")
    if not isinstance(less, dict) or "max_tests" not in less or not less.get("all"):
        return ""
    return (
        f" The rows 'tile, {tests_range(less)} tests' score the less "
        "measured tiles, more like the map's typical tile: their levels carry more of their "
        "own noise (held in each interval), so they test the width less sharply."
    )


def _render_map_calibration(metrics: dict[str, Any]) -> None:
    """The map's own calibration on well-measured held-out tiles (``map_calibration``)."""
    cal = metrics.get("map_calibration")
    if not isinstance(cal, dict):
        return
    st.markdown("#### Map calibration: what held-out tiles get")
    table = map_calibration_table(metrics)
    if table is None:
        st.info(
            f"No test tile has {cal.get('min_tests', 30)} or more tests over its test quarters: "
            "the map's own calibration cannot be measured on this split."
        )
        return
    _table(
        table,
        percent=(
            "95% coverage",
            "CI low",
            "CI high",
            "CI low by place",
            "CI high by place",
            "off by > 2×",
        ),
        fixed=("median |error| (log10)",),
    )
    st.caption(
        f"Test tiles with at least {cal.get('min_tests', 30)} tests: the map's 95% interval "
        "against each tile's tests-weighted level. tile = what the maps show by default (each "
        "tile's own offset); area = the smooth f(x) alone. A calibrated map covers about 95%: "
        "CI low–high is the coverage's own 95% confidence interval over the tiles (exact "
        "binomial). Tiles near each other share their errors, so the same interval counted by "
        f"place ({PLACE_TEXT}) is the one to read; 'reads as' says whether 95% lies inside it "
        "(consistent) or the map's intervals are too narrow or too wide."
        + _less_measured_caveat(cal)
        + _blocks_caveat(cal)
    )
    _render_threshold_check(cal.get("thresholds"))


def threshold_check_table(block: dict[str, Any] | None) -> pd.DataFrame | None:
    """The report's threshold check (``map_calibration.thresholds``) as a table, one row per
    threshold and group of test tiles; None without one."""
    rows = threshold_check_rows(block) if isinstance(block, dict) else []
    if not rows:
        return None
    return pd.DataFrame(rows, columns=list(THRESHOLD_CHECK_HEADER))


def _render_threshold_check(block: dict[str, Any] | None) -> None:
    """The map's service thresholds on the same held-out tiles."""
    table = threshold_check_table(block)
    if table is None or block is None:
        return
    sure = float(block.get("sure", 0.9))
    st.markdown("#### Thresholds on held-out tiles")
    st.table(table)
    st.caption(
        "At each service threshold: the expected share of these test tiles served (the mean "
        "of the tile quantity's probability) against the share whose level is, with its 95% "
        "interval counted by place, marked (outside) when the expected share is not in it. "
        f"Sure: the tiles the map gives at least {sure:.0%} (served) or at most "
        f"{1 - sure:.0%} (not served), and the share of them it was right about; a "
        f"calibrated map is right about at least {sure:.0%}."
    )


def _blocks_caveat(cal: dict[str, Any]) -> str:
    """On a block split: how many held-out blocks the scored tiles lie in, and what that
    means for the interval (empty otherwise)."""
    tiles = (cal.get("tile") or {}).get("all", {}).get("tiles")
    return clustered_checks_caveat(tiles, cal.get("held_out_blocks"))


def _table(
    frame: pd.DataFrame,
    percent: Iterable[str] = (),
    fixed: Iterable[str] = (),
    fmt: str = "%.3f",
) -> None:
    """A full-width table: the ``percent`` columns (fractions) as percentages with one decimal,
    as in ``report.md``; the ``fixed`` ones in ``fmt``."""
    percent = [c for c in percent if c in frame.columns]
    shown = frame.assign(**{c: 100.0 * pd.to_numeric(frame[c], errors="coerce") for c in percent})
    config = {c: st.column_config.NumberColumn(format="%.1f%%") for c in percent}
    config.update({c: st.column_config.NumberColumn(format=fmt) for c in fixed})
    st.dataframe(shown, hide_index=True, width="stretch", column_config=config)


#: Width / height from which a report figure gets a row of its own (the sd maps' two panels).
WIDE_FIGURE = 2.0


def is_wide(path: Path) -> bool:
    """Whether a figure is at least :data:`WIDE_FIGURE` times as wide as tall (PNG header)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            width, height = im.size
    except OSError:
        return False
    return height > 0 and width / height >= WIDE_FIGURE


def figure_rows(figs: list[tuple[Path, str]]) -> list[list[tuple[Path, str]]]:
    """The report's figures in rows, in their order: two side by side, a wide one alone.

    The figures are shown at their own size (matplotlib's, at most the column's width): in
    half a row a wide figure's text would shrink below legibility, and a small one stretched
    to the column would be blown up past the others.
    """
    rows: list[list[tuple[Path, str]]] = []
    pending: list[tuple[Path, str]] = []
    for fig in figs:
        if is_wide(fig[0]):
            rows += [pending] if pending else []
            rows.append([fig])
            pending = []
            continue
        pending.append(fig)
        if len(pending) == 2:
            rows.append(pending)
            pending = []
    return rows + ([pending] if pending else [])


def _read_optional(path: Path, reader: Any) -> Any:
    if not path.is_file():
        return None
    return reader(str(path), loaders.stamp(path))


def render(ctx: RunContext) -> None:
    """Render the coverage-report tab."""
    t = ctx.target
    rdir = ctx.files.report_dir
    if not ctx.files.has_report:
        missing(f"This run has no report for {t} (report/{t}/metrics.json).", ctx.cmd("report"))
        _downloads(ctx)
        return
    metrics = loaders.load_metrics(str(rdir / "metrics.json"), loaders.stamp(rdir / "metrics.json"))
    if not isinstance(metrics, dict):
        raise loaders.LoadError(f"{rdir / 'metrics.json'} does not hold a JSON object.")
    summary = _read_optional(rdir / "summary.json", loaders.load_metrics)
    summary = summary if isinstance(summary, dict) else None
    preds = _read_optional(rdir / "predictions.parquet", loaders.load_parquet)

    st.markdown(f"#### Test-set accuracy and calibration, {t} (log10 scale)")
    table = metrics_table(metrics)
    _table(
        table,
        percent=("95% coverage",),
        fixed=[c for _, c in METRIC_COLUMNS[1:] if c != "95% coverage"],
    )
    split = (summary or {}).get("split")
    st.caption(
        "Held-out test rows (a tile in one quarter). With calibrated intervals the 95% coverage "
        "column is close to 95% for urban and rural rows alike. MAE, CRPS and width are in log10 units; '(std.)' "
        "columns are on the standardised scale."
        + (f" {split_sentence(split)}" if isinstance(split, dict) and split else "")
    )
    note = tile_effect_note(metrics)
    if note:
        st.caption(note)
    base = (summary or {}).get("baseline_constant_mean")
    if isinstance(base, dict):
        with st.expander("Compare with a constant-mean baseline"):
            both = pd.concat(
                [
                    metrics_table(metrics).assign(model="geodbk"),
                    metrics_table(base).assign(model="constant mean"),
                ]
            )
            _table(
                both[["model", "group", "MAE", "NLL", "95% coverage"]],
                percent=("95% coverage",),
                fixed=("MAE", "NLL"),
            )

    _render_by_quarter(metrics)
    _render_map_calibration(metrics)

    svc = service_table(summary)
    rel = reliability_frame(summary, preds)
    # the chart beside nothing wider than itself; the table full width (its columns name the
    # quantities, which a half-width column cut off)
    c1, _ = st.columns(2)
    if rel is not None:
        c1.altair_chart(_reliability_chart(rel), width="stretch")
    if svc is not None:
        judged = service_quarter(summary)
        st.markdown(
            (f"**Service coverage, {judged}**" if judged else "**Service coverage**")
            + " (served = threshold met with ≥ 90% probability by the named quantity: tile = "
            "what a tile typically gets"
            + ("; every distinct tile of the table is judged at that quarter)" if judged else ")")
        )
        _table(svc, fixed=svc.columns[1:], fmt="%.1f")

    licence = maps.licence_caption((summary or {}).get("data_licence"))
    if licence:
        st.caption(licence)
    # The reliability diagram is drawn interactively above when possible: no repeated PNG then.
    skip = {"reliability.png"} if rel is not None else set()
    figs = [
        (rdir / "figures" / name, cap)
        for name, cap in FIGURES
        if name not in skip and (rdir / "figures" / name).is_file()
    ]
    if figs:
        st.markdown("#### Report figures")
        for row in figure_rows(figs):
            if len(row) == 1 and is_wide(row[0][0]):
                st.image(str(row[0][0]), caption=row[0][1], width="content")
                continue
            for col, (path, cap) in zip(st.columns(2), row, strict=False):
                col.image(str(path), caption=cap, width="content")
    else:
        st.info(f"No figures in {rdir / 'figures'}; rerun `{ctx.cmd('report')}`.")
    _downloads(ctx)


#: The target's report files offered for download, in this order.
REPORT_FILES: tuple[tuple[str, str], ...] = (
    ("report.html", "text/html"),
    ("report.md", "text/markdown"),
    ("metrics.json", "application/json"),
    ("predictions.parquet", "application/octet-stream"),
)
#: Download buttons per row.
DOWNLOADS_PER_ROW = 4


@dataclass(frozen=True)
class Download:
    """One download button: its label, the file it serves and the file's MIME type."""

    label: str
    path: Path
    mime: str


def download_groups(ctx: RunContext) -> list[tuple[str, list[Download]]]:
    """The files the tab offers, grouped and in a fixed order: the chosen target's report
    (:data:`REPORT_FILES`), then the GeoTIFF exports of each target in the sidebar's order
    (download, upload, latency), each GeoTIFF followed by its provenance JSON: ``TARGET.tif``,
    then the per-quarter ``TARGET_2023Q2.tif`` in time order, then the trend exports, then the
    NetCDF of the quarters (``TARGET_quarters.nc``; the group is then headed "Exports"). Groups
    without files are left out."""
    rdir = ctx.files.report_dir
    report = [
        Download(f"{ctx.target} {name}", rdir / name, mime)
        for name, mime in REPORT_FILES
        if (rdir / name).is_file()
    ]
    groups = [(f"Report ({ctx.target})", report)] if report else []
    for target in TARGETS:
        f = ctx.inv.targets[target]
        items: list[Download] = []
        for tif in ([f.export] if f.has_export else []) + f.extra_exports():
            items.append(Download(f"{tif.name} (GeoTIFF)", tif, "image/tiff"))
            side = tif.with_suffix(".json")
            if side.is_file():
                items.append(Download(f"{side.name} (provenance)", side, "application/json"))
        kind = "GeoTIFF exports"
        if f.quarters_export.is_file():
            nc = f.quarters_export
            items.append(Download(f"{nc.name} (NetCDF, quarters)", nc, "application/x-netcdf"))
            side = nc.with_suffix(".json")
            if side.is_file():
                items.append(Download(f"{side.name} (provenance)", side, "application/json"))
            kind = "Exports"
        if items:
            groups.append((f"{kind} ({target})", items))
    return groups


def _downloads(ctx: RunContext) -> None:
    """Download buttons (:func:`download_groups`): one labelled block per group, in rows of
    :data:`DOWNLOADS_PER_ROW`."""
    st.markdown("#### Downloads")
    groups = download_groups(ctx)
    if not groups:
        st.info(
            f"Nothing to download yet. Build the GeoTIFFs with `{ctx.cmd('export')}` and the "
            f"report with `{ctx.cmd('report')}`."
        )
        return
    if not any(ctx.inv.targets[t].has_export for t in TARGETS):
        st.caption(f"No GeoTIFF exports yet: `{ctx.cmd('export')}`.")
    for title, items in groups:
        st.markdown(f"**{title}**")
        for start in range(0, len(items), DOWNLOADS_PER_ROW):
            cols = st.columns(DOWNLOADS_PER_ROW)
            for col, item in zip(cols, items[start : start + DOWNLOADS_PER_ROW], strict=False):
                col.download_button(
                    item.label,
                    data=lazy_reader(item.path),
                    file_name=f"{ctx.inv.path.name}_{item.path.name}",
                    mime=item.mime,
                    key=f"dl_{item.label}",
                    on_click="ignore",
                    width="stretch",
                )
