"""The report's policy sections: area summaries (worst areas first) and the service headline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.report_areas import area_summaries_section, service_headline_section, share_label
from pipelines.report_doc import Doc
from pipelines.rundir import RunDir, target_spec


def _tables(doc: Doc) -> list[tuple[list[str], list[list[str]]]]:
    return [val for kind, val in doc.blocks if kind == "table"]


@pytest.mark.parametrize("target", ["download", "latency"])
def test_area_section_lists_the_worst_areas_first(tiny_run: Path, target: str) -> None:
    doc = Doc("t")
    area_summaries_section(doc, RunDir(tiny_run), target_spec(target))
    (header, rows), *_ = _tables(doc)
    assert header[-1] == ("share ≥ 25 Mbps" if target == "download" else "share ≤ 100 ms")
    means = [float(r[3].split(" ")[0]) for r in rows]
    assert len(rows) == 6  # the six synthetic counties
    assert means == sorted(means, reverse=target == "latency")


def test_without_summaries_the_section_names_the_command(tiny_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy2(tiny_run / "tiles.parquet", run / "tiles.parquet")
    doc = Doc("t")
    area_summaries_section(doc, RunDir(run), target_spec("upload"))
    assert any("geodbk summarize" in str(v) for k, v in doc.blocks if k == "p")
    service_headline_section(doc, RunDir(run))  # no headline: no section
    assert not any(k == "h" and "Service" in v[1] for k, v in doc.blocks)


def test_headline_section_matches_the_file(tiny_run: Path) -> None:
    doc = Doc("t")
    service_headline_section(doc, RunDir(tiny_run))
    headline = json.loads((tiny_run / "service" / "headline.json").read_text())
    (_, rows), *_ = _tables(doc)
    assert [r[0] for r in rows] == headline["classes"]
    first = headline["area"][headline["classes"][0]]
    assert rows[0][1].startswith(f"{100 * first['mean']:.1f}%")


def test_each_headline_of_the_run_has_its_section(tiny_run: Path, tmp_path: Path) -> None:
    """A run with classes of another quantity (``service --quantity area``) reports both, the
    tile quantity's first, each heading naming its quantity and quarter."""
    folder = tmp_path / "run" / "service"
    folder.mkdir(parents=True)
    headline = json.loads((tiny_run / "service" / "headline.json").read_text())
    (folder / "headline_area.json").write_text(json.dumps({**headline, "quantity": "area"}))
    (folder / "headline.json").write_text(json.dumps(headline))
    doc = Doc("t")
    service_headline_section(doc, RunDir(tmp_path / "run"))
    headings = [v[1] for k, v in doc.blocks if k == "h" and "Service" in v[1]]
    assert headings == [
        f"Service classes (download, upload and latency together, {q} quantity, "
        f"{headline['quarter']})"
        for q in ("tile", "area")
    ]
    tables = [header for header, _ in _tables(doc)]
    assert sum("share of area" in h for h in tables) == 2
    # each headline's held-out check: a table per group of tiles
    assert sum("observed share (95% CI by place)" in h for h in tables) == 4


def test_report_md_holds_both_sections(tiny_run: Path) -> None:
    text = (tiny_run / "report" / "download" / "report.md").read_text()
    assert "### synthetic_counties.geojson: tile quantity, " in text  # demo: summarize, report
    assert "## Service classes (download, upload and latency together)" in text
    assert text.index("## Area summaries") < text.index("## Data and licence")


def test_share_labels() -> None:
    assert share_label("share_ge_100mbps") == "share ≥ 100 Mbps"
    assert share_label("share_le_50ms") == "share ≤ 50 ms"


