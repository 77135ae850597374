"""Report figures (matplotlib, Agg backend), each written atomically as a PNG.

- ``pi_width_violin.png``: 95% PI widths (log10) of the test rows (tile-quarters), urban vs rural.
- ``reliability.png``: empirical vs nominal coverage at 50–99%, urban / rural / all.
- ``sd_maps.png`` (the seed's Figure 10): empirical vs predicted sd on a coarse lon/lat raster.
  Empirical sd of a cell = root-mean-square residual ``sqrt(mean((y - mean)²))`` of the held-out
  (val + test) tile-quarters whose centroid falls in the cell; predicted sd = ``sqrt(mean(std²))``
  of the same rows; cells with fewer than ``min_count`` rows are blank. The raster has about 40
  cells along the region's longer side (:class:`SdBinner` accumulates it batch by batch).
- ``service_coverage.png``: share of tiles, of region area and of urban / rural tiles where the
  target is on the good side of each threshold with probability ≥ 0.9; the title names the
  quarter they are judged at.
- ``reliability_by_tests.png``: one reliability panel per bucket of speed tests per tile.
- ``quarter_calibration.png``: 95% PI coverage (with the 95% line and a ±2% band) and NLL of
  the test rows per quarter, urban / rural / all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from geodbk.atomic import atomic_path
from geodbk.geo.frame import geometry_in_frame
from geodbk.geo.longitude import wrap_longitude
from geodbk.metrics import COVERAGE95, NLL

COLORS = {"urban": "#d95f02", "rural": "#1b9e77", "all": "#444444"}


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def _of(target: str | None, quantity: str | None = None) -> str:
    """``", TARGET"`` for a figure's title (``""`` without a target), then the ``quantity``
    the values describe on a line of its own (when given)."""
    return (f", {target}" if target else "") + (f"\n{quantity}" if quantity else "")


def pi_width_violin(
    width: np.ndarray,
    urban: np.ndarray,
    path: Path,
    *,
    label: str,
    target: str | None = None,
    quantity: str | None = None,
) -> Path:
    """Violin plot of 95% PI widths by urban/rural; the title names ``target`` and
    ``quantity``."""
    fig, ax = plt.subplots(figsize=(5, 4))
    data, names = [], []
    for name, m in (("urban", urban), ("rural", ~urban)):
        if m.sum() >= 2:
            data.append(width[m])
            names.append(f"{name}\n(n={int(m.sum())})")
    if data:
        parts = ax.violinplot(data, showmedians=True)
        bodies: Any = parts["bodies"]
        for body, name in zip(bodies, names, strict=True):
            body.set_facecolor(COLORS[name.split()[0]])
            body.set_alpha(0.6)
        ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel(f"95% PI width ({label})")
    ax.set_title(f"95% prediction-interval width, test rows (tile-quarters){_of(target, quantity)}")
    return _save(fig, path)


def reliability_diagram(
    curves: dict[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    *,
    target: str | None = None,
    quantity: str | None = None,
) -> Path:
    """Empirical vs nominal coverage, one line per group; the title names ``target`` and
    ``quantity``."""
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0.5, 1.0], [0.5, 1.0], color="grey", lw=1, ls="--", label="ideal")
    for name, (lv, cov) in curves.items():
        ax.plot(lv, cov, color=COLORS.get(name, None), lw=1.8, label=name)
    ax.set_xlim(0.5, 1.0)
    ax.set_ylim(min(0.3, float(np.nanmin([c.min() for _, c in curves.values()] or [0.5]))), 1.0)
    ax.set_xlabel("nominal coverage")
    ax.set_ylabel("empirical coverage (test)")
    ax.set_title(f"Reliability of central prediction intervals{_of(target, quantity)}")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


class SdBinner:
    """Streaming form of :func:`binned_sd`: add held-out rows batch by batch, then :meth:`result`.

    Holds three arrays of the raster's size (row count, sum of squared residuals, sum of
    squared sd per cell), so memory does not depend on the number of rows.

    Parameters
    ----------
    bounds
        ``(lon_min, lat_min, lon_max, lat_max)`` of the raster.
    cells
        Cells along the longer side.
    min_count
        Cells with fewer rows are NaN in the result.
    """

    def __init__(
        self, bounds: tuple[float, float, float, float], *, cells: int = 40, min_count: int = 3
    ) -> None:
        lon_min, lat_min, lon_max, lat_max = bounds
        self.bounds = (lon_min, lat_min, lon_max, lat_max)
        self.step = max(lon_max - lon_min, lat_max - lat_min) / cells
        self.nx = max(1, int(np.ceil((lon_max - lon_min) / self.step)))
        self.ny = max(1, int(np.ceil((lat_max - lat_min) / self.step)))
        self.min_count = min_count
        size = self.nx * self.ny
        self.count = np.zeros(size, dtype=np.int64)
        self.ss_res = np.zeros(size, dtype=np.float64)
        self.ss_sd = np.zeros(size, dtype=np.float64)

    def add(self, lon: np.ndarray, lat: np.ndarray, resid: np.ndarray, sd: np.ndarray) -> None:
        """Add rows: centroids ``lon``/``lat``, residuals ``y - mean`` and predictive ``sd``."""
        lon_min, _, _, lat_max = self.bounds
        size = self.nx * self.ny
        lon = wrap_longitude(lon, west=lon_min - 1.0)  # in the box's frame (180° meridian)
        ix = np.clip(((lon - lon_min) / self.step).astype(int), 0, self.nx - 1)
        iy = np.clip(((lat_max - lat) / self.step).astype(int), 0, self.ny - 1)
        flat = iy * self.nx + ix
        self.count += np.bincount(flat, minlength=size)
        self.ss_res += np.bincount(flat, weights=resid**2, minlength=size)
        self.ss_sd += np.bincount(flat, weights=sd**2, minlength=size)

    def result(self) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
        """``(empirical, predicted, extent)`` as :func:`binned_sd` returns them."""
        with np.errstate(invalid="ignore", divide="ignore"):
            emp = np.sqrt(self.ss_res / self.count)
            pred = np.sqrt(self.ss_sd / self.count)
        emp[self.count < self.min_count] = np.nan
        pred[self.count < self.min_count] = np.nan
        lon_min, _, _, lat_max = self.bounds
        extent = (
            lon_min,
            lon_min + self.nx * self.step,
            lat_max - self.ny * self.step,
            lat_max,
        )
        return emp.reshape(self.ny, self.nx), pred.reshape(self.ny, self.nx), extent


def binned_sd(
    lon: np.ndarray,
    lat: np.ndarray,
    resid: np.ndarray,
    sd: np.ndarray,
    bounds: tuple[float, float, float, float],
    *,
    cells: int = 40,
    min_count: int = 3,
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
    """Empirical (RMS residual) and predicted (RMS sd) sd on a coarse raster.

    Returns ``(empirical, predicted, extent)`` with arrays of shape (ny, nx), north up, NaN
    where fewer than ``min_count`` rows fall in a cell; ``extent`` for ``imshow``. All rows at
    once; :class:`SdBinner` gives the same result batch by batch.
    """
    binner = SdBinner(bounds, cells=cells, min_count=min_count)
    binner.add(lon, lat, resid, sd)
    return binner.result()


def sd_maps(
    emp: np.ndarray,
    pred: np.ndarray,
    extent: tuple[float, float, float, float],
    path: Path,
    *,
    region: Any = None,
    label: str,
    target: str | None = None,
    quantity: str | None = None,
) -> Path:
    """Side-by-side maps of empirical and predicted sd with a shared colour scale; the
    title names ``target`` and ``quantity``."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True, sharey=True)
    finite = np.concatenate([emp[np.isfinite(emp)], pred[np.isfinite(pred)]])
    vmax = float(np.nanpercentile(finite, 98)) if finite.size else 1.0
    im = None
    for ax, arr, title in ((axes[0], emp, "empirical sd"), (axes[1], pred, "predicted sd")):
        im = ax.imshow(
            arr,
            extent=extent,
            origin="upper",
            cmap="viridis",
            vmin=0,
            vmax=vmax,
            interpolation="nearest",
        )
        if region is not None:
            shown = geometry_in_frame(region, west=0.5 * (extent[0] + extent[1]) - 180.0)
            for geom in getattr(shown, "geoms", [shown]):
                xs, ys = geom.exterior.xy
                ax.plot(xs, ys, color="black", lw=0.5)
        ax.set_xlim(extent[0], extent[1])
        ax.set_ylim(extent[2], extent[3])
        ax.set_title(title)
        ax.set_xlabel("lon")
        ax.locator_params(axis="x", nbins=4)
    axes[0].set_ylabel("lat")
    if im is not None:
        fig.colorbar(im, ax=list(axes), label=f"sd ({label})", shrink=0.85)
    fig.suptitle(f"Empirical vs predicted sd, held-out rows{_of(target, quantity)}")
    return _save(fig, path)


