"""The report's page: sections of prose, figures and sortable tables in one self-contained HTML file.

Nothing on the page is fetched: plotly's JavaScript is embedded once in the head, the
tables sort with a few lines of script of their own, and the styles are inline. Element
ids are fixed (no random UUIDs), so one folder always gives the same bytes.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from plotly.graph_objects import Figure

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 0 24px 48px; color: #1d2329; line-height: 1.45; }
h1 { font-size: 1.5em; margin: 24px 0 4px; } h2 { font-size: 1.2em; margin-top: 36px;
     border-bottom: 1px solid #d0d7de; padding-bottom: 4px; } h3 { font-size: 1.02em; }
.lead { color: #57606a; margin: 0 0 12px; } .note { color: #57606a; font-size: 0.92em; }
nav a { margin-right: 14px; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f6f8fa; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; } table.sortable td { white-space: nowrap; }
table.sortable.wrap td { white-space: normal; }
table.sortable th[aria-sort="ascending"]::after { content: " ▲"; }
table.sortable th[aria-sort="descending"]::after { content: " ▼"; }
.scroll { max-height: 560px; overflow: auto; }
pre { background: #f6f8fa; padding: 8px 12px; overflow-x: auto; font-size: 0.85em; }
code { background: #f6f8fa; padding: 1px 4px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 0.85em; color: #fff; }
.measured, .recorded { background: #1a7f37; } .calibrated, .published, .imported { background: #0969da; }
.analytic { background: #8250df; } .synthetic { background: #bf8700; } .unknown { background: #6e7781; }
.warn { background: #fff8c5; border: 1px solid #d4a72c; padding: 6px 10px; margin: 6px 0; }
.figure { margin: 8px 0 4px; }
"""

# Click a header to sort by it (again to reverse); numbers sort by their data-value. A page
# opened at #sort=COLUMN (or #sort=-COLUMN, descending) starts sorted, so a link can share a view.
SORT_SCRIPT = """
function sortTable(th, descending) {
  const table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
  const rows = Array.from(body.rows), down = descending ?? th.getAttribute("aria-sort") === "ascending";
  const key = r => { const c = r.cells[col], v = c.dataset.value;
                     return v === undefined ? c.textContent.trim() : parseFloat(v); };
  rows.sort((a, b) => { const x = key(a), y = key(b);
    const order = typeof x === "number" && typeof y === "number"
      ? (isNaN(x) ? 1 : isNaN(y) ? -1 : x - y) : String(x).localeCompare(String(y), undefined, {numeric: true});
    return down ? -order : order; });
  rows.forEach(r => body.appendChild(r));
  table.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", down ? "descending" : "ascending");
}
document.querySelectorAll("table.sortable th").forEach(th => th.addEventListener("click", () => sortTable(th)));
const wanted = decodeURIComponent(location.hash).match(/^#sort=(-?)(.+)$/);
if (wanted) document.querySelectorAll("table.sortable th").forEach(th => {
  if (th.dataset.key === wanted[2]) sortTable(th, wanted[1] === "-"); });
"""


def esc(text: object) -> str:
    """Return `text` as HTML text (quotes escaped too, so it may sit in an attribute)."""
    return html.escape(str(text), quote=True)


def number_text(value: Any) -> str:
    """Return a number as a reader wants it in a table: thousands separated, 3–4 significant figures.

    A boolean reads "yes" or "no"; anything else that is not a number, as `str` writes it.
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def table_html(df: pd.DataFrame, *, sortable: bool = True, headers: dict[str, str] | None = None,
               table_id: str = "", wrap: bool = False) -> str:
    """Return `df` as an HTML table; numeric cells keep their exact value for sorting (data-value).

    `headers` renames columns for display; the column's own name stays the sort key
    (`#sort=NAME` in the page's address). NaN shows as "–" and sorts last. Cells keep to one
    line (the table scrolls sideways) unless `wrap`, for tables with sentences in them.
    """
    headers = headers or {}
    head = "".join(f'<th data-key="{esc(c)}" title="{esc(c)}">{esc(headers.get(str(c), c))}</th>'
                   for c in df.columns)
    rows = []
    for record in df.itertuples(index=False):
        cells = []
        for value in record:
            if isinstance(value, int | float) and not isinstance(value, bool):
                raw = "NaN" if isinstance(value, float) and math.isnan(value) else repr(float(value))
                cells.append(f'<td class="num" data-value="{raw}">{esc(number_text(value))}</td>')
            else:
                cells.append(f"<td>{esc(value)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    ident = f' id="{esc(table_id)}"' if table_id else ""
    classes = " ".join(c for c, on in (("sortable", sortable), ("wrap", wrap)) if on)
    kind = f' class="{classes}"' if classes else ""
    return (f'<div class="scroll"><table{ident}{kind}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def figure_html(fig: Figure, name: str, height_px: int = 520) -> str:
    """Return `fig` as a div (id `figure-NAME`) and the script that draws it; plotly comes from the page head.

    The prefix keeps a figure's id apart from the sections' anchors: plotly draws into the
    first element of its id, and a section of the same name would be overwritten.
    """
    return '<div class="figure">' + fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=f"figure-{name}", default_height=f"{height_px}px",
        config={"displaylogo": False, "responsive": True}) + "</div>"


@dataclass
class Section:
    """One part of the page: a heading, an anchor for the navigation and its HTML body."""

    title: str
    anchor: str
    body: list[str] = field(default_factory=list)

    def add(self, *parts: str) -> Section:
        """Append HTML `parts` to the body; return the section, so calls chain."""
        self.body.extend(parts)
        return self


def paragraph(text: str, css: str = "") -> str:
    """Return `text` (plain text, escaped here) as a paragraph of class `css`."""
    return f'<p class="{css}">{esc(text)}</p>' if css else f"<p>{esc(text)}</p>"


def render_page(title: str, lead: str, sections: list[Section]) -> str:
    """Return the whole HTML document: plotly's library, the styles, the sections, the sorting script."""
    from plotly.offline import get_plotlyjs

    nav = " ".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in sections)
    body = "\n".join(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>\n' + "\n".join(s.body) + "</section>"
                     for s in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head>\n<body>"
        f"<h1>{esc(title)}</h1>{paragraph(lead, 'lead')}<nav>{nav}</nav>\n{body}\n"
        f"<script>{SORT_SCRIPT}</script></body></html>\n"
    )