def test_areas_of_one_name_are_told_apart_by_their_id(tiny_run: Path, tmp_path: Path) -> None:
    """Tracts of one name in several counties (Census Tract 319) get their id beside it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (path,) = sorted((run / "summaries").glob("download_*.parquet"))
    table = pq.read_table(path)
    names = ["Census Tract 319"] * 2 + table.column("name").to_pylist()[2:]
    table = table.set_column(table.column_names.index("name"), "name", pa.array(names))
    pq.write_table(table, path)
    doc = Doc("t")
    area_summaries_section(doc, RunDir(run), target_spec("download"))
    (_, rows), *_ = _tables(doc)
    ids = [str(i) for i in table.column("id").to_pylist()[:2]]
    labels = {r[0] for r in rows}
    assert {f"Census Tract 319 ({i})" for i in ids} <= labels
    assert not any(label.startswith(names[2]) and "(" in label for label in labels)


def _variant(src: Path, dst: Path, **changes: str | None) -> None:
    """Copy a summary with its rows' and metadata's keys changed (``None``: dropped, as in a
    file written before the key existed)."""
    table = pq.read_table(src)
    meta = dict(table.schema.metadata or {})
    info = json.loads(meta[b"geodbk_summary"])
    for key, value in changes.items():
        if key in table.column_names:
            table = table.drop_columns([key])
        info.pop(key, None)
        if value is not None:
            table = table.append_column(key, pa.array([value] * table.num_rows))
            info[key] = value
    meta[b"geodbk_summary"] = json.dumps(info).encode()
    pq.write_table(table.replace_schema_metadata(meta), dst)


def test_summaries_of_one_areas_file_get_headings_naming_quantity_and_quarter(
    tiny_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    (run / "summaries").mkdir(parents=True)
    src = tiny_run / "summaries" / "download_synthetic_counties.parquet"
    latest = json.loads(pq.read_schema(src).metadata[b"geodbk_summary"])["quarter"]
    folder = run / "summaries"
    shutil.copy2(src, folder / src.name)
    _variant(
        src,
        folder / "download_synthetic_counties_2099Q1.parquet",
        quarter="2099Q1",
        quarter_status=f"extrapolation beyond {latest}",
    )
    _variant(src, folder / "download_synthetic_counties_area.parquet", quantity="area")
    _variant(src, folder / "download_synthetic_counties_old.parquet", quarter_status=None)
    doc = Doc("t")
    area_summaries_section(doc, RunDir(run), target_spec("download"))
    headings = [v[1] for k, v in doc.blocks if k == "h" and v[0] == 3]
    assert len(headings) == len(set(headings)) == 4
    name = "synthetic_counties.geojson"
    assert f"{name}: tile quantity, {latest}" in headings
    assert f"{name}: area quantity, {latest}" in headings
    assert f"{name}: tile quantity, 2099Q1 (extrapolation beyond {latest})" in headings
    # an older file without quarter_status, of the same quantity and quarter: its file named
    assert f"{name}: tile quantity, {latest} (download_synthetic_counties_old.parquet)" in headings
    paras = " ".join(str(v) for k, v in doc.blocks if k == "p")
    assert f"quarter 2099Q1 (extrapolation beyond {latest})" in paras


def test_a_headline_of_an_extrapolated_quarter_says_so(tiny_run: Path, tmp_path: Path) -> None:
    """`service --quarter` past the trained quarters: the section's heading and text name the
    quarter's status, as the area summaries' do, so a held map is not read as measured."""
    folder = tmp_path / "run" / "service"
    folder.mkdir(parents=True)
    headline = json.loads((tiny_run / "service" / "headline.json").read_text())
    status = "extrapolation beyond 2023Q4"
    (folder / "headline.json").write_text(json.dumps(headline))
    later = {**headline, "quarter": "2024Q2", "quarter_status": status}
    (folder / "headline_2024Q2.json").write_text(json.dumps(later))
    doc = Doc("t")
    service_headline_section(doc, RunDir(tmp_path / "run"))
    headings = [v[1] for k, v in doc.blocks if k == "h" and "Service" in v[1]]
    assert headings[1].endswith(f"tile quantity, 2024Q2 ({status}))"), headings
    assert f"{headline['quarter']})" in headings[0] and "extrapolation" not in headings[0]
    text = " ".join(str(v) for k, v in doc.blocks if k == "p")
    assert f"quarter 2024Q2 ({status})" in text
