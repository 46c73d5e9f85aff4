"""The one renderer of the project's reports: PNG figures, Markdown and
self-contained HTML.

Blocks are headings, paragraphs, bullet lists, tables and PNG figures. The
HTML embeds each figure as a base64 data URI and its style inline, so the
file stands alone: it opens offline and fetches nothing from the network.
Both the evaluation report (:mod:`m4moe.eval.report`) and the routing page
(:mod:`m4moe.analysis.page`) render through here, so they look alike and
stay self-contained together.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
from typing import Any, Sequence

_CSS = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;"
        "padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}"
        "th:first-child,td:first-child{text-align:left}"
        "table.text td,table.text th{text-align:left;vertical-align:top}"
        "img{max-width:100%}")


@dataclasses.dataclass(frozen=True)
class Heading:
  text: str
  level: int = 2


@dataclasses.dataclass(frozen=True)
class Paragraph:
  text: str


@dataclasses.dataclass(frozen=True)
class Bullets:
  items: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Table:
  """Cells are plain text (escaped by each renderer).

  Numeric tables right-align every column but the first; ``text=True``
  left-aligns them all (sentences).
  """

  headers: tuple[str, ...]
  rows: tuple[tuple[str, ...], ...]
  text: bool = False

  def __post_init__(self) -> None:
    for row in self.rows:
      if len(row) != len(self.headers):
        raise ValueError(f"row {row} has {len(row)} cells for "
                         f"{len(self.headers)} headers")


@dataclasses.dataclass(frozen=True)
class Image:
  """A PNG: ``file_name`` for Markdown, ``png`` bytes embedded in HTML."""
  file_name: str
  png: bytes
  alt: str


Block = Heading | Paragraph | Bullets | Table | Image


def png_bytes(figure: Any, *, dpi: int = 120, tight: bool = False) -> bytes:
  """A matplotlib figure as PNG bytes, for a file and for :class:`Image`.

  Args:
    figure: a ``matplotlib.figure.Figure`` (anything with ``savefig``).
    dpi: resolution; the figure's size in inches times ``dpi`` is its size
      in pixels.
    tight: crop the canvas to the drawn content (``bbox_inches="tight"``),
      for figures whose size is computed from their content.
  """
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=dpi,
                 **({"bbox_inches": "tight"} if tight else {}))
  return buffer.getvalue()


def _md_cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: Sequence[Block]) -> str:
  out = [f"# {title}", ""]
  for block in blocks:
    if isinstance(block, Heading):
      out += ["#" * block.level + " " + block.text, ""]
    elif isinstance(block, Paragraph):
      out += [block.text, ""]
    elif isinstance(block, Bullets):
      out += [f"- {item}" for item in block.items] + [""]
    elif isinstance(block, Table):
      out.append("| " + " | ".join(map(_md_cell, block.headers)) + " |")
      align = "---" if block.text else "---:"
      out.append("|" + "|".join(["---"] + [align] * (len(block.headers) - 1))
                 + "|")
      out += ["| " + " | ".join(map(_md_cell, row)) + " |"
              for row in block.rows]
      out.append("")
    elif isinstance(block, Image):
      out += [f"![{block.alt}]({block.file_name})", ""]
  return "\n".join(out)


def to_html(title: str, blocks: Sequence[Block]) -> str:
  e = html.escape
  out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
         f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
         f"<h1>{e(title)}</h1>"]
  for block in blocks:
    if isinstance(block, Heading):
      out.append(f"<h{block.level}>{e(block.text)}</h{block.level}>")
    elif isinstance(block, Paragraph):
      out.append(f"<p>{e(block.text)}</p>")
    elif isinstance(block, Bullets):
      out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in block.items)
                 + "</ul>")
    elif isinstance(block, Table):
      head = "".join(f"<th>{e(h)}</th>" for h in block.headers)
      body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row)
                     + "</tr>" for row in block.rows)
      css = ' class="text"' if block.text else ""
      out.append(f"<table{css}><thead><tr>{head}</tr></thead>"
                 f"<tbody>{body}</tbody></table>")
    elif isinstance(block, Image):
      data = base64.b64encode(block.png).decode("ascii")
      out.append(f"<img alt=\"{e(block.alt)}\" "
                 f"src=\"data:image/png;base64,{data}\">")
  out.append("</body></html>")
  return "\n".join(out) + "\n"
