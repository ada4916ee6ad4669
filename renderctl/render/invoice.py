"""The ``invoice`` renderer: a JSON invoice document to a paginated PDF.

Money is ``Decimal`` end to end (JSON floats are parsed as ``Decimal``): each line's net is
quantity x unit price rounded half-up to the currency's minor unit (cents, or whole yen, or
thousandths of a dinar); tax is computed per rate on the sum of that rate's nets, rounded
half-up the same; the total is net plus tax. ``compute_totals`` and
``format_money`` hold that arithmetic and are tested on their own.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation, localcontext
from pathlib import Path
from typing import Any

from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import mm
from reportlab.pdfbase.pdfmetrics import stringWidth
from reportlab.platypus import (
    KeepTogether,
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
    para,
    para_lines,
    plain,
    quoted,
    shortened,
    undrawable,
)

# ISO 4217 currencies whose minor unit is not the cent (the rest have two decimals): a yen
# invoice printed 'JPY 1,122.03', a dinar one rounded 0.125 to 0.13 (audit BI).
MINOR_UNIT_PLACES = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF",
                     "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
# Money is computed in this context, never the thread's: Decimal's default 28 digits round a
# product of two allowed numbers (36 digits) before it is rounded to cents, which can move
# the cent; and a python job earlier in the same worker may have changed the thread's
# context. 50 digits hold every product, sum and tax below MAX_AMOUNT exactly.
MONEY = Context(prec=50)
# Bounds that keep Decimal arithmetic and layout sane; beyond them the input is a mistake.
MAX_ABS_NUMBER = Decimal("1e12")
MAX_PLACES = 6
MAX_ITEMS = 10_000
MAX_TEXT = 1_000
MAX_LINE = 200  # names and address lines: one block must fit on one page
MAX_NOTES = 10_000
MAX_INPUT_BYTES = 20_000_000
# An invoice is 3 levels deep; far deeper JSON is hostile and would exhaust the recursion
# limit inside the parser, which is a property of the file, not a retryable failure.
MAX_NESTING = 100
# Sums (net, tax, total) stay below 10^26: with cents that is the 28 digits anyone checking
# the invoice with Decimal's default context can reproduce exactly (30 for a 4-decimal
# currency; MONEY's 50 keep ours exact either way); no real invoice nears it.
MAX_AMOUNT = Decimal("1e26")

_CURRENCY = re.compile(r"[A-Z]{3}")
_TOP_FIELDS = {"number", "date", "due_date", "currency", "seller", "customer", "items", "notes"}
_REQUIRED_TOP = ("number", "date", "currency", "seller", "customer", "items")
_PARTY_FIELDS = {"name", "address", "vat_id"}
_ITEM_FIELDS = {"description", "quantity", "unit_price", "tax_rate"}


@dataclass(frozen=True)
class Party:
    """Seller or customer: name, address lines, optional VAT id."""

    name: str
    address: tuple[str, ...]
    vat_id: str | None = None


@dataclass(frozen=True)
class Item:
    """One invoice line as given (tax_rate is a fraction: 0.2 means 20%)."""

    description: str
    quantity: Decimal
    unit_price: Decimal
    tax_rate: Decimal = Decimal(0)


@dataclass(frozen=True)
class Invoice:
    """A validated invoice document."""

    number: str
    date: dt.date
    currency: str
    seller: Party
    customer: Party
    items: tuple[Item, ...]
    due_date: dt.date | None = None
    notes: str | None = None


@dataclass(frozen=True)
class TaxLine:
    """The tax charged at one rate: the base it applies to and the rounded amount."""

    rate: Decimal
    base: Decimal
    tax: Decimal


@dataclass(frozen=True)
class Totals:
    """An invoice's money: each line's net, the tax per rate, and the sums."""

    line_nets: tuple[Decimal, ...]
    net: Decimal
    taxes: tuple[TaxLine, ...]
    tax: Decimal
    total: Decimal


# -- arithmetic ----------------------------------------------------------------------------


def places_of(currency: str) -> int:
    """The decimals of ``currency``'s minor unit (2 unless MINOR_UNIT_PLACES says)."""
    return MINOR_UNIT_PLACES.get(currency, 2)


