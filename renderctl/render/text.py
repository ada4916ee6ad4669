"""User text into reportlab, always as literal text and never as markup.

Platypus ``Paragraph`` parses an XML-ish markup in which ``<img src=...>`` reads files or
URLs, ``<font>`` takes attribute values reportlab evaluates, and an unbalanced tag raises.
Every string that came from a job's input or params goes through ``para()`` (or is drawn
with ``canvas.drawString``, which never parses) so it is printed exactly as written.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

# C0 controls (but tab and newline) and DEL: the standard fonts have no glyph for them, and a
# NUL inside markup confuses reportlab's parser.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """Drop control characters that no font can draw; keep tabs and newlines."""
    return _CONTROL.sub("", text)


def para(text: str) -> str:
    """Escape user text for Paragraph markup; newlines become line breaks."""
    lines = clean(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "<br/>".join(escape(line) for line in lines)


def para_lines(lines: list[str]) -> str:
    """Escape several user lines and join them with line breaks."""
    return "<br/>".join(para(line) for line in lines)


def plain(text: str) -> str:
    """One line of user text for a plain table cell or ``drawString`` (no markup is parsed)."""
    return " ".join(clean(text).split())


def shortened(value: object, limit: int = 40) -> str:
    """A user's value for an error message, cut to ``limit`` characters and an ellipsis.

    Messages end up in one-line listings (``dead list``); a value pasted back whole would
    let one 5,000-digit field fill the screen."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def quoted(value: object, limit: int = 40) -> str:
    """``repr`` of a user's value for an error message, cut like ``shortened``."""
    return repr(shortened(value, limit))


# A number as people write one in data: ASCII digits, a point, an exponent. Decimal() also
# takes "1_000" (Python's digit grouping: "2024_01" would total as 202401), "١٢٣" and
# other scripts' digits, "Infinity" and "NaN": none of those is a number in a CSV or JSON.
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
