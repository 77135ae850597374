"""A tiny document model rendered to both Markdown and self-contained-style HTML.

The report is a list of blocks (headings, paragraphs, tables, images); rendering both formats
from the same blocks keeps ``report.md`` and ``report.html`` identical in content.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
                out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{val[1]}]({val[0]})", ""]
        return "\n".join(out)

    def html(self) -> str:
        """HTML page (images referenced relative to the page)."""
        e = html.escape
        out = [
            "<!DOCTYPE html>",
            f"<html><head><meta charset='utf-8'><title>{e(self.title)}</title>",
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
                out.append(f"<p><img src='{e(val[0])}' alt='{e(val[1])}'></p>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"
