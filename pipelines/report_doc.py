"""A tiny document model rendered to both Markdown and self-contained HTML.

The report is a list of blocks (headings, paragraphs, tables, images); rendering both formats
from the same blocks keeps ``report.md`` and ``report.html`` identical in content. Also
:func:`quarter_rows` (the per-quarter score table), shared by the report sections.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geodbk.metrics import COVERAGE95, MAE, NLL, WIDTH95

_CSS = """
body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #bbb;padding:.3em .6em;
text-align:right}th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd}code{background:#f4f4f4;padding:0 .2em}
"""


@dataclass
class Doc:
    """Blocks of a report; add with the methods, render with :meth:`markdown` / :meth:`html`."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(("table", (list(header), [list(r) for r in rows])))

    def image(self, src: str, alt: str) -> None:
        self.blocks.append(("img", (src, alt)))

    def markdown(self) -> str:
        """Markdown text."""
        out = [f"# {self.title}", ""]
        for kind, val in self.blocks:
            if kind == "h":
                out += ["#" * val[0] + " " + val[1], ""]
            elif kind == "p":
                out += [val, ""]
            elif kind == "ul":
                out += [f"- {item}" for item in val] + [""]
            elif kind == "table":
                header, rows = val
                out.append("| " + " | ".join(_cell(c) for c in header) + " |")
                out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
                out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{val[1]}]({val[0]})", ""]
        return "\n".join(out)

    def html(self, *, base: Path | None = None) -> str:
        """HTML page. With ``base`` (the page's folder) each image found there is embedded as
        a ``data:`` URI, so the page alone can be handed on; others are referenced relative to
        the page."""
        e = _html_text
        out = [
            "<!DOCTYPE html>",
            f"<html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{e(self.title)}</h1>",
        ]
        for kind, val in self.blocks:
            if kind == "h":
                out.append(f"<h{val[0]}>{e(val[1])}</h{val[0]}>")
            elif kind == "p":
                out.append(f"<p>{e(val)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in val) + "</ul>")
            elif kind == "table":
                header, rows = val
                out.append(
                    "<table><thead><tr>"
                    + "".join(f"<th>{e(h)}</th>" for h in header)
                    + "</tr></thead><tbody>"
                )
                for r in rows:
                    out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>")
                out.append("</tbody></table>")
            elif kind == "img":
                src, alt = html.escape(_image_source(val[0], base)), html.escape(val[1])
                out.append(f"<p><img src='{src}' alt='{alt}'></p>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


def _html_text(text: str) -> str:
    """``text`` escaped for HTML, with markdown's inline code (`` `name` ``) as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _image_source(src: str, base: Path | None) -> str:
    """``src`` as a ``data:image/png;base64`` URI when ``base / src`` is a PNG file, else as
    given."""
    path = None if base is None else base / src
    if path is None or path.suffix.lower() != ".png" or not path.is_file():
        return src
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _pct(v: Any) -> str:
    return "–" if not _finite(v) else f"{100 * float(v):.1f}%"


def _num(v: Any) -> str:
    return "–" if not _finite(v) else f"{float(v):.3f}"


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(float(v))


def quarter_rows(by_quarter: dict[str, dict[str, Any]], status: dict[str, str]) -> list[list[str]]:
    """Rows ``quarter | status | n | NLL | coverage | PI width | MAE | urban n, NLL, cov. | rural
    n, NLL, cov.`` of a ``by_quarter`` dict (:func:`pipelines.scoring.by_quarter_scores`)."""
    rows = []
    for q, r in by_quarter.items():
        row = [
            q,
            status.get(q, ""),
            str(r.get("n")),
            _num(r.get(NLL)),
            _pct(r.get(COVERAGE95)),
            _num(r.get(WIDTH95)),
            _num(r.get(MAE)),
        ]
        for g in ("urban", "rural"):
            rg = r.get(g) or {}
            row += [str(rg.get("n")), _num(rg.get(NLL)), _pct(rg.get(COVERAGE95))]
        rows.append(row)
    return rows


#: Header of :func:`quarter_rows`.
QUARTER_HEADER: tuple[str, ...] = (
    "quarter",
    "status",
    "n",
    "NLL",
    "coverage",
    "PI width",
    "MAE",
    "urban n",
    "urban NLL",
    "urban cov.",
    "rural n",
    "rural NLL",
    "rural cov.",
)


def _cell(value: Any) -> str:
    """A markdown table cell: a ``|`` in the text (``median |error|``) escaped, so that it does
    not split the cell."""
    return str(value).replace("|", "\\|")
