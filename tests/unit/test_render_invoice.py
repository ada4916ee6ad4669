"""The invoice renderer: Decimal arithmetic, layout read back with pypdf, hostile input."""

from __future__ import annotations

import copy
import decimal
import json
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader

from renderctl.errors import InvalidInput
from renderctl.render import invoice, safety
from renderctl.render.invoice import compute_totals, format_amount, format_money, parse_invoice

HOSTILE = (
    '<img src="file:///etc/passwd"/>',
    '<img src="/etc/passwd"/>',
    '<font color="[[[__import__]]]">',
    "<b>unclosed bold",
    "&amp; &lt;not an entity&gt;",
)

# Records any attempt by this process to open /etc/passwd (a real audit hook, not a mock).
_PASSWD_OPENS: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and "passwd" in str(args[0]):
        _PASSWD_OPENS.append(str(args[0]))


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


def make_doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "number": "INV-2025-0042",
        "date": "2025-03-01",
        "due_date": "2025-03-31",
        "currency": "EUR",
        "seller": {
            "name": "Acme Tools GmbH",
            "address": ["Hauptstr. 1", "10115 Berlin"],
            "vat_id": "DE123456789",
        },
        "customer": {"name": "Globex Ltd", "address": ["1 Main St", "London"]},
        "items": [
            {"description": "Widget", "quantity": 3, "unit_price": "411.52", "tax_rate": "0.19"},
            {"description": "Service", "quantity": 1.5, "unit_price": 80, "tax_rate": "0.07"},
        ],
        "notes": "Payable within 30 days.",
    }
    doc.update(overrides)
    return doc


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def render_text(tmp_path: Path, doc: dict[str, Any]) -> tuple[PdfReader, list[str]]:
    source = write_doc(tmp_path / "invoice.json", doc)
    output = tmp_path / "invoice.pdf"
    invoice.render([source], output, {})
    reader = PdfReader(output)
    return reader, [page.extract_text() for page in reader.pages]


# -- arithmetic ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "net", "tax", "total"),
    [
        # Half-up at the cent: 0.005 -> 0.01 (banker's rounding would give 0.00).
        ([("1", "0.005", "0")], "0.01", "0.00", "0.01"),
        ([("1", "0.015", "0")], "0.02", "0.00", "0.02"),
        ([("1", "0.025", "0")], "0.03", "0.00", "0.03"),
        ([("1", "-0.005", "0")], "-0.01", "0.00", "-0.01"),
        ([("3", "411.52", "0.19")], "1234.56", "234.57", "1469.13"),
        # Tax on the sum of a rate's nets, not per line: 2 x round(0.005) would be 0.02.
        ([("1", "0.05", "0.1"), ("1", "0.05", "0.1")], "0.10", "0.01", "0.11"),
        # Two rates are taxed separately: 10.00 at 19% and 10.00 at 7%.
        ([("1", "10", "0.19"), ("2", "5", "0.07")], "20.00", "2.60", "22.60"),
        # 0.2 and 0.20 are the same rate: 0.025 + 0.025 = 0.05 taxed once.
        ([("1", "0.125", "0.2"), ("1", "0.125", "0.20")], "0.26", "0.05", "0.31"),
    ],
)
def test_compute_totals_rounds_half_up_per_line_and_per_rate(
    items: list[tuple[str, str, str]], net: str, tax: str, total: str
) -> None:
    doc = parse_invoice(
        make_doc(
            items=[
                {"description": "x", "quantity": q, "unit_price": p, "tax_rate": r}
                for q, p, r in items
            ]
        )
    )
    totals = compute_totals(doc)
    assert (totals.net, totals.tax, totals.total) == (Decimal(net), Decimal(tax), Decimal(total))


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        ("1234.56", "EUR 1,234.56"),
        ("0", "EUR 0.00"),
        ("0.005", "EUR 0.01"),
        ("1234567.891", "EUR 1,234,567.89"),
        ("-1234.5", "EUR -1,234.50"),
        ("999.995", "EUR 1,000.00"),
    ],
)
def test_format_money(amount: str, text: str) -> None:
    assert format_money("EUR", Decimal(amount)) == text


@pytest.mark.parametrize(
    ("currency", "items", "total", "text"),
    [
        # Yen have no minor unit: 0.333 x 100 is 33 yen, not 33.30 (audit BI).
        ("JPY", [("100", "0.333", "0.1"), ("1", "1000", "0.1")], "1136", "JPY 1,136"),
        # A dinar has 1,000 fils: 0.125 stays 0.125 (it was rounded to 0.13).
        ("BHD", [("1", "0.125", "0.1"), ("3", "1.235", "0.1")], "4.213", "BHD 4.213"),
        # A credit that rounds to nothing is 0.00, not -0.00.
        ("EUR", [("-1", "0.004", "0")], "0.00", "EUR 0.00"),
    ],
)
def test_money_is_rounded_to_the_currencys_minor_unit(
    currency: str, items: list[tuple[str, str, str]], total: str, text: str
) -> None:
    doc = parse_invoice(make_doc(currency=currency, items=[
        {"description": "x", "quantity": q, "unit_price": p, "tax_rate": r}
        for q, p, r in items]))
    totals = compute_totals(doc)
    assert str(totals.total) == total
    assert format_money(currency, totals.total) == text
    assert not any(str(net).startswith("-") for net in totals.line_nets if not net)
    assert format_amount(Decimal("-0.0"), min_places=2) == "0.00"  # (a unit price: BK)


