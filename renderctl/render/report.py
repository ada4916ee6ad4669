"""The ``report`` renderer: a CSV file to a titled, paginated table with totals and a chart.

A column is numeric when every non-empty cell parses as a finite ``Decimal``; numeric
columns sort as numbers, are right-aligned, and get a total in the last row.
"""

from __future__ import annotations

import csv
import io
import math
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from reportlab.graphics.charts.barcharts import VerticalBarChart
from reportlab.graphics.shapes import Drawing, String
from reportlab.lib import colors
from reportlab.lib.pagesizes import landscape
from reportlab.lib.units import mm
from reportlab.pdfbase.pdfmetrics import stringWidth
from reportlab.platypus import (
    Flowable,
    LayoutError,
    Paragraph,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)

from renderctl.errors import InvalidInput
from renderctl.render import rules
from renderctl.render.inputs import read_input
from renderctl.render.layout import (
    BAND,
    INK,
    MARGIN,
    MUTED,
    PAGE_SIZE,
    RULE,
    ZEBRA,
    numbered_canvas,
    styles,
)
from renderctl.render.text import (
    PLAIN_NUMBER,
    drawable,
    para,
    plain,
    quoted,
    shortened,
    undrawable,
    undrawable_raw,
)

CHART_ROWS = 30
MAX_INPUT_BYTES = 50_000_000
MAX_COLUMNS = 40
FONT = "Helvetica"
FONT_BOLD = "Helvetica-Bold"
FONT_SIZE = 8.5
CELL_PADDING = 4
ROW_PADDING = 2
# The smallest a table's text is set to make its numbers fit across the page (6 pt is what
# a printed timetable uses); past it the report is refused, naming params.columns.
MIN_FONT_SIZE = 5.5
# A cell is clipped with an ellipsis beyond this share of the page, so one long value
# cannot squeeze every other column to nothing.
MAX_COLUMN_SHARE = 0.45
# How narrow a text column may be squeezed when the columns do not fit at their widths (a
# few characters and an ellipsis); numbers are never clipped.
TEXT_COLUMN_MIN = 36.0
# Beyond this a "number" is a typo or hostile (1e999999 prints a million digits as a total,
# and a chart of it overflows the float range): such a cell is text.
MAX_MAGNITUDE = Decimal("1e30")
# Totals are added in this context, not the thread's (which a python job run earlier in the
# same worker may have left at 6 digits or rounding down): 60 digits keep any sum of cells
# below MAX_MAGNITUDE with up to 30 decimals exact.
SUMS = Context(prec=60)
# reportlab divides a chart's value range into ticks in floats: when every charted value is
# nearer zero than about 1e-306 that arithmetic gives NaN or divides by zero, on every
# attempt. No real figure is that small; this floor stays well clear of where it breaks.
MIN_CHART_SCALE = Decimal("1e-300")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)


@dataclass(frozen=True)
class Column:
    """One CSV column: its header, its position in a row, and whether it is numeric."""

    name: str
    index: int
    numeric: bool


