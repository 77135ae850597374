"""The coverage report tab (and the model tab of the demo run): tables, charts, downloads, the
tile effect's note and the per-quarter frames."""

from __future__ import annotations

import math
from pathlib import Path

from apptest_helpers import (
    AppFactory,
    assert_clean,
    element_types,
    open_tab,
    tab,
    texts,
)


def test_demo_coverage_report_and_model_tabs(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    report = open_tab(at, "Coverage report")
    kinds = element_types(report)
    assert kinds["dataframe"] >= 2  # metrics table + service coverage
    import json

    metrics = json.loads((root / name / "report" / "download" / "metrics.json").read_text())
    # reliability, plus coverage and NLL per quarter when the report has `by_quarter`
    assert kinds["vega_lite_chart"] == 1 + 2 * bool(metrics.get("by_quarter"))
    assert kinds["image"] == 3  # violin, service coverage, sd maps (reliability is interactive)
    labels = [b.label for b in report.get("download_button")]
    for t in ("download", "upload", "latency"):
        assert f"{t}.tif (GeoTIFF)" in labels
    assert "download report.html" in labels
    table = report.dataframe[0].value
    assert list(table["group"]) == ["urban", "rural", "all"]
    assert {"MAE", "NLL", "95% coverage"} <= set(table.columns)
    # the map's own calibration and the quantity that judged service coverage are named
    frames = [d.value for d in report.dataframe]
    cal = next(f for f in frames if "median |error| (log10)" in f.columns)
    assert list(cal["quantity"])[:3] == ["tile"] * 3 and "area" in set(cal["quantity"])
    # with the coverage's own confidence interval and what it reads as
    assert (cal["CI low"] <= cal["95% coverage"]).all()
    assert (cal["95% coverage"] <= cal["CI high"]).all()
    assert set(cal["reads as"]) <= {"consistent", "too narrow", "too wide"}
    # and at each service threshold, the same tiles' shares and the map's sure calls
    (thresholds,) = [t.value for t in report.table]
    rows = metrics["map_calibration"]["thresholds"]["rows"]
    assert list(thresholds["served at"].unique()) == [r["label"] for r in rows]
    assert set(thresholds["tests"]) == {"30+", "5–29"}
    assert "#### Thresholds on held-out tiles" in texts(report, "markdown")
    svc = next(f for f in frames if "served when" in f.columns)
    assert "tiles (%), tile" in svc.columns and "area (%), tile" in svc.columns
    summary = json.loads((root / name / "report" / "download" / "summary.json").read_text())
    judged = summary["service_coverage"][0]["quarter"]  # the demo model is time-aware
    assert any(m.startswith(f"**Service coverage, {judged}**") for m in texts(report, "markdown"))
    assert any(c.startswith("Data: geodbk's synthetic") for c in texts(report, "caption"))
    # the test rows' caption says which split held them out, as report.md does
    from geodbk.geo.splits import split_sentence

    said = split_sentence(summary["split"])
    assert said.startswith("Split: ")
    assert any(c.startswith("Held-out test rows") and said in c for c in texts(report, "caption"))
    model = open_tab(at, "Model")
    kinds = element_types(model)
    assert kinds["metric"] == 6 and kinds["vega_lite_chart"] == 2 and kinds["code"] == 1
    assert kinds["dataframe"] == 1  # the demo's per-stage pipeline timings
    for target in ("upload", "latency"):
        at.sidebar.selectbox(key="target").set_value(target).run()
        assert_clean(at)
        assert element_types(tab(at, "Model"))["vega_lite_chart"] == 2


def test_report_tab_says_when_the_tile_effect_scored_the_tiles(
    make_app: AppFactory, synthetic_root: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    root = tmp_path / "runs"
    run = shutil.copytree(synthetic_root / "synth", root / "tiled")
    path = run / "report" / "download" / "metrics.json"
    metrics = json.loads(path.read_text())
    tau2 = {"rural": 0.1234, "urban": 0.2346}  # one offset variance per class
    params = {"tau2": tau2, "rho": 0.97, "val_nll": 0.66, "val_nll_without": 0.79}
    path.write_text(json.dumps({**metrics, "tile_effect": params}))
    at = make_app(root, "tiled")
    at.run()
    captions = texts(open_tab(at, "Coverage report"), "caption")
    note = [c for c in captions if "tile effect" in c]
    assert note and "τ² rural 0.123, urban 0.235 log10²" in note[0]
    assert "ρ 0.97 per quarter" in note[0]
    assert "0.790 without, 0.660 with" in note[0]
    assert "the area quantity is the GP's f(x) alone" in note[0]
    at = make_app(synthetic_root, "synth")
    at.run()
    assert not [c for c in texts(open_tab(at, "Coverage report"), "caption") if "tile effect" in c]


def test_downloads_come_in_a_fixed_order_grouped_by_what_they_are(
    make_app: AppFactory, synthetic_root: Path, tmp_path: Path
) -> None:
    """The target's report first, then each target's GeoTIFFs: ``TARGET.tif``, the per-quarter
    exports in time order, the trend export, each followed by its provenance JSON."""
    import shutil

    root = tmp_path / "runs"
    run = shutil.copytree(synthetic_root / "synth", root / "dl")
    exports = run / "exports"
    for stem in ("download", "download_2023Q3", "download_2022Q4", "download_trend_2022Q4_2023Q3"):
        (exports / f"{stem}.tif").write_bytes(b"II*\x00fake")
        if stem != "download_2023Q3":
            (exports / f"{stem}.json").write_text("{}")
    at = make_app(root, "dl")
    at.run()
    report = open_tab(at, "Coverage report")
    labels = [b.label for b in report.get("download_button")]
    assert labels == [
        *[f"download {n}" for n in ("report.html", "report.md", "metrics.json")],
        "download predictions.parquet",
        "download.tif (GeoTIFF)",
        "download.json (provenance)",
        "download_2022Q4.tif (GeoTIFF)",
        "download_2022Q4.json (provenance)",
        "download_2023Q3.tif (GeoTIFF)",
        "download_trend_2022Q4_2023Q3.tif (GeoTIFF)",
        "download_trend_2022Q4_2023Q3.json (provenance)",
    ], labels
    headings = [m for m in texts(report, "markdown") if m.startswith("**") and "(download)" in m]
    assert headings == ["**Report (download)**", "**GeoTIFF exports (download)**"]
    buttons = [b.proto for b in report.get("download_button")]
    assert all(b.ignore_rerun for b in buttons)  # a click neither reruns nor reads on rerun


def test_tile_effect_note_reads_one_tau2_or_one_per_group() -> None:
    """Reports written before the groups hold one float; ``{"all": x}`` reads the same."""
    from app.tabs.report_tab import tile_effect_note

    base = {"rho": 0.9, "val_nll": 0.6, "val_nll_without": 0.7}
    for tau2 in (0.25, {"all": 0.25}):
        note = tile_effect_note({"tile_effect": {**base, "tau2": tau2}})
        assert note is not None and "τ² 0.25 log10²" in note
        assert "local layer" not in note and "λ" not in note
    layer = {"range_km": 3.25, "sigma2": 0.0312}
    note = tile_effect_note({"tile_effect": {**base, "tau2": 0.25}, "local_layer": layer})
    assert note is not None and "local layer's pull" in note
    assert "range 3.25 km; σ² 0.0312 log10²)" in note
    assert "never measured" not in note
    gp = tile_effect_note(
        {"tile_effect": {**base, "tau2": 0.25}, "local_layer": {**layer, "unseen_prior": "gp"}}
    )
    assert gp is not None and "a tile never measured has the GP's own spread" in gp


def test_tile_effect_note_writes_tiny_parameters_readably_with_units() -> None:
    """Parameters at their floor are powers of ten, not 0.0000; lambda and the local layer's
    refitted tau² and rho are named with their units (the demo run's values)."""
    from app.tabs.report_tab import tile_effect_note

    params = {
        "tau2": {"rural": 1.2164246679392026e-08, "urban": 6.42714051499461e-10},
        "rho": 0.5234753465818012,
        "latent_scale": 1.2469129650137836,
        "val_nll": -0.056,
        "val_nll_without": -0.043,
    }
    layer = {"range_km": 2.0, "sigma2": 5e-09, "tau2": {"rural": 0.0994}, "rho": {"rural": 0.88}}
    note = tile_effect_note({"tile_effect": params, "local_layer": layer})
    assert note is not None and "0.0000" not in note and "e-0" not in note
    assert "τ² rural 1.22 × 10⁻⁸, urban 6.43 × 10⁻¹⁰ log10²" in note
    assert "λ 1.25 of the GP's variance; ρ 0.523 per quarter" in note
    assert "(range 2 km; σ² 5 × 10⁻⁹ log10²; τ² refitted rural 0.0994 log10²" in note
    assert "ρ refitted rural 0.88 per quarter)" in note


def test_by_quarter_frame_tolerates_absent_and_partial_entries() -> None:
    from app.tabs.report_tab import by_quarter_frame, by_quarter_table

    assert by_quarter_frame({"all": {"n": 3}}) is None
    assert by_quarter_frame({"by_quarter": {}}) is None
    frame = by_quarter_frame(
        {
            "by_quarter": {
                "2024Q1": {
                    "n": 5,
                    "coverage95": 0.8,
                    "nll": 1.0,
                    "rural": {"n": 5, "coverage95": 0.8},
                },
                "2023Q4": {"n": 7, "coverage95": 0.9, "urban": "bad", "rural": None},
                "2023Q3": "bad",
            }
        }
    )
    assert frame is not None
    assert list(dict.fromkeys(frame["quarter"])) == ["2023Q4", "2024Q1"]
    table = by_quarter_table(frame)
    assert list(table["quarter"]) == ["2023Q4", "2024Q1"]
    assert table["rural n"].tolist() == [0, 5]  # no rural rows in 2023Q4: n = 0, not blank
    assert math.isnan(table["NLL"].iloc[0]) and table["NLL"].iloc[1] == 1.0


def test_map_calibration_table_reads_files_without_the_interval() -> None:
    from app.tabs.report_tab import map_calibration_table

    group = {"tiles": 40, "coverage95": 0.9, "median_abs_error": 0.2, "off_by_2x": 0.3}
    old = map_calibration_table({"map_calibration": {"tile": {"all": group}}})
    assert old is not None
    assert math.isnan(old["CI low"][0]) and old["reads as"][0] == ""
    new = map_calibration_table(
        {"map_calibration": {"tile": {"all": group | {"coverage95_interval": [0.76, 0.97]}}}}
    )
    assert new is not None
    assert new["CI low"][0] == 0.76 and new["reads as"][0] == "consistent"
    assert math.isnan(new["CI low by place"][0])
    # with places, the reading counts them: too narrow by tile, consistent by place
    placed = map_calibration_table(
        {
            "map_calibration": {
                "tile": {
                    "all": group
                    | {
                        "coverage95_interval": [0.76, 0.94],
                        "places": 12,
                        "coverage95_interval_by_place": [0.6, 0.98],
                    }
                }
            }
        }
    )
    assert placed is not None
    assert placed["places"][0] == 12 and placed["CI low by place"][0] == 0.6
    assert placed["reads as"][0] == "consistent"


def test_map_calibration_table_adds_the_less_measured_tiles() -> None:
    from app.tabs.report_tab import _less_measured_caveat, map_calibration_table

    group = {"tiles": 40, "coverage95": 0.9, "median_abs_error": 0.2, "off_by_2x": 0.3}
    less = {"min_tests": 5, "max_tests": 30, "tiles": 70, "all": group | {"tiles": 70}}
    cal = {"tile": {"all": group}, "area": {"all": group}, "tile_less_measured": less}
    table = map_calibration_table({"map_calibration": cal})
    assert table is not None
    assert list(table["quantity"]) == ["tile", "area", "tile, 5–29 tests"]
    assert table["tiles"].iloc[-1] == 70
    assert "'tile, 5–29 tests'" in _less_measured_caveat(cal)
    # files written before it: the same two rows, no sentence
    del cal["tile_less_measured"]
    old = map_calibration_table({"map_calibration": cal})
    assert old is not None and list(old["quantity"]) == ["tile", "area"]
    assert _less_measured_caveat(cal) == ""


def test_the_map_check_caption_names_its_held_out_blocks() -> None:
    from app.tabs.report_tab import _blocks_caveat

    cal = {"tile": {"all": {"tiles": 82}}, "held_out_blocks": 15}
    assert "82 tiles lie in 15 held-out blocks" in _blocks_caveat(cal)
    assert _blocks_caveat({"tile": {"all": {"tiles": 82}}}) == ""
    assert _blocks_caveat({"held_out_blocks": 15}) == ""


def test_the_service_coverage_quarter_names_the_tiles_and_a_differing_map() -> None:
    from app.tabs.report_tab import service_quarter

    row = {"label": "≥ 25 Mbps", "quarter": "2023Q4", "quarter_status": "observed"}
    assert service_quarter({"service_coverage": [row]}) == "2023Q4"
    other = {**row, "area_quarter": "2024Q2", "area_quarter_status": "extrapolation beyond 2023Q4"}
    assert service_quarter({"service_coverage": [other]}) == (
        "2023Q4; area column: 2024Q2 (extrapolation beyond 2023Q4)"
    )
    # an older summary.json: the time section's quarter, else nothing
    old = {"service_coverage": [{"label": "≥ 25 Mbps"}]}
    assert service_quarter({**old, "time": {"service_coverage_quarter": "2023Q4"}}) == "2023Q4"
    assert service_quarter(old) is None and service_quarter(None) is None


def test_report_figures_keep_their_size_and_a_wide_one_gets_its_own_row(tmp_path: Path) -> None:
    """Two figures side by side, in their order; a figure at least twice as wide as tall (the
    sd maps' two panels, 886 × 333 px) alone in its row, where its text stays legible."""
    from PIL import Image

    from app.tabs.report_tab import figure_rows, is_wide

    sizes = {"violin": (505, 431), "service": (638, 409), "sd_maps": (886, 333), "x": (475, 473)}
    figs = []
    for name, size in sizes.items():
        Image.new("RGB", size).save(tmp_path / f"{name}.png")
        figs.append((tmp_path / f"{name}.png", name))
    assert is_wide(tmp_path / "sd_maps.png") and not is_wide(tmp_path / "violin.png")
    assert not is_wide(tmp_path / "missing.png")
    rows = [[cap for _, cap in row] for row in figure_rows(figs)]
    assert rows == [["violin", "service"], ["sd_maps"], ["x"]]
    rows = [[cap for _, cap in row] for row in figure_rows([figs[0], figs[2], figs[1]])]
    assert rows == [["violin"], ["sd_maps"], ["service"]]  # the order is kept


def test_the_netcdf_export_of_the_quarters_is_offered(
    make_app: AppFactory, demo_root: tuple[Path, str], tmp_path: Path
) -> None:
    import shutil

    root, name = demo_root
    run = shutil.copytree(root / name, tmp_path / "runs" / "nc")
    (run / "exports" / "download_quarters.nc").write_bytes(b"\x89HDF\r\n\x1a\nfake")
    at = make_app(run.parent, "nc")
    at.run()
    report = open_tab(at, "Coverage report")
    buttons = {b.label: b.proto for b in report.get("download_button")}
    assert "download_quarters.nc (NetCDF, quarters)" in buttons, list(buttons)
    assert buttons["download_quarters.nc (NetCDF, quarters)"].ignore_rerun
    headings = [m for m in texts(report, "markdown") if m.startswith("**") and "(download)" in m]
    assert headings == ["**Report (download)**", "**Exports (download)**"], headings