# -- the PDF -------------------------------------------------------------------------------


def test_one_page_invoice_shows_number_total_and_page_count(tmp_path: Path) -> None:
    reader, pages = render_text(tmp_path, make_doc())
    assert len(reader.pages) == 1
    text = pages[0]
    assert "INV-2025-0042" in text
    # 1234.56 + 120.00 net; 234.57 + 8.40 tax
    assert "EUR 1,597.53" in text
    assert "Globex Ltd" in text and "DE123456789" in text
    assert "Page 1 of 1" in text


@pytest.mark.parametrize("title", ["", "   ", "\u0007\u001b", "\u0000 \t"])
def test_a_title_that_prints_as_nothing_falls_back_to_invoice(tmp_path: Path, title: str) -> None:
    # Given a title param with nothing drawable in it (control characters are dropped)
    source = write_doc(tmp_path / "in.json", make_doc())
    output = tmp_path / "out.pdf"
    # When the invoice is rendered
    invoice.render([source], output, {"title": title})
    # Then it is headed, and its metadata titled, as an invoice without a title param is
    reader = PdfReader(output)
    lines = [line.strip() for line in reader.pages[0].extract_text().splitlines()]
    assert "Invoice" in lines  # the heading line
    assert reader.metadata is not None and reader.metadata.title == "Invoice INV-2025-0042"


def test_same_input_gives_identical_bytes(tmp_path: Path) -> None:
    source = write_doc(tmp_path / "in.json", make_doc())
    invoice.render([source], tmp_path / "one.pdf", {})
    invoice.render([source], tmp_path / "two.pdf", {})
    assert (tmp_path / "one.pdf").read_bytes() == (tmp_path / "two.pdf").read_bytes()


def test_long_invoice_flows_onto_pages_with_header_repeated(tmp_path: Path) -> None:
    items = [
        {"description": f"Line item number {i}", "quantity": 1, "unit_price": "1.00"}
        for i in range(1, 81)
    ]
    reader, pages = render_text(tmp_path, make_doc(items=items))
    count = len(reader.pages)
    assert count > 1
    assert f"Page 1 of {count}" in pages[0]
    assert f"Page {count} of {count}" in pages[-1]
    assert "Description" in pages[1] and "Unit price" in pages[1]
    assert "Line item number 80" in "".join(pages)
    assert "EUR 80.00" in pages[-1]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_text_is_printed_literally(tmp_path: Path, hostile: str) -> None:
    _PASSWD_OPENS.clear()
    doc = make_doc(
        notes=hostile,
        seller={"name": hostile, "address": [hostile]},
        items=[{"description": hostile, "quantity": 1, "unit_price": "2.00"}],
    )
    _, pages = render_text(tmp_path, doc)
    text = pages[0]
    # seller name, address, description, notes, footer
    assert text.count(hostile) >= 4
    assert _PASSWD_OPENS == []


