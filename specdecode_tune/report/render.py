"""The report as a list of blocks, rendered to Markdown and to a self-contained HTML page.

One description, two renderings: `report.md` links the PNG files next to it; `report.html`
embeds the same PNGs as base64 data URIs, so the page reads offline and can be mailed as one
file (no external stylesheet, script or image). Text uses `code` spans and nothing else.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..store.files import write_file


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Code:
    text: str
    lang: str = ""


@dataclass(frozen=True)
class Image:
    name: str          # file name next to report.md
    title: str
    caption: str


Block = Heading | Para | Bullets | Table | Code | Image


# ---------------------------------------------------------------------------------------------
# Markdown


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(_md_cell(h) for h in b.header) + " |",
                     "|" + "|".join("---" for _ in b.header) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Code):
            fence = "````" if "```" in b.text else "```"
            out.append(f"{fence}{b.lang}\n{b.text}\n{fence}")
        elif isinstance(b, Image):
            out.append(f"![{b.title}]({b.name})\n\n*{b.caption}*")
        else:  # a programming error: a block type without a renderer
            raise TypeError(f"unknown block {b!r}")
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       line-height: 1.45; color: #222; }
code, pre { font-family: ui-monospace, monospace; background: #f4f4f4; }
pre { padding: .6rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #eee; }
figure { margin: 1rem 0; } figure img { max-width: 100%; }
figcaption { font-size: .85rem; color: #555; }
"""


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and
                   p.endswith("`") and len(p) > 1 else html.escape(p) for p in parts)


def to_html(blocks: Sequence[Block], images: Mapping[str, bytes], title: str) -> str:
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            n = min(max(b.level, 1), 6)
            body.append(f"<h{n}>{_inline(b.text)}</h{n}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            items = "".join(f"<li>{_inline(i)}</li>" for i in b.items)
            body.append(f"<ul>{items}</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                           for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Code):
            body.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
        elif isinstance(b, Image):
            data = images.get(b.name)
            if data is None:
                body.append(f"<p>(figure {html.escape(b.name)} missing)</p>")
                continue
            uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b.title, quote=True)}" src="{uri}">'
                        f"<figcaption><b>{html.escape(b.title)}.</b> "
                        f"{_inline(b.caption)}</figcaption></figure>")
        else:
            raise TypeError(f"unknown block {b!r}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# ---------------------------------------------------------------------------------------------
# Files


def write_atomic(path: str, data: bytes | str) -> str:
    """Write `data` (str as UTF-8) to `path` atomically (`store.files`), so a reader never
    sees half a report; returns `path`."""
    return write_file(path, data)