def round_money(amount: Decimal, currency: str) -> Decimal:
    """Round to the currency's minor unit, half away from zero (EUR 0.005 -> 0.01, -0.005
    -> -0.01; JPY 0.5 -> 1); a zero is never negative ("-0.00" for a tiny credit)."""
    rounded = amount.quantize(Decimal(1).scaleb(-places_of(currency)), rounding=ROUND_HALF_UP,
                              context=MONEY)
    return rounded if rounded else abs(rounded)


def compute_totals(doc: Invoice) -> Totals:
    """Line nets, tax per rate on the sum of that rate's nets, and the grand total.

    InvalidInput names the item at which the net total, or the total, passes MAX_AMOUNT."""
    with localcontext(MONEY):
        return _compute_totals(doc)


def _compute_totals(doc: Invoice) -> Totals:
    nets_list: list[Decimal] = []
    running = Decimal(0)
    for i, item in enumerate(doc.items):
        line_net = round_money(item.quantity * item.unit_price, doc.currency)
        running += line_net
        if abs(running) >= MAX_AMOUNT:
            raise InvalidInput(
                f"items[{i}]: the net total reaches {running:.4g}, "
                f"more than an invoice can hold (limit {MAX_AMOUNT:.0e})"
            )
        nets_list.append(line_net)
    nets = tuple(nets_list)
    base_by_rate: dict[Decimal, Decimal] = {}
    for item, line_net in zip(doc.items, nets, strict=True):
        # normalize(): 0.2 and 0.20 are one rate, not two tax lines.
        rate = item.tax_rate.normalize()
        base_by_rate[rate] = base_by_rate.get(rate, Decimal(0)) + line_net
    taxes = tuple(
        TaxLine(rate=rate, base=base, tax=round_money(base * rate, doc.currency))
        for rate, base in sorted(base_by_rate.items())
    )
    net = sum(nets, Decimal(0))
    tax = sum((t.tax for t in taxes), Decimal(0))
    if abs(net + tax) >= MAX_AMOUNT:
        raise InvalidInput(
            f"items: the total with tax reaches {net + tax:.4g}, "
            f"more than an invoice can hold (limit {MAX_AMOUNT:.0e})"
        )
    return Totals(line_nets=nets, net=net, taxes=taxes, tax=tax, total=net + tax)


def format_amount(amount: Decimal, *, min_places: int = 2) -> str:
    """Comma-grouped amount with at least ``min_places`` decimals (more if the value has them)."""
    exponent = amount.as_tuple().exponent
    places = max(min_places, -exponent if isinstance(exponent, int) else 0)
    if places == min_places:
        amount = amount.quantize(
            Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP, context=MONEY
        )
    return f"{amount if amount else abs(amount):,.{places}f}"  # (never "-0.00")


def format_money(currency: str, amount: Decimal) -> str:
    """``EUR 1,234.56``: the currency code, then the amount rounded half-up to its minor
    unit (``JPY 1,122``, ``BHD 4.240``)."""
    return f"{currency} {round_money(amount, currency):,.{places_of(currency)}f}"


def format_rate(rate: Decimal) -> str:
    """A fractional tax rate as a percentage: 0.2 -> ``20%``, 0.055 -> ``5.5%``."""
    return f"{MONEY.multiply(rate, 100).normalize(MONEY):f}%"


def format_quantity(quantity: Decimal) -> str:
    """A quantity without exponent notation or trailing zeros: 2.50 -> ``2.5``."""
    return f"{quantity.normalize(MONEY) if quantity else Decimal(0):f}"  # (never "-0")


# -- parsing and validation ----------------------------------------------------------------


