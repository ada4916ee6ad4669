"""User text into reportlab, always as literal text and never as markup.

Platypus ``Paragraph`` parses an XML-ish markup in which ``<img src=...>`` reads files or
URLs, ``<font>`` takes attribute values reportlab evaluates, and an unbalanced tag raises.
Every string that came from a job's input or params goes through ``para()`` (or is drawn
with ``canvas.drawString``, which never parses) so it is printed exactly as written.
"""

from __future__ import annotations

import html
import re
import unicodedata

# C0 controls (but tab and newline) and DEL: the standard fonts have no glyph for them, and a
# NUL inside markup confuses reportlab's parser.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """Drop control characters that no font can draw; keep tabs and newlines. Accents typed
    as combining marks are composed (NFC): "e" + U+0301 is drawn as the font's "é"."""
    return unicodedata.normalize("NFC", _CONTROL.sub("", text))


# What the renderers' fonts can draw. They use the PDF standard fonts (Helvetica), which
# reportlab encodes as Windows-1252 and backs with Symbol and ZapfDingbats; any other
# character is printed as reportlab's "no glyph" mark, a black box, without a word. These are
# the characters beyond Windows-1252 that Symbol and ZapfDingbats hold (unaccented Greek, math
# signs, arrows, dingbats); test_render_text checks the whole table against reportlab's own.
_FALLBACK_GLYPHS = (
    "\u0391-\u03a1\u03a3-\u03a9\u03b1-\u03c9\u03d1-\u03d2\u03d5-\u03d6\u2032-\u2033"
    "\u2044\u2111\u2118\u211c\u2126\u2135\u2190-\u2195\u21b5\u21d0-\u21d4\u2200"
    "\u2202-\u2203\u2205-\u2209\u220b\u220f\u2211-\u2212\u2217\u221a\u221d-\u221e"
    "\u2220\u2227-\u222b\u2234\u223c\u2245\u2248\u2260-\u2261\u2264-\u2265"
    "\u2282-\u2284\u2286-\u2287\u2295\u2297\u22a5\u22c5\u2320-\u2321\u2329-\u232a"
    "\u2460-\u2469\u25a0\u25b2\u25bc\u25c6\u25ca\u25cf\u25d7\u2605\u260e\u261b\u261e"
    "\u2660\u2663\u2665-\u2666\u2701-\u2704\u2706-\u2709\u270c-\u2727\u2729-\u274b"
    "\u274d\u274f-\u2752\u2756\u2758-\u275e\u2761-\u2794\u2798-\u27af\u27b1-\u27be"
    "\uf6d9-\uf6db\uf8e5-\uf8fe"
)
_WINDOWS_1252 = bytes(range(0x20, 0x7F)).decode() + bytes(range(0x80, 0x100)).decode(
    "cp1252", errors="ignore"
)
_UNDRAWABLE = re.compile(f"[^\t\n\r{re.escape(_WINDOWS_1252)}{_FALLBACK_GLYPHS}]")


def undrawable(text: str) -> str | None:
    """What the fonts cannot draw in ``text`` (its first such character), or None.

    The renderers refuse such text as invalid input, naming the field, rather than print a
    customer's name as a row of black boxes."""
    found = _UNDRAWABLE.search(clean(text))
    if found is None:
        return None
    char = found.group()
    code = f"U+{ord(char):04X} {unicodedata.name(char, '')}".rstrip()
    # A combining mark, space or format character shown alone in quotes is unreadable.
    shown = code if unicodedata.category(char)[0] in "MZC" else f"{char!r} ({code})"
    return (
        f"{shown} is not in the standard PDF fonts (Western European text, unaccented Greek,"
        " some symbols): it would print as a black box"
    )


def undrawable_raw(text: str) -> re.Match[str] | None:
    """A quick first look: None means ``undrawable(text)`` is None too (the converse need not
    hold: control characters and combining accents match here, but not once cleaned)."""
    return _UNDRAWABLE.search(text)


def drawable(text: str) -> str:
    """``text`` with what the fonts cannot draw shown as '?': for a name that is not the
    job's content (an input's file name in a caption), which no one could fix by editing it."""
    return _UNDRAWABLE.sub("?", clean(text))


def para(text: str) -> str:
    """Escape user text for Paragraph markup; newlines become line breaks."""
    lines = clean(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "<br/>".join(html.escape(line, quote=False) for line in lines)


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