def service_coverage_figure(
    table: Sequence[dict[str, Any]], path: Path, *, target: str, quarter: str | None = None
) -> Path:
    """Grouped bars: for each threshold, share of tiles / area / urban / rural tiles served;
    the title names the target, the quantities the rows were judged on (their ``quantity``
    and ``area_quantity``, when given) and the ``quarter`` (when given)."""
    keys = [
        ("tiles", "all tiles"),
        ("area", "area"),
        ("urban", "urban tiles"),
        ("rural", "rural tiles"),
    ]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    n = len(table)
    width = 0.8 / len(keys)
    colors = ["#444444", "#7570b3", COLORS["urban"], COLORS["rural"]]
    for j, ((key, name), color) in enumerate(zip(keys, colors, strict=True)):
        vals = [row.get(key) for row in table]
        xs = np.arange(n) + (j - (len(keys) - 1) / 2) * width
        ax.bar(xs, [np.nan if v is None else 100 * v for v in vals], width, label=name, color=color)
    ax.set_xticks(np.arange(n), [row["label"] for row in table])
    ax.set_ylabel("share (%) with P ≥ 0.9")
    ax.set_ylim(0, 100)
    ax.set_title(
        f"Service coverage, {target}"
        + (f", {_coverage_quantities(table)}" if _coverage_quantities(table) else "")
        + (f"\n{quarter}" if quarter else "")
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _coverage_quantities(table: Sequence[dict[str, Any]]) -> str:
    """The quantities the service-coverage ``table`` judged tiles and area on: ``"tile
    quantity"`` when both are one, ``"tiles: tile quantity, area: area quantity"`` otherwise,
    ``""`` when the rows do not name them."""
    tiles = next((str(r["quantity"]) for r in table if r.get("quantity")), "")
    area = next((str(r["area_quantity"]) for r in table if r.get("area_quantity")), "")
    if not area or area == tiles:
        return f"{tiles} quantity" if tiles else ""
    return f"tiles: {tiles} quantity, area: {area} quantity" if tiles else f"area: {area} quantity"


def reliability_by_tests(
    curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
    path: Path,
    *,
    target: str | None = None,
    quantity: str | None = None,
) -> Path:
    """One reliability panel per tests bucket (``curves[bucket][group] = (levels, coverage)``),
    urban and rural lines in each; empty buckets are left blank; the title names ``target``
    and ``quantity``."""
    labels = list(curves)
    ncol = 3
    nrow = max(1, math.ceil(len(labels) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 3.0 * nrow), squeeze=False)
    for ax, label in zip(axes.ravel(), labels, strict=False):
        ax.plot([0.5, 1.0], [0.5, 1.0], color="grey", lw=1, ls="--")
        for name, (lv, cov) in curves[label].items():
            ax.plot(lv, cov, color=COLORS.get(name, None), lw=1.6, label=name)
        ax.set_xlim(0.5, 1.0)
        ax.set_ylim(0.3, 1.0)
        ax.set_title(f"tests = {label}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(labels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("nominal coverage")
    for ax in axes[:, 0]:
        ax.set_ylabel("empirical coverage")
    for ax in axes.ravel():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
            break
    fig.suptitle(f"Reliability by number of speed tests per tile{_of(target, quantity)}")
    return _save(fig, path)


def quarter_calibration(
    by_quarter: dict[str, dict[str, Any]],
    path: Path,
    *,
    extrapolated: Sequence[str] = (),
    level: float = 0.95,
    band: float = 0.02,
    target: str | None = None,
    quantity: str | None = None,
) -> Path:
    """Per-quarter calibration of the test split: two panels over the quarters (time order).

    Left: empirical coverage of the central ``level`` prediction interval per quarter, with the
    nominal ``level`` as a dashed line and a ``level ± band`` shaded band (a calibrated model
    stays inside it). Right: mean Gaussian NLL per quarter (log10 scale). Urban, rural and all
    rows are separate series (``by_quarter[q]["urban"]`` etc., from
    :func:`pipelines.scoring.by_quarter_scores`); empty groups are skipped. Quarters listed in
    ``extrapolated`` (after a time-aware model's training range) are shaded grey. One quarter
    renders as single markers. The title names ``target`` and ``quantity``.
    """
    quarters = list(by_quarter)
    xs = np.arange(len(quarters), dtype=float)
    width = min(max(7.0, 0.45 * len(quarters) + 3.0), 14.0)
    fig, (ax_c, ax_n) = plt.subplots(2, 1, figsize=(width, 7.0), sharex=True)
    lo, hi = (xs[0] - 0.5, xs[-1] + 0.5) if len(xs) else (-0.5, 0.5)
    ax_c.axhspan(100 * (level - band), 100 * (level + band), color="grey", alpha=0.15, lw=0)
    ax_c.axhline(100 * level, color="grey", ls="--", lw=1, label=f"nominal {level:.0%}")
    for ax in (ax_c, ax_n):
        shaded = False
        for j, q in enumerate(quarters):
            if q in extrapolated:
                ax.axvspan(
                    j - 0.5,
                    j + 0.5,
                    color="#e6ab02",
                    alpha=0.12,
                    lw=0,
                    label=None if shaded else "extrapolation",
                )
                shaded = True
    series = (("all", "all"), ("urban", "urban"), ("rural", "rural"))
    for key, name in series:
        rows = [by_quarter[q] if key == "all" else by_quarter[q].get(key, {}) for q in quarters]
        n = np.array([r.get("n") or 0 for r in rows], dtype=float)
        cov = np.array([np.nan if r.get(COVERAGE95) is None else r[COVERAGE95] for r in rows])
        nll = np.array([np.nan if r.get(NLL) is None else r[NLL] for r in rows])
        cov = np.where(n > 0, cov.astype(float), np.nan)
        nll = np.where(n > 0, nll.astype(float), np.nan)
        if not np.isfinite(cov).any():
            continue
        style = {"color": COLORS[key], "marker": "o", "lw": 1.8 if key == "all" else 1.4}
        ax_c.plot(xs, 100 * cov, label=name, **style)
        ax_n.plot(xs, nll, label=name, **style)
    for ax in (ax_c, ax_n):
        ax.set_xticks(xs, [f"{q}*" if q in extrapolated else q for q in quarters])
        ax.set_xlim(lo, hi)
        ax.grid(alpha=0.3)
        if len(quarters) > 8:
            ax.tick_params(axis="x", labelrotation=45)
    ax_n.set_xlabel("quarter" + (" (* extrapolation)" if extrapolated else ""))
    ax_c.set_ylabel(f"{level:.0%} PI coverage (%)")
    ax_c.set_title(f"Coverage per quarter (band: {level:.0%} ± {100 * band:.0f}%)")
    ax_n.set_ylabel("NLL (log10 scale)")
    ax_n.set_title("NLL per quarter")
    ax_c.set_ylim(top=101)
    ax_c.legend(loc="best", fontsize=8)
    fig.suptitle(f"Calibration of the test split by quarter{_of(target, quantity)}")
    return _save(fig, path)
