"""Report figures: the binned sd maps (batch by batch equal to one pass) and the PNG writers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines import figures


def test_sd_binner_batches_equal_one_pass() -> None:
    rng = np.random.default_rng(1)
    lon, lat = rng.uniform(0, 2, 500), rng.uniform(0, 1, 500)
    resid, sd = rng.normal(size=500), rng.uniform(0.1, 1, 500)
    bounds = (0.0, 0.0, 2.0, 1.0)
    emp, pred, extent = figures.binned_sd(lon, lat, resid, sd, bounds, cells=8)
    binner = figures.SdBinner(bounds, cells=8)
    for i in range(0, 500, 37):
        binner.add(lon[i : i + 37], lat[i : i + 37], resid[i : i + 37], sd[i : i + 37])
    emp2, pred2, extent2 = binner.result()
    assert extent2 == extent and emp.shape == (4, 8)
    assert np.isfinite(emp).sum() > 20
    assert np.allclose(emp, emp2, equal_nan=True) and np.allclose(pred, pred2, equal_nan=True)


def test_the_service_coverage_title_names_the_quarter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    titles: list[str] = []
    save = figures._save

    def keep_title(fig: Any, path: Path) -> Path:
        titles.append(fig.axes[0].get_title())
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_title)
    rows = [{"label": "≥ 25 Mbps", "tiles": 0.5, "area": None, "urban": 0.6, "rural": 0.4}]
    quarter = "2024Q2 (extrapolation beyond 2023Q4)"
    out = figures.service_coverage_figure(
        rows, tmp_path / "a.png", target="download", quarter=quarter
    )
    assert out.read_bytes()[:4] == b"\x89PNG"
    figures.service_coverage_figure(rows, tmp_path / "b.png", target="download")
    assert titles == [f"Service coverage, download\n{quarter}", "Service coverage, download"]


@pytest.fixture
def figure_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The titles (suptitle and axes' titles, ``" | "``-joined) of every figure saved while
    the test runs."""
    titles: list[str] = []
    save = figures._save

    def keep_titles(fig: Any, path: Path) -> Path:
        sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
        titles.append(" | ".join([sup, *(ax.get_title() for ax in fig.axes)]))
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_titles)
    return titles


def _draw_the_report_figures(folder: Path, **kw: Any) -> None:
    """The five report figures of the test rows, on small random data, with ``kw``."""
    rng = np.random.default_rng(0)
    width, urban = rng.uniform(1, 2, 20), np.arange(20) % 2 == 0
    lv = np.linspace(0.5, 0.99, 5)
    curves = {"urban": (lv, lv), "rural": (lv, lv)}
    emp = pred = rng.uniform(0.1, 1, (4, 8))
    row = {"n": 10, "coverage95": 0.95, "nll": 0.5}
    figures.pi_width_violin(width, urban, folder / "a.png", label="log10 u", **kw)
    figures.reliability_diagram(curves, folder / "b.png", **kw)
    figures.reliability_by_tests({"1": curves}, folder / "c.png", **kw)
    figures.sd_maps(emp, pred, (0.0, 2.0, 0.0, 1.0), folder / "d.png", label="log10 u", **kw)
    figures.quarter_calibration({"2023Q4": row}, folder / "e.png", **kw)


def test_every_report_figure_names_its_target(tmp_path: Path, figure_titles: list[str]) -> None:
    """A figure handed on alone (a slide, an e-mail) still says which target it shows."""
    _draw_the_report_figures(tmp_path, target="upload")
    assert len(figure_titles) == 5 and all("upload" in t for t in figure_titles), figure_titles


def test_every_report_figure_names_the_quantity_it_judges(
    tmp_path: Path, figure_titles: list[str]
) -> None:
    """A figure handed on alone says what its intervals are of: the test rows' own tests, or
    for service coverage the tile quantity and the area map's quantity (an area grid in
    ``grids/TARGET.nc`` judges the area column on f(x))."""
    from pipelines.report import scored_quantity

    titles = figure_titles
    quantity = scored_quantity(has_tests=True)
    assert quantity.startswith("test quantity") and "own speed tests" in quantity
    assert scored_quantity(has_tests=False).startswith("test quantity")
    _draw_the_report_figures(tmp_path, target="upload", quantity=quantity)
    assert len(titles) == 5 and all(quantity in t and "upload" in t for t in titles), titles
    rows = [{"label": "≥ 3 Mbps", "tiles": 0.5, "area": 0.4, "urban": 0.6, "rural": 0.4}]
    for area, named in (("tile", "tile quantity"), ("area", "tiles: tile quantity, area: area")):
        titles.clear()
        judged = [{**rows[0], "quantity": "tile", "area_quantity": area}]
        figures.service_coverage_figure(judged, tmp_path / "f.png", target="upload", quarter="Q")
        assert titles and named in titles[0] and titles[0].endswith("\nQ"), titles