# -- schema errors -------------------------------------------------------------------------


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = make_doc(items=[copy.deepcopy(make_doc()["items"][0]) for _ in range(5)])
    target: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("items.3.quantity", "three", "items[3].quantity: not a number"),
        # Decimal() reads these; a person's data does not mean them as numbers
        ("items.3.quantity", "1_000", "items[3].quantity: not a number"),
        ("items.3.quantity", "\u0661\u0662", "items[3].quantity: not a number"),
        ("items.3.quantity", "Infinity", "items[3].quantity: not a number"),
        ("items.3.quantity", True, "items[3].quantity: not a number"),
        ("items.1.unit_price", None, "items[1].unit_price: not a number"),
        ("items.0.tax_rate", "20", "items[0].tax_rate"),
        ("items.2.colour", "red", "items[2].colour: unknown field"),
        ("items.4.description", _DELETE, "items[4].description: required"),
        ("items", [], "items: an invoice needs at least one item"),
        ("currency", "euro", "currency:"),
        ("currency", _DELETE, "currency: required"),
        ("date", "01/03/2025", "date:"),
        ("due_date", "2025-02-01", "due_date:"),
        ("seller.address", "Hauptstr. 1", "seller.address:"),
        ("customer.name", "", "customer.name:"),
        ("customer.email", "a@b.c", "customer.email: unknown field"),
        ("surprise", 1, "surprise: unknown field"),
        ("items.0.unit_price", "1e40", "items[0].unit_price:"),
        # Control characters are dropped when drawn: these would print as nothing
        ("number", "\u0007", "number: must not be empty"),
        ("customer.name", "\u0001\u0002", "customer.name: must not be empty"),
        ("items.0.description", "\u0007 \u007f", "items[0].description: must not be empty"),
    ],
)
def test_schema_errors_name_the_field(tmp_path: Path, path: str, value: Any, message: str) -> None:
    source = write_doc(tmp_path / "bad.json", _with(path, value))
    with pytest.raises(InvalidInput) as caught:
        invoice.render([source], tmp_path / "out.pdf", {})
    assert str(caught.value).startswith("bad.json: ") and message in str(caught.value)
    assert not (tmp_path / "out.pdf").exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"number": NaN}', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[]", "document: expected an object"),
        # json keeps the last of a repeated key: this was a yen invoice, unsaid (audit DU)
        (b'{"currency": "SEK", "currency": "JPY"}', "'currency' appears twice in one object"),
        (b'{"items": [{"qty": 1, "qty": 2}]}', "'qty' appears twice in one object"),
    ],
)
def test_unreadable_json_is_invalid_input(tmp_path: Path, raw: bytes, message: str) -> None:
    source = tmp_path / "bad.json"
    source.write_bytes(raw)
    with pytest.raises(InvalidInput, match=message):
        invoice.render([source], tmp_path / "out.pdf", {})


def test_json_nested_past_the_recursion_limit_is_invalid_input(tmp_path: Path) -> None:
    source = tmp_path / "deep.json"
    source.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(InvalidInput) as caught:
        invoice.render([source], tmp_path / "out.pdf", {})
    assert str(caught.value) == (
        f"deep.json: line 1 column {invoice.MAX_NESTING + 1}: arrays/objects nested more than "
        f"{invoice.MAX_NESTING} deep"
    )


def test_deep_nesting_position_skips_brackets_inside_strings(tmp_path: Path) -> None:
    source = tmp_path / "deep.json"
    source.write_text('{"a": "[[[{{",\n "b": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(InvalidInput, match=r"deep.json: line 2 column 106:"):
        invoice.render([source], tmp_path / "out.pdf", {})


def test_a_total_past_the_amount_limit_is_invalid_input_naming_the_item(tmp_path: Path) -> None:
    # Each number is inside the 1e12 limit; their products add up past 1e26 at item 100
    item = {"description": "x", "quantity": "999999999999", "unit_price": "999999999999.99"}
    source = write_doc(tmp_path / "big.json", make_doc(items=[item] * 101))
    with pytest.raises(InvalidInput) as caught:
        invoice.render([source], tmp_path / "out.pdf", {})
    assert str(caught.value).startswith("big.json: items[100]: the net total reaches 1.010e+26")
    assert not (tmp_path / "out.pdf").exists()
    # One item fewer is still an invoice
    write_doc(source, make_doc(items=[item] * 100))
    invoice.render([source], tmp_path / "out.pdf", {})
    last_page = PdfReader(tmp_path / "out.pdf").pages[-1].extract_text()
    assert "Total due\nEUR 99,999,999,999,899,000,000,000,001.00" in last_page


def test_a_total_with_tax_past_the_amount_limit_names_the_items(tmp_path: Path) -> None:
    item = {"description": "x", "quantity": "999999999999", "unit_price": "999999999999.99",
            "tax_rate": "0.5"}
    source = write_doc(tmp_path / "big.json", make_doc(items=[item] * 99))
    with pytest.raises(InvalidInput, match=r"^big.json: items: the total with tax reaches"):
        invoice.render([source], tmp_path / "out.pdf", {})


BIG_ITEM = {
    "description": "x",
    "quantity": "654755751783.744744",
    "unit_price": "280157244087.723986",
}
# The exact product is ...881422.234950229584: half-up to cents is .23 (a 28-digit product
# is rounded to ...881422.2350 first, which then rounds up to .24).
BIG_TOTAL = "EUR 183,434,566,970,319,795,881,422.23"


def test_money_is_exact_at_the_largest_allowed_values(tmp_path: Path) -> None:
    _, pages = render_text(tmp_path, make_doc(items=[BIG_ITEM]))
    assert f"Total due\n{BIG_TOTAL}" in pages[-1]
    assert "183,434,566,970,319,795,881,422.23\n" in pages[0]  # the line's amount


@pytest.mark.parametrize(
    "context",
    [
        decimal.Context(prec=6, rounding=decimal.ROUND_FLOOR),
        decimal.Context(prec=28, rounding=decimal.ROUND_DOWN, traps=[decimal.Inexact]),
    ],
)
def test_money_ignores_the_threads_decimal_context(
    tmp_path: Path, context: decimal.Context
) -> None:
    # A python job earlier in the same worker may leave the thread's context like this
    doc = make_doc(items=[BIG_ITEM, {"description": "y", "quantity": "1.5", "unit_price": "0.01",
                                     "tax_rate": "0.19"}])
    with decimal.localcontext(context):
        _, pages = render_text(tmp_path, doc)
    # 0.015 -> 0.02 net at 19%: tax 0.0038 -> 0.00; total = big + 0.02
    assert "Total due\nEUR 183,434,566,970,319,795,881,422.25" in pages[-1]
    assert "\n1.5\n" in pages[0] and "\n19%\n" in pages[0]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("items.0.unit_price", "1" + "0" * 5_000,
         f"items[0].unit_price: 1{'0' * 39}… is too large (limit 1,000,000,000,000)"),
        ("items.0.unit_price", "1." + "0" * 5_000,
         f"items[0].unit_price: 1.{'0' * 38}… has more than 6 decimal places"),
        ("items.0.quantity", "x" * 5_000, f"items[0].quantity: not a number: '{'x' * 40}…'"),
        ("items.0.quantity", "-sNaN" + "1" * 5_000,
         f"items[0].quantity: not a number: '-sNaN{'1' * 35}…'"),
        ("items.0." + "k" * 5_000, 1, f"items[0].{'k' * 40}…: unknown field (allowed: "),
    ],
)
def test_messages_cut_long_values(tmp_path: Path, path: str, value: Any, message: str) -> None:
    source = write_doc(tmp_path / "bad.json", _with(path, value))
    with pytest.raises(InvalidInput) as caught:
        invoice.render([source], tmp_path / "out.pdf", {})
    assert str(caught.value).startswith(f"bad.json: {message}")  # file, field, value
    assert len(str(caught.value)) < 200