@dataclass(frozen=True)
class Dataset:
    """The parsed CSV: header names and rows of raw strings, all rows as wide as the header."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    # The file line each row starts on (a quoted cell may span lines), for error messages.
    lines: tuple[int, ...] = ()


def load_csv(path: Path) -> Dataset:
    """Read a CSV with a header row; InvalidInput says which line is wrong and why."""
    raw = read_input(path, path.name, max_bytes=MAX_INPUT_BYTES)
    try:
        # Universal newlines, as a text-mode read gives them: a lone \r ends a line too.
        text = raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    if "\0" in text:
        # Valid UTF-8, and no text: UTF-16 without its byte order mark decodes so, every
        # other byte a NUL. Drawn, the NULs vanished and the report looked right, but no
        # cell was a number (no totals, a chart's column "not found"); one NUL in a cell of
        # a real CSV made its whole column text the same way (audit DU).
        line = text.count("\n", 0, text.index("\0")) + 1
        raise InvalidInput(f"{path.name}: line {line} holds a NUL character, which no text "
                           "CSV has (UTF-16 without its byte order mark? save it as UTF-8)")
    # newline="": quoted fields may hold line breaks; csv must see them, not str.splitlines.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise InvalidInput(f"{path.name}: empty CSV (a header row is required)")
        header = [h.strip() for h in header]
        sep = _other_delimiter(text, header)
        if sep is not None:
            # Read as one column of text, it rendered with no numbers and no totals, and the
            # job completed (audit EN); with a comma in a header, as two columns of garbage
            # (review EO). A semicolon export (Excel where the decimal mark is a comma) has
            # decimal commas too, which no delimiter guess would read right.
            kind = "semicolon" if sep == ";" else "tab"
            raise InvalidInput(
                f"{path.name}: the header row is split by {kind}s, not commas "
                f"({quoted(', '.join(header))}): a {kind}-separated file? renderctl reads "
                "comma-separated CSV with '.' as the decimal mark; export it so")
        if len(header) > MAX_COLUMNS:
            raise InvalidInput(f"{path.name}: {len(header)} columns is more than {MAX_COLUMNS}")
        for i, name in enumerate(header):
            if not name:
                raise InvalidInput(f"{path.name}: header column {i + 1} has no name")
            if header.index(name) != i:
                raise InvalidInput(f"{path.name}: header column {quoted(name)} appears twice")
        rows: list[tuple[str, ...]] = []
        lines: list[int] = []
        start = reader.line_num + 1
        for row in reader:
            line, start = start, reader.line_num + 1
            if not row:
                continue  # blank line
            if len(row) != len(header):
                raise InvalidInput(
                    f"{path.name}: line {reader.line_num}: {len(row)} fields, "
                    f"the header has {len(header)}"
                )
            rows.append(tuple(row))
            lines.append(line)
    except csv.Error as exc:
        raise InvalidInput(f"{path.name}: line {reader.line_num}: bad CSV: {exc}") from exc
    return Dataset(header=tuple(header), rows=tuple(rows), lines=tuple(lines))


def _other_delimiter(text: str, header: list[str]) -> str | None:
    """";" or a tab if most of the parsed header's fields hold one and its first line has
    more of it than commas, else None: "region;units" (one field), 'Region;"Revenue, EUR"'
    (two fields of garbage) are refused; "Name,Tags;a;b" and "Name,Notes (a;b),Tags (x;y)"
    (review ER) are not, nor one quoted field ('"Comments; notes"': review EO)."""
    line = text.partition("\n")[0]
    if len(header) == 1 and line.lstrip(" ").startswith('"'):
        return None
    for sep in ";\t":
        holding = sum(1 for field in header if sep in field.strip())
        if holding * 2 > len(header) and line.count(sep) > line.count(","):
            return sep
    return None


def to_decimal(cell: str) -> Decimal | None:
    """A cell as a finite Decimal (thousands commas allowed), or None if it is not a number."""
    text = cell.strip()
    if not text or len(text) > 40:
        return None
    if "," in text:
        # Only a true thousands separator: "1,5" or "2,25" is a decimal comma, and dropping
        # it would read them as 15 and 225.
        if not _THOUSANDS.fullmatch(text):
            return None
        text = text.replace(",", "")
    if not PLAIN_NUMBER.fullmatch(text):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() and value.copy_abs() < MAX_MAGNITUDE else None


def columns_of(data: Dataset) -> tuple[Column, ...]:
    """Each column with its numeric flag (every non-empty cell a number, at least one cell)."""
    result = []
    for index, name in enumerate(data.header):
        cells = [row[index] for row in data.rows if row[index].strip()]
        numeric = bool(cells) and all(to_decimal(cell) is not None for cell in cells)
        result.append(Column(name=name, index=index, numeric=numeric))
    return tuple(result)


def column_total(data: Dataset, column: Column) -> Decimal:
    """The exact Decimal sum of a numeric column's non-empty cells."""
    total = Decimal(0)
    for row in data.rows:
        value = to_decimal(row[column.index])
        if value is not None:
            total = SUMS.add(total, value)
    return total


def format_total(data: Dataset, column: Column, total: Decimal) -> str:
    """A column total with comma grouping and as many decimals as the column's cells use."""
    places = 0
    for row in data.rows:
        value = to_decimal(row[column.index])
        if value is not None:
            exponent = value.as_tuple().exponent
            if isinstance(exponent, int):
                places = max(places, -exponent)
    # (Up to the 30 decimals a cell may have below MAX_MAGNITUDE: capped at 10, a total of
    # 0.1 + 0.000000000001 + 0.2 printed 0.3000000000: audit BI.)
    return f"{total:,.{min(places, 30)}f}"


