"""The report as one self-contained HTML file: its style inline, its figures PNG data URIs, no
script, font or stylesheet fetched from anywhere, so it opens the same offline or attached to
an issue."""

from __future__ import annotations

import base64
import html

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
.note { color: #555; font-size: 0.9em; }
pre.diff { background: #f7f7f7; border: 1px solid #ddd; padding: 0.5em; font-size: 0.8em;
           overflow-x: auto; white-space: pre; }
"""


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table(frame) -> str:
    return frame.to_html(index=False, escape=True, na_rep="-", border=0)


def _edits(edits: list[dict]) -> str:
    """Each --describe experiment: what it was, its verdict, and its diff (escaped)."""
    e = html.escape
    parts = []
    for edit in edits:
        parts.append(f"<h3>iteration {edit['iteration']}: {e(str(edit['describe']))} "
                     f"({e(str(edit['status']))})</h3><p class=\"note\">{e(str(edit['reason']))}"
                     f"; <code>{e(edit['show'])}</code></p>")
        if edit["diff"]:
            parts.append(f"<pre class=\"diff\">{e(edit['diff'])}</pre>")
        if edit["note"]:
            parts.append(f"<p class=\"note\">{e(edit['note'])}</p>")
    return "\n".join(parts)


def page(r: dict, notes: list[str], sections: list[tuple[str, object]]) -> str:
    """`notes`: lines of text at the top; `sections`: (title, a DataFrame, PNG bytes, or the
    report's `edits`), in order."""
    e = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>perfloop report: {e(r['kernel'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>perfloop report: {e(r['kernel'])} on {e(str(r['branch']))}</h1>"]
    parts += [f"<p>{e(line)}</p>" for line in notes]
    for title, content in sections:
        if isinstance(content, bytes):
            parts.append(f"<h2>{e(title)}</h2><figure><img alt=\"{e(title)}\" "
                         f"src=\"{data_uri(content)}\"></figure>")
        elif isinstance(content, list):
            parts.append(f"<h2>{e(title)}</h2>{_edits(content)}")
        else:
            parts.append(f"<h2>{e(title)}</h2>{_table(content)}")
    parts.append("</body></html>\n")
    return "\n".join(parts)
