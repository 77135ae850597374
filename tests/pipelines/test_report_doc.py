"""The report's document model (one set of blocks, Markdown and HTML alike) and its sentences."""

from __future__ import annotations

import math
from pathlib import Path

from geodbk.metrics import COVERAGE95, MAE, NLL, WIDTH95
from pipelines.report_doc import QUARTER_HEADER, Doc, quarter_rows


def _doc() -> Doc:
    doc = Doc("Coverage <download>")
    doc.heading("Scores", level=3)
    doc.para("NLL & coverage")
    doc.bullets(["one", "two"])
    doc.table(["split", "n"], [["test", 12], ["val", 3]])
    doc.image("reliability.png", "a 'curve'")
    return doc


def test_markdown_and_html_render_the_same_blocks() -> None:
    md = _doc().markdown().splitlines()
    assert md[:5] == ["# Coverage <download>", "", "### Scores", "", "NLL & coverage"]
    assert "- one" in md and "- two" in md
    assert "| split | n |" in md and "|---|---:|" in md and "| test | 12 |" in md
    assert "![a 'curve'](reliability.png)" in md
    page = _doc().html()
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</body></html>\n")
    assert "<title>Coverage &lt;download&gt;</title>" in page  # text is escaped
    assert "<h3>Scores</h3>" in page and "<p>NLL &amp; coverage</p>" in page
    assert "<ul><li>one</li><li>two</li></ul>" in page
    assert "<tr><td>test</td><td>12</td></tr>" in page
    assert "<img src='reliability.png' alt='a &#x27;curve&#x27;'>" in page


def test_a_pipe_in_a_table_cell_does_not_split_it() -> None:
    doc = Doc("t")
    doc.table(["group", "median |error|"], [["all", "a|b"]])
    md = doc.markdown().splitlines()
    assert "| group | median \\|error\\| |" in md and "| all | a\\|b |" in md
    assert "<th>median |error|</th>" in doc.html()


def test_quarter_rows_format_scores_and_mark_missing_ones() -> None:
    scores = {
        "2023Q1": {
            "n": 40,
            NLL: -0.12345,
            COVERAGE95: 0.951,
            WIDTH95: 0.5,
            MAE: 0.1,
            "urban": {"n": 30, NLL: 0.2, COVERAGE95: 0.9},
        },
        "2023Q2": {"n": 0, NLL: math.nan},
    }
    rows = quarter_rows(scores, {"2023Q2": "extrapolation"})
    assert all(len(r) == len(QUARTER_HEADER) for r in rows)
    assert rows[0] == [
        "2023Q1", "", "40", "-0.123", "95.1%", "0.500", "0.100", "30", "0.200", "90.0%",
        "None", "–", "–",
    ]  # fmt: skip
    assert rows[1][:5] == ["2023Q2", "extrapolation", "0", "–", "–"]


def test_html_embeds_the_figures_it_finds_so_the_page_travels_alone(tmp_path: Path) -> None:
    import base64

    (tmp_path / "figures").mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (tmp_path / "figures" / "a.png").write_bytes(png)
    doc = Doc("r")
    doc.image("figures/a.png", "a")
    doc.image("figures/missing.png", "b")
    page = doc.html(base=tmp_path)
    assert f"src='data:image/png;base64,{base64.b64encode(png).decode()}'" in page
    assert "src='figures/missing.png'" in page  # not found: referenced as before
    assert "src='figures/a.png'" in doc.html()  # without a folder: referenced


def test_inline_code_is_code_in_html() -> None:
    doc = Doc("t")
    doc.para("Run `runs/hi` <1>; model `models/download`.")
    page = doc.html()
    assert "<p>Run <code>runs/hi</code> &lt;1&gt;; model <code>models/download</code>.</p>" in page
    assert "`" not in page.split("<body>")[1]
