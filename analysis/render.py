"""Tables out: CSV (raw numbers, full precision), Markdown and HTML (rounded, with units)."""
from __future__ import annotations

import csv
import html
from pathlib import Path

_UNITS = [(1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")]


def per_rank_bytes(values) -> str:
    """[1.2e9, 1.1e9] -> '1.2 + 1.1 GB' (one unit for all ranks, the largest's)."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    scale, unit = next(((s, u) for s, u in _UNITS if max(values) >= s), (1, "B"))
    return " + ".join(f"{v / scale:.3g}" for v in values) + f" {unit}"


def number(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1e6:
            return f"{v:.3e}"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return " + ".join(number(x) for x in v)
    return str(v)


def raw(v) -> str:
    """CSV cell: repr-exact floats, lists joined by ';'."""
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return ";".join(raw(x) for x in v)
    return repr(v) if isinstance(v, float) else str(v)


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or (list(rows[0]) if rows else [])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([raw(row.get(c)) for c in columns])
    return path


def markdown(rows: list[dict], columns: dict) -> str:
    """``columns``: key -> header; values formatted by ``number`` unless already strings."""
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(number(row.get(k)).replace("|", "/") for k in columns) + " |")
    return "\n".join(lines) + "\n"


def html_table(rows: list[dict], columns: dict) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(number(row.get(k)))}</td>" for k in columns) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """<style>body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}.skip{color:#a00}</style>"""


def html_page(title: str, sections: list[tuple[str, str]]) -> str:
    """``sections``: (heading, HTML body) pairs."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}</head>",
             f"<body><h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>\n{body}")
    parts.append("</body></html>")
    return "\n".join(parts)