def render(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Render the CSV in ``inputs[0]`` as a report PDF at ``output``."""
    if len(inputs) != 1:
        raise InvalidInput(f"report takes exactly one input, got {len(inputs)}")
    rules.require("title", params.get("title"), rules.heading)
    title: str = params["title"]
    data = load_csv(inputs[0])
    all_columns = {c.name: c for c in columns_of(data)}
    shown = _pick_columns(params.get("columns"), all_columns)
    totalled = _pick_totals(params.get("totals"), all_columns, shown, data, inputs[0].name)
    rows = _sorted_rows(data, params, all_columns)
    chart_column = _chart_column(params.get("chart"), all_columns, data, inputs[0].name)
    if chart_column is not None:
        _check_chart_scale(rows[:CHART_ROWS], chart_column, data, inputs[0].name)
    printed = [*shown, *([chart_column] if chart_column and chart_column not in shown else [])]
    _check_drawable(data, printed, inputs[0].name)
    try:
        build_pdf(
            title=title,
            source=drawable(inputs[0].name),
            data=Dataset(header=data.header, rows=rows),
            shown=shown,
            totalled=totalled,
            chart=chart_column,
            label=next((c for c in shown if not c.numeric), None),
            output=output,
        )
    except InvalidInput as exc:
        # Named after the file, as every other refusal of its content is, and as plain
        # InvalidInput: the record said "_DoesNotFit: params.columns: ..." (audit DC).
        raise InvalidInput(f"{inputs[0].name}: {exc}") from None


def _missing(field: str, name: str, have: Mapping[str, Column]) -> InvalidInput:
    return InvalidInput(
        f"params.{field}: no column {quoted(name)} in the CSV "
        f"(columns: {', '.join(shortened(c) for c in have)})"
    )


def _pick_columns(value: Any, have: Mapping[str, Column]) -> tuple[Column, ...]:
    if value is None:
        return tuple(have.values())
    rules.require("columns", value, rules.column_names)
    for name in value:
        if name not in have:
            raise _missing("columns", name, have)
    return tuple(have[name] for name in value)


# A numeric column headed so is a key, not a quantity: its total (of invoice numbers, zip
# codes, years) is a meaningless figure printed as if it were one (audit BI). Matched
# against a header's last word, so "Number of orders" is still totalled.
IDENTIFIER_WORDS = frozenset({
    "id", "ids", "no", "nr", "num", "number", "code", "year", "zip", "zipcode", "postcode",
    "ref", "reference", "sku", "ean", "isbn", "phone", "key",
})


# A word before which the identifier word is a unit or a period, not a key: "Sales per
# year", "Units sold this year", "Minutes on phone", "Total number" (review BW).
NOT_BEFORE_IDENTIFIER = frozenset({"per", "this", "each", "on", "of", "by", "total", "a", "an"})


def is_identifier(name: str) -> bool:
    """Whether a column's header names an identifier (``customer_id``, ``Invoice No.``,
    ``customerId``, ``#``); not one in parentheses ("Orders (number)": a unit)."""
    words = re.findall(r"[^\W_]+", name)
    if not words:
        return name.strip() == "#"
    if name.rstrip().endswith(")"):
        return False
    last = words[-1]
    camel = re.findall(r"[A-Z][a-z]+|[a-z]+|[A-Z]+(?![a-z])", last)
    if len(words) > 1 and words[-2].casefold() in NOT_BEFORE_IDENTIFIER:
        return False
    return last.casefold() in IDENTIFIER_WORDS or (
        len(camel) > 1 and camel[-1].casefold() in IDENTIFIER_WORDS)


def _holds_keys(data: Dataset, column: Column) -> bool:
    """Whether every filled cell of ``column`` is a whole number written as digits only, as
    keys are (a cell with decimals, a sign or a thousands separator is a quantity)."""
    return all(re.fullmatch(r"\s*\d+\s*", row[column.index]) or not row[column.index].strip()
               for row in data.rows)


def _pick_totals(
    value: Any, have: Mapping[str, Column], shown: Sequence[Column], data: Dataset,
    source: str,
) -> frozenset[Column]:
    if value is None:
        return frozenset(c for c in shown if c.numeric
                         and not (is_identifier(c.name) and _holds_keys(data, c)))
    rules.require("totals", value, rules.total_names)
    for name in value:
        if name not in have:
            raise _missing("totals", name, have)
        column = have[name]
        if column not in shown:
            raise InvalidInput(f"params.totals: column {quoted(name)} is not among"
                               " params.columns")
        if not column.numeric and data.rows:
            raise InvalidInput(f"params.totals: column {quoted(name)} is not numeric"
                               f"{_why(data, column, source)}")
    return frozenset(have[name] for name in value if have[name].numeric)


def _text_key(cell: str) -> tuple[str, str]:
    """Sort key of a text cell: by its letters without accents, case folded ("Ärger" among
    the A's and "École" among the E's, not after "zulu": audit EN), then as written."""
    base = "".join(c for c in unicodedata.normalize("NFKD", cell.translate(_UNMARKED))
                   if not unicodedata.combining(c))
    return base.casefold(), cell.casefold()


# Letters that carry their mark in themselves (no combining accent to strip): "Øre" sorted
# after "zulu" (review EO).
_UNMARKED = str.maketrans({"Ø": "O", "ø": "o", "Ł": "L", "ł": "l", "Đ": "D", "đ": "d",
                           "Æ": "AE", "æ": "ae", "Œ": "OE", "œ": "oe", "ß": "ss", "Þ": "TH",
                           "þ": "th", "Ð": "D", "ð": "d"})


def _sorted_rows(
    data: Dataset, params: Mapping[str, Any], have: Mapping[str, Column]
) -> tuple[tuple[str, ...], ...]:
    sort_by = params.get("sort_by")
    descending = params.get("descending", False)
    if not isinstance(descending, bool):
        raise InvalidInput("params.descending: expected true or false")
    if sort_by is None:
        return tuple(reversed(data.rows)) if descending else data.rows
    if not isinstance(sort_by, str):
        raise InvalidInput("params.sort_by: expected a column name")
    if sort_by not in have:
        raise _missing("sort_by", sort_by, have)
    column = have[sort_by]
    filled = [row for row in data.rows if row[column.index].strip()]
    empty = [row for row in data.rows if not row[column.index].strip()]
    if column.numeric:
        filled.sort(key=lambda row: to_decimal(row[column.index]) or Decimal(0), reverse=descending)
    else:
        filled.sort(key=lambda row: _text_key(row[column.index]), reverse=descending)
    # Empty cells last either way: a blank is not the largest or the smallest value.
    return tuple(filled + empty)


def _chart_column(
    value: Any, have: Mapping[str, Column], data: Dataset, source: str
) -> Column | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("params.chart: expected a column name")
    if value not in have:
        raise _missing("chart", value, have)
    column = have[value]
    # No rows: no cell says what the column holds, and build_pdf draws no chart anyway; the
    # same params must not fail on an empty export that completes without a chart.
    if not column.numeric and data.rows:
        raise InvalidInput(
            f"params.chart: column {quoted(value)} is not numeric{_why(data, column, source)}"
        )
    return column


def _check_chart_scale(
    charted: Sequence[tuple[str, ...]], column: Column, data: Dataset, source: str
) -> None:
    """InvalidInput unless the rows the chart draws give it a scale (MIN_CHART_SCALE)."""
    values = [(to_decimal(row[column.index]) or Decimal(0)).copy_abs() for row in charted]
    largest = max(values, default=Decimal(0))
    if not 0 < largest < MIN_CHART_SCALE:
        return
    row = charted[values.index(largest)]
    # Sorting keeps the row tuples themselves, so identity finds the row's file line.
    line = next(n for r, n in zip(data.rows, data.lines, strict=True) if r is row)
    raise InvalidInput(
        f"params.chart: column {quoted(column.name)} has no value as large as"
        f" {MIN_CHART_SCALE:g} to scale a chart by ({source} line {line}: the largest charted,"
        f" {quoted(row[column.index])})"
    )


def _check_drawable(data: Dataset, columns: Sequence[Column], source: str) -> None:
    """InvalidInput naming the first header or cell printed that the fonts cannot draw."""
    for column in columns:
        problem = undrawable(column.name)
        if problem is not None:
            raise InvalidInput(f"{source}: header column {quoted(column.name)}: {problem}")
    for row, line in zip(data.rows, data.lines, strict=True):
        # One search of the whole row first: nearly every row passes it, and only a row that
        # fails is looked at cell by cell (where composing accents may still save it).
        if undrawable_raw("\t".join(row[c.index] for c in columns)) is None:
            continue
        for column in columns:
            problem = undrawable(row[column.index])
            if problem is not None:
                raise InvalidInput(
                    f"{source} line {line}, column {quoted(column.name)}: {problem}"
                )


def _why(data: Dataset, column: Column, source: str) -> str:
    """Where a column stops being numeric: the first filled cell that is not a number."""
    for row, line in zip(data.rows, data.lines, strict=False):
        cell = row[column.index]
        if cell.strip() and to_decimal(cell) is None:
            return (
                f" ({source} line {line}, column {quoted(column.name)}: {quoted(cell)} is not a"
                f" number below {MAX_MAGNITUDE:g})"
            )
    return ""


def build_pdf(
    *,
    title: str,
    source: str,
    data: Dataset,
    shown: Sequence[Column],
    totalled: Collection[Column],
    chart: Column | None,
    label: Column | None,
    output: Path,
) -> None:
    """Lay out the report: title, summary line, optional chart, then the table with totals."""
    st = styles()
    pagesize = landscape(PAGE_SIZE) if len(shown) > 6 else PAGE_SIZE
    try:
        table = _table(data, shown, totalled, pagesize[0] - 2 * MARGIN)
        if pagesize is PAGE_SIZE and table.font_size < FONT_SIZE:
            raise _DoesNotFit("")
    except _DoesNotFit:
        if pagesize is not PAGE_SIZE:
            raise
        # Few columns, but wide numbers: across a landscape page before smaller type, or
        # a refusal (review BK: five columns of 28-digit sums were refused upright).
        pagesize = landscape(PAGE_SIZE)
        table = _table(data, shown, totalled, pagesize[0] - 2 * MARGIN)
    width = pagesize[0] - 2 * MARGIN
    story: list[Any] = [
        Paragraph(para(title), st.title),
        Spacer(1, 2 * mm),
        Paragraph(para(f"{len(data.rows)} {'row' if len(data.rows) == 1 else 'rows'} from "
                       f"{source}"), st.small),
        Spacer(1, 6 * mm),
    ]
    if chart is not None and data.rows:
        story += [_bar_chart(data, chart, label, width), Spacer(1, 6 * mm)]
    story.append(table)
    pdf = SimpleDocTemplate(
        str(output),
        pagesize=pagesize,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN + 6 * mm,
        title=plain(title),
        invariant=True,
    )
    try:
        pdf.build(story, canvasmaker=numbered_canvas(plain(title)))
    except LayoutError as exc:
        raise InvalidInput(f"content does not fit on a page: {str(exc)[:200]}") from exc


def _clip(text: str, font: str, limit: float, size: float = FONT_SIZE) -> str:
    if stringWidth(text, font, size) <= limit:
        return text
    while text and stringWidth(text + "…", font, size) > limit:
        text = text[: max(0, min(len(text) - 1, int(len(text) * 0.9)))]
    return text + "…"


class _DoesNotFit(InvalidInput):
    """The columns' numbers do not fit across the page at MIN_FONT_SIZE."""


def _table(data: Dataset, shown: Sequence[Column], totalled: Collection[Column],
           width: float) -> _PagedTable:
    # Plain strings, not Paragraphs: reportlab draws them verbatim (no markup) and fast.
    header = [plain(c.name) for c in shown]
    body = [[plain(row[c.index]) for c in shown] for row in data.rows]
    totals_row: list[str] | None = None
    if data.rows and any(c in totalled for c in shown):
        totals_row = [
            format_total(data, c, column_total(data, c)) if c in totalled else ""
            for c in shown
        ]
        # Labelled in the first column without a total (the first column when it has
        # none): with a number there, the row had no label at all (audit BS).
        first_free = next((i for i, c in enumerate(shown) if c not in totalled), None)
        if first_free is not None:
            totals_row[first_free] = "Total"
    widths, size = _layout(shown, header, body, totals_row, width)
    limits = [w - 2 * CELL_PADDING for w in widths]
    header = _header_names(header, limits, size)
    for i, limit in enumerate(limits):
        for row in (*body, *([totals_row] if totals_row else [])):
            row[i] = _clip(row[i], FONT, limit, size)
    commands: list[tuple[Any, ...]] = [
        ("FONT", (0, 0), (-1, 0), FONT_BOLD, size),
        ("FONT", (0, 1), (-1, -1), FONT, size),
        ("TEXTCOLOR", (0, 0), (-1, -1), INK),
        ("BACKGROUND", (0, 0), (-1, 0), BAND),
        ("LINEBELOW", (0, 0), (-1, 0), 0.8, INK),
        ("ROWBACKGROUNDS", (0, 1), (-1, -1), [colors.white, ZEBRA]),
        ("TOPPADDING", (0, 0), (-1, -1), ROW_PADDING),
        ("BOTTOMPADDING", (0, 0), (-1, -1), ROW_PADDING),
        ("LEFTPADDING", (0, 0), (-1, -1), CELL_PADDING),
        ("RIGHTPADDING", (0, 0), (-1, -1), CELL_PADDING),
    ]
    for i, c in enumerate(shown):
        if c.numeric:
            commands.append(("ALIGN", (i, 0), (i, -1), "RIGHT"))
    # The last row's commands: they belong only to the table piece that ends the report.
    last: list[tuple[Any, ...]]
    if totals_row:
        last = [
            ("FONT", (0, -1), (-1, -1), FONT_BOLD, size),
            ("LINEABOVE", (0, -1), (-1, -1), 0.8, INK),
            ("BACKGROUND", (0, -1), (-1, -1), colors.white),
        ]
    else:
        last = [("LINEBELOW", (0, -1), (-1, -1), 0.25, RULE)]
    return _PagedTable(header, body, totals_row, widths, commands, last, font_size=size)


def _layout(shown: Sequence[Column], header: list[str], body: list[list[str]],
            totals_row: list[str] | None, width: float) -> tuple[list[float], float]:
    """Each column's width across ``width``, and the table's font size.

    A column is as wide as its widest cell (at most MAX_COLUMN_SHARE of the page), spread to
    fill the page. When they do not fit, text columns give way down to TEXT_COLUMN_MIN and
    numeric ones down to their widest number (their headers may be clipped, a number
    never); when even that does not fit, the text gets smaller, down to MIN_FONT_SIZE; past
    that, InvalidInput. Shrunk all alike, 20 numeric columns printed '1296...', 40 printed
    '...', and their totals, never clipped, ran into each other and past the margin
    (audit BI)."""
    # Each column's widest value and its header in 1 pt type: a string's width is linear
    # in the size, so every size below is judged without measuring a cell again.
    values = [max((stringWidth(s, FONT_BOLD, 1.0) for s in
                   (*(r[i] for r in body), *([totals_row[i]] if totals_row else []))),
                  default=0.0) for i in range(len(shown))]
    heads = [stringWidth(h, FONT_BOLD, 1.0) for h in header]
    cap = width * MAX_COLUMN_SHARE

    def widths_at(size: float) -> tuple[list[float], list[float]]:
        # A number's own width is never capped (review BK: a 27-digit total was clipped).
        least = [v * size + 2 * CELL_PADDING if c.numeric else 0.0
                 for v, c in zip(values, shown, strict=True)]
        natural = [max(lo, min(cap, max(v, h) * size + 2 * CELL_PADDING))
                   for lo, v, h in zip(least, values, heads, strict=True)]
        least = [lo if c.numeric else min(n, TEXT_COLUMN_MIN)
                 for lo, n, c in zip(least, natural, shown, strict=True)]
        return natural, least

    size = FONT_SIZE
    natural, least = widths_at(size)
    if sum(least) > width:
        if (need := sum(widths_at(MIN_FONT_SIZE)[1])) > width:
            raise _DoesNotFit(
                f"params.columns: {len(shown)} columns do not fit across the page even in "
                f"{MIN_FONT_SIZE:g} pt type (they need {need:.0f} pt of {width:.0f}); "
                "choose fewer with params.columns")
        low, high = MIN_FONT_SIZE, FONT_SIZE  # the largest size whose numbers fit
        for _ in range(24):
            mid = (low + high) / 2
            low, high = (mid, high) if sum(widths_at(mid)[1]) <= width else (low, mid)
        size = low
        natural, least = widths_at(size)
    if sum(natural) <= width:
        return [w * width / sum(natural) for w in natural], size
    give = (width - sum(least)) / (sum(natural) - sum(least))
    return [lo + (hi - lo) * give for lo, hi in zip(least, natural, strict=True)], size


class _PagedTable(Flowable):
    """The report's table, handed to reportlab one page at a time.

    One Table of every row was quadratic: at each page break reportlab builds the rest as a
    new Table and measures all of its rows again (10k rows 5.4 s, 40k 71 s). This flowable
    gives reportlab a Table of only a page's worth of rows (plus a margin) and lets that
    Table choose the split, so each page's piece is what the single Table would have drawn:
    header repeated, same zebra (it restarts on each page there too), totals at the end.
    """

    def __init__(
        self,
        header: list[str],
        body: list[list[str]],
        totals_row: list[str] | None,
        widths: list[float],
        commands: list[tuple[Any, ...]],
        last: list[tuple[Any, ...]],
        start: int = 0,
        font_size: float = FONT_SIZE,
    ) -> None:
        super().__init__()
        self._parts = (header, body, totals_row, widths, commands, last)
        self._start = start
        self.font_size = font_size
        # Every cell is one line of plain text, so every row is this tall, computed as
        # reportlab would (leading 1.2 x size, then the paddings). Given up front, reportlab
        # no longer re-measures every remaining row at each page break (quadratic).
        self._row_height = font_size * 1.2 + (ROW_PADDING + ROW_PADDING)
        self._piece: Table | None = None
        self.hAlign = "CENTER"  # as Table's default, so the frame places it the same

    def _window(self, avail_height: float) -> Table:
        header, body, totals_row, widths, commands, last = self._parts
        # Two rows more than can fit, so a piece that is not the end always overflows and
        # reportlab splits it exactly where it would have split the whole table.
        end = self._start + int(avail_height // self._row_height) + 2
        rows = [header, *body[self._start : end]]
        style = list(commands)
        if end >= len(body):
            if totals_row:
                rows.append(totals_row)
            style += last
        return Table(
            rows,
            colWidths=widths,
            rowHeights=[self._row_height] * len(rows),
            repeatRows=1,
            style=TableStyle(style),
        )

    def wrap(self, availWidth: float, availHeight: float) -> tuple[float, float]:  # noqa: N803
        self._piece = self._window(availHeight)
        width, height = self._piece.wrap(availWidth, availHeight)
        self.width, self.height = width, height
        return width, height

    def split(self, availWidth: float, availHeight: float) -> list[Flowable]:  # noqa: N803
        piece = self._window(availHeight)
        parts = piece.split(availWidth, availHeight)
        if len(parts) != 2:
            return parts  # [] (nothing fits here) or [piece] (the rest fits)
        taken = len(parts[0]._cellvalues) - 1  # body rows on this page, without the header
        header, body, totals_row, widths, commands, last = self._parts
        if self._start + taken >= len(body):
            if not totals_row or taken < 2:
                return parts  # only the totals row moves on: reportlab's own second piece
            # The totals row alone on the last page, under a repeated header, read as a
            # report of no rows (audit BS): the last body row goes on with it.
            taken -= 1
            rows = [header, *body[self._start : self._start + taken]]
            parts = [Table(rows, colWidths=widths, rowHeights=[self._row_height] * len(rows),
                           repeatRows=1, style=TableStyle(list(commands)))]
        rest = _PagedTable(
            header, body, totals_row, widths, commands, last, start=self._start + taken,
            font_size=self.font_size,
        )
        return [parts[0], rest]

    def draw(self) -> None:
        assert self._piece is not None, "reportlab wraps a flowable before drawing it"
        # Draw on this flowable's canvas as it stands (drawOn would add a save/translate
        # pair, and the bytes would differ from a plain Table's for nothing).
        self._piece.canv = self.canv
        try:
            self._piece.draw()
        finally:
            del self._piece.canv


def _bar_chart(data: Dataset, column: Column, label: Column | None, width: float) -> Drawing:
    rows = data.rows[:CHART_ROWS]
    values = [float(to_decimal(row[column.index]) or 0) for row in rows]
    names = _chart_names([plain(row[label.index]) for row in rows] if label else [])
    height = 70 * mm
    drawing = Drawing(width, height)
    chart = VerticalBarChart()
    low, high = min(0.0, min(values)), max(0.0, max(values))
    # Room on the left for the widest value label (a fixed 40 pt: "500,000,000,000" ran
    # into the margin, and past the page at 1e28: audit BS). Ticks round outwards, to the
    # next power of ten at most.
    widest = max(stringWidth(_axis_label(_rounded_out(v)), FONT, 7) for v in (low, high))
    chart.x, chart.y = max(40.0, widest + 8), 45
    chart.width, chart.height = width - chart.x - 10, height - 65
    chart.data = [values]
    chart.bars[0].fillColor = colors.HexColor("#3e4c59")
    chart.bars[0].strokeColor = None
    # Zero on the axis whatever the values' sign: bars of negative values only hung from
    # the highest of them, their lengths out of proportion, the smallest one not drawn
    # (audit BS).
    chart.valueAxis.valueMin = low
    if high == 0.0 and low < 0.0:
        chart.valueAxis.valueMax = 0.0
    chart.valueAxis.labelTextFormat = _axis_label
    chart.valueAxis.labels.fontName = FONT
    chart.valueAxis.labels.fontSize = 7
    chart.valueAxis.strokeColor = RULE
    chart.valueAxis.gridStrokeColor = RULE
    chart.valueAxis.visibleGrid = True
    chart.categoryAxis.categoryNames = names
    chart.categoryAxis.labels.fontName = FONT
    chart.categoryAxis.labels.fontSize = 6
    chart.categoryAxis.labels.angle = 45
    chart.categoryAxis.labels.boxAnchor = "ne"
    # Below the lowest value, not at the zero line: drawn there, the names of negative bars
    # were printed over the bars (audit BI).
    chart.categoryAxis.labelAxisMode = "low"
    chart.categoryAxis.strokeColor = RULE
    drawing.add(chart)
    caption = (
        f"{column.name}, first {len(rows)} rows" if len(data.rows) > len(rows) else column.name
    )
    drawing.add(String(0, height - 10, _clip(plain(caption), FONT_BOLD, width, size=8),
                       fontName=FONT_BOLD, fontSize=8, fillColor=MUTED))
    return drawing


def _header_names(full: list[str], limits: list[float], size: float) -> list[str]:
    """Each header cut to its column's width at its end. Those this makes alike where they
    differ ("Amount…" for "Amount 1" to "Amount 20", 12 columns of 20 not told apart: audit
    EN) lose the words they all share first ("…10", "…20"; cut in the middle instead,
    "Amount 10" and "Amount 20" both printed "Am…0": review EO), then what is left is cut
    in its middle, and any still alike are numbered ("#12")."""
    names = [_clip(n, FONT_BOLD, lim, size) for n, lim in zip(full, limits, strict=True)]

    def alike() -> list[int]:
        return [i for i, n in enumerate(names) if names.count(n) > 1 and n != full[i]]

    same = alike()
    if not same:
        return names
    short: dict[int, str] = {}
    for clipped in {names[i] for i in same}:  # (each group of alike ones on its own)
        group = [i for i in same if names[i] == clipped]
        short.update(zip(group, _without_common_words([full[i] for i in group]), strict=True))
    for i in same:
        names[i] = _clip(short[i], FONT_BOLD, limits[i], size)
    for i in alike():
        names[i] = _clip_middle(short.get(i, full[i]), FONT_BOLD, limits[i], size)
    for i in alike():
        names[i] = f"#{i + 1}"
    return names


CHART_NAME_WIDTH = 60  # points a bar's name may take, under the chart


def _chart_names(full: list[str]) -> list[str]:
    """The bars' names as printed: each cut to CHART_NAME_WIDTH at its end; where that
    makes different names alike ("Region num…" for every "Region number N with a longer
    label": audit BS), cut in the middle instead ("Regi…label 17"), and where even that
    does not tell them apart, the rows' numbers in the table."""
    if not full:
        return []
    for names in ([_clip(n, FONT, CHART_NAME_WIDTH) for n in full],
                  [_clip_middle(n, FONT, CHART_NAME_WIDTH) for n in full],
                  [_clip(n, FONT, CHART_NAME_WIDTH) for n in _without_common_words(full)]):
        if len(set(names)) == len(set(full)):
            return names
    return [str(i) for i in range(1, len(full) + 1)]


def _without_common_words(names: list[str]) -> list[str]:
    """``names`` without the words they all start and all end with, marked by an ellipsis:
    "Region number 7 with a longer label" -> "…7…"."""
    split = [n.split(" ") for n in names]
    shortest = min(len(w) for w in split)
    head = 0
    while head < shortest - 1 and len({tuple(w[: head + 1]) for w in split}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head - 1 and len({tuple(w[len(w) - tail - 1 :]) for w in split}) == 1:
        tail += 1
    return [("…" if head else "") + " ".join(w[head : len(w) - tail]) + ("…" if tail else "")
            for w in split]


def _clip_middle(text: str, font: str, limit: float, size: float = FONT_SIZE) -> str:
    """``text`` cut in its middle (its start and its end kept) to fit ``limit``: the most
    characters kept that fit, found by bisection (one at a time, a label of 8,000
    characters took a minute: review BW)."""
    if stringWidth(text, font, size) <= limit:
        return text

    def kept(keep: int) -> str:
        return f"{text[: (keep + 1) // 2]}…{text[len(text) - keep // 2 :]}"

    low, high = 0, len(text) - 1  # kept(low) fits (or nothing does); kept(high + 1) is text
    if stringWidth(kept(0), font, size) > limit:
        return "…"
    while low < high:
        mid = (low + high + 1) // 2
        if stringWidth(kept(mid), font, size) <= limit:
            low = mid
        else:
            high = mid - 1
    return kept(low)


def _axis_label(value: float) -> str:
    """A value axis label: grouped, with the decimals it has (reportlab's "%s" printed
    500000000000, and float noise such as 999999999999166239473664 for 1e24)."""
    if value and not 1e-6 <= abs(value) < 1e15:
        return f"{value:.3g}"
    if float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.6f}".rstrip("0").rstrip(".")


def _rounded_out(value: float) -> float:
    """``value`` rounded away from zero to a power of ten (what a tick can reach)."""
    if value == 0:
        return 0.0
    return math.copysign(10 ** math.ceil(math.log10(abs(value))), value)
