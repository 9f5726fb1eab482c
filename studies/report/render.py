"""The report as a document: blocks (paragraphs, facts, tables, figures, code, notes) in
sections, rendered to one self-contained HTML page and to Markdown from the same list."""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Paragraph:
    text: str


@dataclass
class Facts:
    items: list[tuple[str, str]]  # (label, value)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    id: str = ""
    caption: str = ""


@dataclass
class Figure:
    path: Path  # a PNG file
    caption: str


@dataclass
class CodeBlock:
    text: str  # shell commands


@dataclass
class Note:
    """A note: a skipped section (``skip``) or a warning about the inputs (``warn``)."""
    text: str
    kind: str = "skip"  # "skip": the section has no figure; "warn": something about the inputs


@dataclass
class Section:
    """A section: its anchor, heading and blocks, in order."""
    anchor: str
    title: str
    blocks: list[Any] = field(default_factory=list)


_CSS = """
:root { color-scheme: light; }
body { margin: 0; background: #eef1f5; color: #1f2328;
  font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  "DejaVu Sans", sans-serif; }
main { max-width: 1120px; margin: 24px auto; padding: 28px 40px 48px; background: #fff;
  border-radius: 10px; box-shadow: 0 1px 4px rgba(0,0,0,.08); }
h1 { font-size: 28px; margin: 0 0 4px; }
h1 + p.sub { margin-top: 0; color: #57606a; }
h2 { font-size: 21px; margin: 40px 0 12px; padding-bottom: 6px; border-bottom: 2px solid #d8dee4; }
nav.toc { background: #f6f8fa; border: 1px solid #d8dee4; border-radius: 8px; padding: 10px 16px;
  margin: 16px 0 8px; }
nav.toc ol { margin: 4px 0; padding-left: 22px; columns: 2; }
nav.toc a { color: #0969da; text-decoration: none; }
.scroll { overflow-x: auto; margin: 10px 0 16px; }
table { border-collapse: collapse; font-size: 13.5px; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 4px 0; color: #57606a; }
th, td { padding: 5px 10px; border-bottom: 1px solid #e3e7eb; text-align: right;
  white-space: nowrap; }
th { background: #f6f8fa; font-weight: 600; border-bottom: 2px solid #d0d7de; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) td { background: #fafbfc; }
table.facts th { text-align: left; background: none; border-bottom: 1px solid #e3e7eb;
  color: #57606a; vertical-align: top; width: 150px; }
table.facts td { text-align: left; white-space: normal; }
pre { background: #f6f8fa; border: 1px solid #d8dee4; border-radius: 6px; padding: 10px 14px;
  font-size: 13px; white-space: pre-wrap; word-break: break-word; }
figure { margin: 14px 0 22px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e3e7eb;
  border-radius: 6px; }
figcaption { color: #57606a; font-size: 13.5px; margin-top: 6px; }
.note { border-left: 4px solid #bf8700; background: #fff8c5; padding: 8px 14px;
  border-radius: 4px; margin: 10px 0; }
.note.warn { border-color: #cf222e; background: #ffebe9; }
footer { margin-top: 40px; color: #8c959f; font-size: 12.5px; }
"""


def render_html(title: str, subtitle: str, sections: list[Section], dpi: int) -> str:
    """The report as one self-contained HTML page (figures embedded)."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", "<main>",
           f"<h1>{e(title)}</h1>", f'<p class="sub">{e(subtitle)}</p>',
           '<nav class="toc"><strong>Contents</strong><ol>']
    out += [f'<li><a href="#{s.anchor}">{e(s.title)}</a></li>' for s in sections]
    out.append("</ol></nav>")
    for s in sections:
        out += [f'<section id="{s.anchor}">', f"<h2>{e(s.title)}</h2>"]
        for b in s.blocks:
            if isinstance(b, Paragraph):
                out.append(f"<p>{e(b.text)}</p>")
            elif isinstance(b, Note):
                out.append(f'<p class="note {b.kind}">{e(b.text)}</p>')
            elif isinstance(b, CodeBlock):
                out.append(f"<pre><code>{e(b.text)}</code></pre>")
            elif isinstance(b, Facts):
                rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in b.items)
                out.append(f'<div class="scroll"><table class="facts">{rows}</table></div>')
            elif isinstance(b, Table):
                ident = f' id="{b.id}"' if b.id else ""
                cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
                head = "".join(f"<th>{e(h)}</th>" for h in b.header)
                body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                               for r in b.rows)
                out.append(f'<div class="scroll"><table{ident}>{cap}<thead><tr>{head}</tr>'
                           f"</thead><tbody>{body}</tbody></table></div>")
            elif isinstance(b, Figure):
                png = b.path.read_bytes()
                data = base64.b64encode(png).decode("ascii")
                # shown at print size (CSS px are 1/96 in), shrunk to the page when wider
                width = round(int.from_bytes(png[16:20], "big") * 96 / dpi)
                out.append(f'<figure><img src="data:image/png;base64,{data}" width="{width}" '
                           f'alt="{e(b.caption)}">'
                           f"<figcaption>{e(b.caption)}</figcaption></figure>")
        out.append("</section>")
    out += ["<footer>Written by spml report (spml-probe). Self-contained: figures are embedded; "
            "no scripts, no external files.</footer>", "</main>", "</body>", "</html>", ""]
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a GitHub Markdown table: first column left-aligned, the others right."""
    return ["| " + " | ".join(_md_cell(h) for h in header) + " |",
            "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(header))) + "|",
            *("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows)]


def render_markdown(title: str, subtitle: str, sections: list[Section], base: Path) -> str:
    """The report as Markdown, figures linked relative to ``base``."""
    out = [f"# {title}", "", f"_{subtitle}_", "", "**Contents:** "
           + " · ".join(f"[{s.title}](#{s.anchor})" for s in sections), ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Paragraph):
                out += [b.text, ""]
            elif isinstance(b, Note):
                out += [f"> **{'Note' if b.kind == 'warn' else 'Skipped'}:** {b.text}", ""]
            elif isinstance(b, CodeBlock):
                out += ["```sh", b.text, "```", ""]
            elif isinstance(b, Facts):
                out += [f"- **{k}**: {v}" for k, v in b.items] + [""]
            elif isinstance(b, Table):
                if b.caption:
                    out += [f"**{b.caption}**", ""]
                out += [*markdown_table(b.header, b.rows), ""]
            elif isinstance(b, Figure):
                rel = os.path.relpath(b.path, base).replace(os.sep, "/")
                out += [f"![{_md_cell(b.caption)}]({rel})", "", f"*{b.caption}*", ""]
    return "\n".join(out)