def load_invoice(path: Path) -> Invoice:
    """Read and validate an invoice JSON file; InvalidInput names the offending field."""
    raw = read_input(path, path.name, max_bytes=MAX_INPUT_BYTES)
    try:
        # Decode ourselves: json.loads(bytes) would guess UTF-16/32 from the first bytes.
        text = raw.decode("utf-8-sig")
        data = json.loads(text, parse_float=Decimal, parse_int=Decimal,
                          parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path.name}: not UTF-8 text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{path.name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:  # NaN/Infinity, or an absurdly long integer
        raise InvalidInput(f"{path.name}: not valid JSON: {exc}") from exc
    except InvalidOperation as exc:
        # Decimal refuses an exponent past its range (1e99999999999999999999) with an
        # ArithmeticError, not a ValueError; the same bytes fail so on every attempt.
        raise InvalidInput(
            f"{path.name}: not valid JSON: a number's exponent is beyond any amount"
        ) from exc
    except RecursionError:
        line, column = _too_deep(text)
        raise InvalidInput(
            f"{path.name}: line {line} column {column}: arrays/objects nested more than "
            f"{MAX_NESTING} deep"
        ) from None
    try:
        return parse_invoice(data)
    except InvalidInput as exc:  # the field, as the file's: DESIGN names file and field
        raise InvalidInput(f"{path.name}: {exc}") from None


_NESTING_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _too_deep(text: str) -> tuple[int, int]:
    """Line and column (1-based) where nesting first passes MAX_NESTING; run only after the
    parser gave up, so valid documents never pay for the scan."""
    depth = 0
    for match in _NESTING_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                start = match.start()
                line_start = text.rfind("\n", 0, start) + 1
                return text.count("\n", 0, start) + 1, start - line_start + 1
        elif token in "]}":
            depth -= 1
    return 1, 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an invoice can hold")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys each appear once: json keeps the last of a repeated one, so
    {"currency": "SEK", ..., "currency": "JPY"} became a yen invoice, unsaid (audit DU)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {quoted(key)} appears twice in one object")
        out[key] = value
    return out


def parse_invoice(data: Any) -> Invoice:
    """Validate an already-decoded JSON document into an ``Invoice``."""
    obj = _object(data, "", _TOP_FIELDS)
    for name in _REQUIRED_TOP:
        if name not in obj:
            raise InvalidInput(f"{name}: required field is missing")
    currency = _string(obj["currency"], "currency", max_len=3)
    if not _CURRENCY.fullmatch(currency):
        raise InvalidInput(f"currency: {currency!r} is not a 3-letter ISO 4217 code like 'EUR'")
    date = _date(obj["date"], "date")
    due_date = _date(obj["due_date"], "due_date") if obj.get("due_date") is not None else None
    if due_date is not None and due_date < date:
        raise InvalidInput(f"due_date: {due_date.isoformat()} is before date {date.isoformat()}")
    items_raw = obj["items"]
    if not isinstance(items_raw, list):
        raise InvalidInput(f"items: expected a list, got {_json_type(items_raw)}")
    if not items_raw:
        raise InvalidInput("items: an invoice needs at least one item")
    if len(items_raw) > MAX_ITEMS:
        raise InvalidInput(f"items: {len(items_raw)} items is more than {MAX_ITEMS}")
    notes = obj.get("notes")
    return Invoice(
        number=_string(obj["number"], "number", max_len=64),
        date=date,
        due_date=due_date,
        currency=currency,
        seller=_party(obj["seller"], "seller"),
        customer=_party(obj["customer"], "customer"),
        items=tuple(_item(raw, f"items[{i}]") for i, raw in enumerate(items_raw)),
        notes=None if notes is None else _string(notes, "notes", max_len=MAX_NOTES, empty=True),
    )


def _object(value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where or 'document'}: expected an object, got {_json_type(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise InvalidInput(
            f"{prefix}{shortened(unknown[0])}: unknown field "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
    return value


def _party(value: Any, where: str) -> Party:
    obj = _object(value, where, _PARTY_FIELDS)
    for name in ("name", "address"):
        if name not in obj:
            raise InvalidInput(f"{where}.{name}: required field is missing")
    address = obj["address"]
    if not isinstance(address, list):
        raise InvalidInput(f"{where}.address: expected a list of lines, got {_json_type(address)}")
    if len(address) > 10:
        raise InvalidInput(f"{where}.address: {len(address)} lines is more than 10")
    vat_id = obj.get("vat_id")
    return Party(
        name=_string(obj["name"], f"{where}.name", max_len=MAX_LINE),
        address=tuple(
            _string(line, f"{where}.address[{i}]", max_len=MAX_LINE, empty=True)
            for i, line in enumerate(address)
        ),
        vat_id=None if vat_id is None else _string(vat_id, f"{where}.vat_id", max_len=64),
    )


def _item(value: Any, where: str) -> Item:
    obj = _object(value, where, _ITEM_FIELDS)
    for name in ("description", "quantity", "unit_price"):
        if name not in obj:
            raise InvalidInput(f"{where}.{name}: required field is missing")
    tax_rate = _number(obj.get("tax_rate", Decimal(0)), f"{where}.tax_rate")
    if not Decimal(0) <= tax_rate <= Decimal(1):
        raise InvalidInput(
            f"{where}.tax_rate: {tax_rate} is not a fraction between 0 and 1 (0.2 means 20%)"
        )
    return Item(
        description=_string(obj["description"], f"{where}.description"),
        quantity=_number(obj["quantity"], f"{where}.quantity"),
        unit_price=_number(obj["unit_price"], f"{where}.unit_price"),
        tax_rate=tax_rate,
    )


def _string(value: Any, where: str, *, max_len: int = MAX_TEXT, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: expected a string, got {_json_type(value)}")
    if not empty and not plain(value):  # control characters are dropped when drawn
        raise InvalidInput(f"{where}: must not be empty")
    if len(value) > max_len:
        raise InvalidInput(f"{where}: {len(value)} characters is more than {max_len}")
    problem = undrawable(value)
    if problem is not None:
        raise InvalidInput(f"{where}: {problem}")
    return value


def _number(value: Any, where: str) -> Decimal:
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, str):
        if not PLAIN_NUMBER.fullmatch(value.strip()):
            raise InvalidInput(f"{where}: not a number: {quoted(value)}")
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise InvalidInput(f"{where}: not a number: {quoted(value)}") from None
    else:
        raise InvalidInput(f"{where}: not a number (got {_json_type(value)})")
    if not number.is_finite():
        raise InvalidInput(f"{where}: not a finite number: {quoted(value)}")
    if number.copy_abs() >= MAX_ABS_NUMBER:  # copy_abs: exact, whatever the thread's context
        raise InvalidInput(
            f"{where}: {shortened(value)} is too large (limit {MAX_ABS_NUMBER:,f})"
        )
    exponent = number.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > MAX_PLACES:
        raise InvalidInput(
            f"{where}: {shortened(value)} has more than {MAX_PLACES} decimal places"
        )
    return number


def _date(value: Any, where: str) -> dt.date:
    text = _string(value, where, max_len=10)
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{where}: {text!r} is not a date like 2025-01-31") from None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, Decimal | int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# -- layout --------------------------------------------------------------------------------

_CONTENT_WIDTH = PAGE_SIZE[0] - 2 * MARGIN
# #, description, quantity, unit price, tax, amount: description takes what is left.
_COL_WIDTHS = (8 * mm, None, 18 * mm, 28 * mm, 16 * mm, 30 * mm)
_DESC_WIDTH = _CONTENT_WIDTH - sum(w for w in _COL_WIDTHS if w is not None)
_ITEM_COLUMNS = [w if w is not None else _DESC_WIDTH for w in _COL_WIDTHS]
_ITEM_HEADER = ["#", "Description", "Qty", "Unit price", "Tax", "Amount"]
_CELL_PADDING = 6  # reportlab's default left and right padding in a table cell
_ROW_PADDING = 3 + 3  # the items table's top and bottom padding
_HEADER_ROW_HEIGHT = 8.5 * 1.2  # one line of the header's 8.5 pt font, at reportlab's leading
_META_VALUE_WIDTH = 45 * mm

_ITEM_STYLE = TableStyle(
    [
        ("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 8.5),
        ("FONT", (0, 1), (-1, -1), "Helvetica", 9),
        ("TEXTCOLOR", (0, 0), (-1, 0), INK),
        ("BACKGROUND", (0, 0), (-1, 0), BAND),
        ("LINEBELOW", (0, 0), (-1, 0), 0.8, INK),
        ("LINEBELOW", (0, 1), (-1, -1), 0.25, RULE),
        ("ALIGN", (2, 0), (-1, -1), "RIGHT"),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("TEXTCOLOR", (0, 1), (0, -1), MUTED),
        ("TOPPADDING", (0, 0), (-1, -1), 3),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 3),
    ]
)
_TOTALS_STYLE = TableStyle(
    [
        ("FONT", (0, 0), (-1, -1), "Helvetica", 9.5),
        ("ALIGN", (0, 0), (-1, -1), "RIGHT"),
        ("FONT", (0, -1), (-1, -1), "Helvetica-Bold", 11),
        ("LINEABOVE", (0, -1), (-1, -1), 0.8, INK),
        ("TOPPADDING", (0, -1), (-1, -1), 5),
    ]
)
_HEADER_STYLE = TableStyle(
    [
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("LEFTPADDING", (0, 0), (-1, -1), 0),
        ("RIGHTPADDING", (0, 0), (-1, -1), 0),
        # A gutter: a seller's long name ran up to the title, 5 pt away, and read as one
        # line with it (audit BS).
        ("RIGHTPADDING", (0, 0), (0, 0), 12),
        # The number, dates and currency flush with the right margin, as the amounts are
        # (a Table in a cell goes where the cell aligns it, not by its own hAlign).
        ("ALIGN", (1, 0), (1, 0), "RIGHT"),
    ]
)
_META_STYLE = TableStyle(
    [
        ("FONT", (0, 0), (0, -1), "Helvetica-Bold", 8.5),
        ("FONT", (1, 0), (1, -1), "Helvetica", 9.5),
        ("TEXTCOLOR", (0, 0), (0, -1), MUTED),
        ("ALIGN", (0, 0), (-1, -1), "RIGHT"),
        ("TOPPADDING", (0, 0), (-1, -1), 1),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 1),
        ("RIGHTPADDING", (1, 0), (1, -1), 0),
        # A label beside the first line of a value that wraps (a long invoice number),
        # not its last.
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ]
)


def render(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Render the invoice JSON in ``inputs[0]`` to the PDF ``output``."""
    if len(inputs) != 1:
        raise InvalidInput(f"invoice takes exactly one input, got {len(inputs)}")
    doc = load_invoice(inputs[0])
    title = params.get("title") or "Invoice"
    if not isinstance(title, str):
        raise InvalidInput("params.title: expected a string")
    rules.require("title", title, rules.drawable_text)
    if not plain(title):  # blank once control characters are dropped: as if not given
        title = "Invoice"
    try:
        totals = compute_totals(doc)
    except InvalidInput as exc:
        raise InvalidInput(f"{inputs[0].name}: {exc}") from None
    try:
        build_pdf(doc, output, title=title, totals=totals)
    except InvalidInput as exc:  # a block too tall: the input's fields, unless it is the title
        if str(exc).startswith("params."):
            raise
        raise InvalidInput(f"{inputs[0].name}: {exc}") from None


def build_pdf(
    doc: Invoice, output: Path, *, title: str = "Invoice", totals: Totals | None = None
) -> None:
    """Lay out a validated invoice as a PDF at ``output``."""
    if totals is None:
        totals = compute_totals(doc)
    st = styles()
    rows = _item_rows(doc, totals)
    widths = _item_widths(rows)
    story: list[Any] = [
        _header(doc, title),
        Spacer(1, 8 * mm),
        _customer_block(doc),
        Spacer(1, 7 * mm),
        _items_table(rows, widths),
        Spacer(1, 3 * mm),
        KeepTogether(_totals_table(doc, totals)),
    ]
    if doc.notes and doc.notes.strip():
        story += [
            Spacer(1, 8 * mm),
            Paragraph("NOTES", st.label),
            Spacer(1, 1 * mm),
            *(Paragraph(para(chunk), st.body) for chunk in doc.notes.split("\n\n")),
        ]
    pdf = SimpleDocTemplate(
        str(output),
        pagesize=PAGE_SIZE,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN + 6 * mm,
        title=plain(f"{title} {doc.number}"),
        author=plain(doc.seller.name),
        # No timestamps or random ids: the same input always gives the same bytes.
        invariant=True,
    )
    footer = plain(f"{doc.seller.name} · {title} {doc.number}")
    try:
        pdf.build(story, canvasmaker=numbered_canvas(footer))
    except LayoutError as exc:
        # Deterministic: a retry would fail the same way.
        raise InvalidInput(
            _too_tall(doc, title, widths[1])
            or f"content does not fit on a page: {str(exc)[:200]}"
        ) from exc


# The frame's height: the page less its margins and the frame's own padding (6 pt each side).
_ROOM = PAGE_SIZE[1] - MARGIN - (MARGIN + 6 * mm) - 12


def _too_tall(doc: Invoice, title: str, description_width: float) -> str | None:
    """Which block that cannot break across pages is taller than one, named by its field
    (reportlab's LayoutError names a Table at a memory address). An item's row is such a
    block too: a table breaks between rows, never inside one."""
    half = _CONTENT_WIDTH / 2
    blocks: list[tuple[str, str, list[Any]]] = [
        ("seller", "name, address and VAT ID", [_party_paragraph(doc.seller)]),
        ("params.title", "the title and the invoice number", _title_block(doc, title)),
        ("customer", "name, address and VAT ID", _customer_cell(doc)),
    ]
    for field, what, flowables in blocks:
        height = sum(f.wrap(half, _ROOM)[1] for f in flowables)
        if height > _ROOM:
            return (
                f"{field}: {what} together are taller than a page ({height:,.0f} pt; a page"
                f" holds {_ROOM:,.0f})"
            )
    # The row shares its page with the repeated header row.
    room = _ROOM - (_HEADER_ROW_HEIGHT + _ROW_PADDING)
    wrap_width = description_width - 2 * _CELL_PADDING
    for i, item in enumerate(doc.items):
        cell = Paragraph(para(item.description), styles().cell)
        height = cell.wrap(wrap_width, room)[1] + _ROW_PADDING
        if height > room:
            return (
                f"items[{i}].description: its row is taller than a page ({height:,.0f} pt; a"
                f" page holds {room:,.0f} below the table's header)"
            )
    return None


def _party_paragraph(party: Party) -> Paragraph:
    lines = [f"<b>{para(party.name)}</b>", para_lines(list(party.address))]
    if party.vat_id:
        lines.append(f"VAT ID: {para(party.vat_id)}")
    return Paragraph("<br/>".join(line for line in lines if line), styles().body)


def _header(doc: Invoice, title: str) -> Table:
    half = _CONTENT_WIDTH / 2
    return Table(
        [[_party_paragraph(doc.seller), _title_block(doc, title)]],
        colWidths=[half, half],
        style=_HEADER_STYLE,
    )


def _title_block(doc: Invoice, title: str) -> list[Any]:
    st = styles()
    number: str | Paragraph = plain(doc.number)
    if stringWidth(number, "Helvetica", 9.5) > _META_VALUE_WIDTH - 6:  # left padding 6
        number = Paragraph(para(doc.number), st.right)  # wraps where a string would overflow
    meta_rows = [["Invoice no.", number], ["Date", doc.date.isoformat()]]
    if doc.due_date:
        meta_rows.append(["Due date", doc.due_date.isoformat()])
    meta_rows.append(["Currency", doc.currency])
    meta = Table(
        meta_rows, colWidths=[25 * mm, _META_VALUE_WIDTH], style=_META_STYLE, hAlign="RIGHT"
    )
    title_style = ParagraphStyle("title-right", parent=st.title, alignment=TA_RIGHT)
    return [Paragraph(para(title), title_style), Spacer(1, 3 * mm), meta]


def _customer_cell(doc: Invoice) -> list[Any]:
    return [Paragraph("BILL TO", styles().label), _party_paragraph(doc.customer)]


def _customer_block(doc: Invoice) -> Table:
    # As wide as the header and the items, and placed as they are: a half-width table set
    # to the left started at the frame's padding, 6 pt right of the seller (audit BS).
    half = _CONTENT_WIDTH / 2
    return Table(
        [[_customer_cell(doc), ""]],
        colWidths=[half, half],
        style=TableStyle([("LEFTPADDING", (0, 0), (-1, -1), 0)]),
    )


def _item_rows(doc: Invoice, totals: Totals) -> list[list[Any]]:
    st = styles()
    rows: list[list[Any]] = [list(_ITEM_HEADER)]
    for i, (item, line_net) in enumerate(zip(doc.items, totals.line_nets, strict=True), 1):
        rows.append(
            [
                str(i),
                Paragraph(para(item.description), st.cell),
                format_quantity(item.quantity),
                format_amount(item.unit_price, min_places=places_of(doc.currency)),
                format_rate(item.tax_rate),
                format_amount(line_net, min_places=places_of(doc.currency)),
            ]
        )
    return rows


def _items_table(rows: list[list[Any]], widths: list[float]) -> Table:
    table = Table(rows, colWidths=widths, repeatRows=1, style=_ITEM_STYLE)
    if len(rows) > 2:
        table.setStyle(TableStyle([("ROWBACKGROUNDS", (0, 1), (-1, -1), [colors.white, ZEBRA])]))
    return table


def _item_widths(rows: list[list[Any]]) -> list[float]:
    """The columns' widths: a number column wider than usual when a value needs it (amounts
    reach 25 digits), the description taking what is left, as it always does."""
    widths = list(_ITEM_COLUMNS)
    for col in range(2, len(widths)):
        need = max(
            stringWidth(rows[0][col], "Helvetica-Bold", 8.5),
            *(stringWidth(row[col], "Helvetica", 9) for row in rows[1:]),
        )
        widths[col] = max(widths[col], need + 2 * _CELL_PADDING)
    widths[1] = _CONTENT_WIDTH - sum(widths) + widths[1]
    return widths


def _totals_table(doc: Invoice, totals: Totals) -> Table:
    rows: list[list[str]] = [["Subtotal (net)", format_money(doc.currency, totals.net)]]
    for tax in totals.taxes:
        rows.append(
            [
                f"Tax {format_rate(tax.rate)} on {format_money(doc.currency, tax.base)}",
                format_money(doc.currency, tax.tax),
            ]
        )
    rows.append(["Total due", format_money(doc.currency, totals.total)])
    # The amounts' column grows to fit the widest (the total due is bold and larger); the
    # labels are right-aligned, so one wider than its column runs into the empty left side.
    need = max(
        stringWidth(rows[-1][1], "Helvetica-Bold", 11),
        *(stringWidth(row[1], "Helvetica", 9.5) for row in rows[:-1]),
    )
    amounts = max(40 * mm, need + 2 * _CELL_PADDING)
    labels = min(70 * mm, _CONTENT_WIDTH - amounts)
    return Table(rows, colWidths=[labels, amounts], style=_TOTALS_STYLE, hAlign="RIGHT")