# -- property: the printed total is the Decimal arithmetic --------------------------------

_item = st.fixed_dictionaries(
    {
        "description": st.text(
            st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=40
        ).filter(str.strip),
        "quantity": st.decimals(min_value=0, max_value=1000, places=2),
        "unit_price": st.decimals(min_value=-500, max_value=100_000, places=3),
        "tax_rate": st.sampled_from(["0", "0.07", "0.19", "0.2", "0.055", "0.25"]),
    }
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(items=st.lists(_item, min_size=1, max_size=6), currency=st.sampled_from(["EUR", "USD"]))
def test_printed_total_equals_decimal_arithmetic(
    tmp_path: Path, items: list[dict[str, Any]], currency: str
) -> None:
    cent = Decimal("0.01")
    nets = [(i["quantity"] * i["unit_price"]).quantize(cent, ROUND_HALF_UP) for i in items]
    by_rate: dict[Decimal, Decimal] = {}
    for item, net in zip(items, nets, strict=True):
        rate = Decimal(item["tax_rate"]).normalize()
        by_rate[rate] = by_rate.get(rate, Decimal(0)) + net
    tax = sum(
        ((base * rate).quantize(cent, ROUND_HALF_UP) for rate, base in by_rate.items()), Decimal(0)
    )
    expected = sum(nets, Decimal(0)) + tax

    doc = make_doc(
        currency=currency,
        items=[
            {**i, "quantity": str(i["quantity"]), "unit_price": str(i["unit_price"])} for i in items
        ],
    )
    _, pages = render_text(tmp_path, doc)
    assert f"Total due\n{currency} {expected:,.2f}" in pages[-1]
    assert compute_totals(parse_invoice(doc)).total == expected


def test_the_header_lines_up_with_the_page_and_its_labels_with_their_values(
        tmp_path: Path) -> None:
    # Given an invoice number long enough to wrap
    number = "INV-2025-LONG-NUMBER-WITH-MANY-CHARACTERS-0000000000000000001"
    source = write_doc(tmp_path / "in.json", make_doc(number=number))
    invoice.render([source], tmp_path / "out.pdf", {})
    at: dict[str, list[tuple[float, float]]] = {}

    def seen(text: str, cm: Any, tm: Any, font: Any, size: Any) -> None:
        if text.strip():
            at.setdefault(text.strip(), []).append((cm[4] + tm[4], cm[5] + tm[5]))

    PdfReader(tmp_path / "out.pdf").pages[0].extract_text(visitor_text=seen)
    # Then BILL TO starts where the seller does (it was 6 pt to the right: audit BS)
    assert abs(at["BILL TO"][0][0] - at["Acme Tools GmbH"][0][0]) < 0.5, at
    # And "Invoice no." is level with the number's first line, not its last
    first_line = max(y for text, spots in at.items() if text.startswith("INV-2025")
                     for _, y in spots)
    assert abs(at["Invoice no."][0][1] - first_line) < 2, at
