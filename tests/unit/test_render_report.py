"""The report renderer: CSV in, titled multi-page table with Decimal totals out."""

from __future__ import annotations

import csv
import decimal
import math
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

from renderctl.errors import InvalidInput
from renderctl.render import report, safety


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def sales(tmp_path: Path) -> Path:
    regions = ["North", "South", "East", "West"]
    rows = [[regions[i % 4], f"Product {i:03d}", i, f"{i * 10.1:.2f}"] for i in range(1, 121)]
    return write_csv(tmp_path / "sales.csv", ["region", "product", "units", "revenue"], rows)


def render_pages(source: Path, out: Path, **params: Any) -> list[str]:
    report.render([source], out, {"title": "Quarterly sales", **params})
    return [page.extract_text() for page in PdfReader(out).pages]


def test_report_has_title_header_on_every_page_totals_and_page_numbers(
    tmp_path: Path, sales: Path
) -> None:
    pages = render_pages(sales, tmp_path / "r.pdf", chart="revenue")
    assert len(pages) > 1
    assert "Quarterly sales" in pages[0]
    for number, text in enumerate(pages, 1):
        assert "product" in text and "revenue" in text  # header row repeated
        assert f"Page {number} of {len(pages)}" in text
    # sum(1..120) = 7260 units; 10.1 * 7260 = 73,326.00 revenue (exact in Decimal)
    assert "Total\n7,260\n73,326.00" in pages[-1]


def test_columns_and_numeric_sort_descending(tmp_path: Path, sales: Path) -> None:
    pages = render_pages(
        sales, tmp_path / "r.pdf", columns=["product", "units"], sort_by="units", descending=True
    )
    body = "".join(pages)
    assert body.index("Product 120") < body.index("Product 100") < body.index("Product 009")
    assert "revenue" not in body and "North" not in body


def test_hostile_cells_are_printed_literally(tmp_path: Path) -> None:
    hostile = '<img src="file:///etc/passwd"/>'
    source = write_csv(tmp_path / "h.csv", ["name", "amount"], [[hostile, "1.50"], ["<b>", "2"]])
    pages = render_pages(source, tmp_path / "r.pdf", chart="amount")
    assert hostile in pages[0] and "<b>" in pages[0]
    assert "3.50" in pages[0]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"columns": ["region", "colour"]}, "params.columns: no column 'colour'"),
        ({"sort_by": "price"}, "params.sort_by: no column 'price'"),
        ({"chart": "profit"}, "params.chart: no column 'profit'"),
        ({"chart": "region"}, "params.chart: column 'region' is not numeric"),
        ({"title": ""}, "params.title"),
    ],
)
def test_bad_params_name_the_param_and_column(
    tmp_path: Path, sales: Path, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        report.render([sales], tmp_path / "r.pdf", {"title": "T", **params})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty CSV"),
        (b"a,b\n1,2\n3\n", "line 3: 1 fields, the header has 2"),
        (b"a,a\n1,2\n", "appears twice"),
        (b"a,b\n\xff\xfe,1\n", "not UTF-8"),
        (b'a,b\n"unclosed,1\n', "bad CSV"),
        # UTF-16 without its byte order mark is valid UTF-8, every other byte a NUL: it
        # rendered, no cell a number (no totals; audit DU); and one NUL in a real CSV's cell
        ("units,revenue\n3,4.50\n".encode("utf-16-be"), "line 1 holds a NUL character"),
        ("units,revenue\n3,4.50\n".encode("utf-16-le"), "line 1 holds a NUL character"),
        (b"units,revenue\n3,4.50\n12\x00,1\n", "line 3 holds a NUL character"),
        # Another delimiter: one column of text, no numbers, no totals, and the job done
        # (audit EN)
        (b"region;units;revenue\nnorth;3;4,50\n", "split by semicolons, not commas"),
        (b"region\tunits\nnorth\t3\n", "tab-separated file"),
        # (with a comma in a header it read as two columns of garbage: review EO)
        (b"Region;Revenue, EUR;Units\nnorth;3,5;7\n", "semicolon-separated file"),
        # (and with a field quoted as Excel quotes one holding the delimiter: review ER)
        (b'Region;"Notes; free";Units\nnorth;x;7\n', "semicolon-separated file"),
        (b'Region;"Revenue, EUR";Units\nnorth;3,5;7\n', "semicolon-separated file"),
    ],
)
def test_bad_csv_is_invalid_input(tmp_path: Path, content: bytes, message: str) -> None:
    source = tmp_path / "bad.csv"
    source.write_bytes(content)
    with pytest.raises(InvalidInput, match=message):
        report.render([source], tmp_path / "r.pdf", {"title": "T"})


@pytest.mark.parametrize("params", [{}, {"chart": "b"}, {"chart": "b", "sort_by": "b"}])
def test_header_only_csv_renders_an_empty_table(tmp_path: Path, params: dict[str, Any]) -> None:
    source = write_csv(tmp_path / "empty.csv", ["a", "b"], [])
    pages = render_pages(source, tmp_path / "r.pdf", **params)
    assert len(pages) == 1
    assert "0 rows from empty.csv\na\nb\n" in pages[0]


def test_header_only_csv_still_needs_the_chart_column_to_exist(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "empty.csv", ["a", "b"], [])
    with pytest.raises(InvalidInput, match="params.chart: no column 'c'"):
        report.render([source], tmp_path / "r.pdf", {"title": "T", "chart": "c"})


@pytest.mark.parametrize("huge", ["1e999999", "1.7e308", "-1e30"])
def test_a_chart_of_a_number_beyond_any_sane_size_is_invalid_input_naming_the_cell(
    tmp_path: Path, huge: str
) -> None:
    source = tmp_path / "huge.csv"
    source.write_bytes(f'name,amount\n"A\nwith a line break",2\nB,{huge}\nC,1\n'.encode())
    with pytest.raises(InvalidInput) as caught:
        report.render([source], tmp_path / "r.pdf", {"title": "T", "chart": "amount"})
    assert str(caught.value) == (
        "params.chart: column 'amount' is not numeric (huge.csv line 4, column 'amount': "
        f"'{huge}' is not a number below 1e+30)"
    )


def test_a_number_beyond_any_sane_size_is_text_in_the_table(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "huge.csv", ["name", "amount"], [["A", "1e999999"], ["B", "1"]])
    pages = render_pages(source, tmp_path / "r.pdf", sort_by="amount")
    # No total of a million digits: the column is text, sorted as text
    assert "Total" not in pages[0]
    assert pages[0].index("B\n1") < pages[0].index("A\n1e999999")


def test_totals_ignore_the_threads_decimal_context(tmp_path: Path) -> None:
    rows = [["A", "123456789012.345678"], ["B", "0.000001"]]
    source = write_csv(tmp_path / "t.csv", ["name", "amount"], rows)
    # A python job earlier in the same worker may leave the thread's context like this
    with decimal.localcontext(decimal.Context(prec=6, rounding=decimal.ROUND_FLOOR)):
        pages = render_pages(source, tmp_path / "r.pdf")
    assert "Total\n123,456,789,012.345679" in pages[0]


def test_a_comma_is_only_a_thousands_separator(tmp_path: Path) -> None:
    rows = [["A", "1,5"], ["B", "2,25"], ["C", "1,000"]]
    source = write_csv(tmp_path / "comma.csv", ["name", "amount"], rows)
    pages = render_pages(source, tmp_path / "r.pdf", sort_by="amount")
    # "1,5" is not a number, so the column is text: no total, sorted as text
    assert "Total" not in pages[0]
    assert "C\n1,000\nA\n1,5\nB\n2,25" in pages[0]
    with pytest.raises(InvalidInput, match=r"comma.csv line 2, column 'amount': '1,5' is not"):
        report.render([source], tmp_path / "r.pdf", {"title": "T", "chart": "amount"})


@pytest.mark.parametrize("cell", ["2024_01", "\u0661\u0662", "NaN", "Infinity"])
def test_what_only_python_reads_as_a_number_is_text(tmp_path: Path, cell: str) -> None:
    # Decimal() takes digit grouping ("2024_01" -> 202401), other scripts' digits and
    # NaN/Infinity; in a CSV they are labels, so the column is text and has no total
    source = write_csv(tmp_path / "t.csv", ["name", "period"], [["A", cell], ["B", "7"]])
    assert [c.numeric for c in report.columns_of(report.load_csv(source))] == [False, False]
    if cell.isascii():  # the fonts have no Arabic-Indic digits: that report is refused
        pages = render_pages(source, tmp_path / "r.pdf")
        assert "Total" not in pages[0], pages[0]


def test_thousands_separators_still_make_numbers(tmp_path: Path) -> None:
    rows = [["A", "1,000"], ["B", "-12,345,678.5"], ["C", "999"], ["D", "2,000.25"]]
    source = write_csv(tmp_path / "k.csv", ["name", "amount"], rows)
    pages = render_pages(source, tmp_path / "r.pdf", sort_by="amount")
    assert "B\n-12,345,678.5\nC\n999\nA\n1,000\nD\n2,000.25\nTotal\n-12,341,679.25" in pages[0]


def _numbered_rows(path: Path, count: int) -> Path:
    rows = [[f"Item {i:06d}", i, f"{i / 100:.2f}"] for i in range(1, count + 1)]
    return write_csv(path, ["item", "units", "price"], rows)


@pytest.mark.parametrize("count", [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 600])
def test_long_table_pages_hold_every_row_once_with_header_and_totals_last(
    tmp_path: Path, count: int
) -> None:
    source = _numbered_rows(tmp_path / "rows.csv", count)
    pages = render_pages(source, tmp_path / "r.pdf", chart="units")
    seen: list[int] = []
    for number, text in enumerate(pages, 1):
        lines = text.split("\n")
        # The table starts with its header (the chart's labels, on page 1, come before it)
        table = lines.index("item")
        assert lines[table : table + 3] == ["item", "units", "price"]
        assert f"Page {number} of {len(pages)}" in text
        seen += [int(line[5:]) for line in lines[table:] if line.startswith("Item ")]
        assert ("Total" in lines) == (number == len(pages))
    assert seen == list(range(1, count + 1))
    # and the totals row never alone on its page (a body row goes on with it)
    assert any(line.startswith("Item ") for line in pages[-1].split("\n"))
    units = count * (count + 1) // 2
    assert f"Total\n{units:,}\n{units / 100:,.2f}\n" in pages[-1]


def test_a_long_report_pages_its_rows_at_a_fixed_height(tmp_path: Path) -> None:
    # Each row is given its height up front (what made paging linear in rows: a single
    # reportlab Table re-measured every remaining row at each page break, 10k rows 4 s,
    # 40k 51 s; tests/bench/bench_report_rows.py measures it), so the page count is exact
    count = 4_000
    source = _numbered_rows(tmp_path / "rows.csv", count)
    report.render([source], tmp_path / "r.pdf", {"title": "T"})
    # 49 rows a page, 45 on the first (under the title), then the totals row
    assert len(PdfReader(tmp_path / "r.pdf").pages) == 1 + math.ceil((count + 1 - 45) / 49)


def test_many_numeric_columns_print_every_number_and_total_whole(tmp_path: Path) -> None:
    # Given a label and 19 columns of amounts (a year by month and then some)
    header = ["region", *(f"m{i:02d}" for i in range(1, 20))]
    rows = [[f"region {r}", *(f"{(r * 7919 + c * 104729) % 10000}.{c:02d}"
                              for c in range(1, 20))] for r in range(30)]
    source = write_csv(tmp_path / "wide.csv", header, rows)

    # When it is rendered
    text = "\n".join(render_pages(source, tmp_path / "r.pdf"))

    # Then every amount and every column's total is there whole (before: the columns were
    # shrunk alike until each cell read "1296...", and the totals, never clipped, ran into
    # each other: audit BI)
    assert "…" not in text
    for row in rows:
        for cell in row[1:]:
            assert cell in text
    for c in range(1, 20):
        total = sum(decimal.Decimal(row[c]) for row in rows)
        assert f"{total:,.2f}" in text


def test_columns_that_cannot_fit_even_in_small_type_are_refused_naming_params_columns(
        tmp_path: Path) -> None:
    header = ["region", *(f"c{i:02d}" for i in range(1, 40))]
    rows = [[f"r{r}", *(f"{r * 1000003 + c}.25" for c in range(1, 40))] for r in range(5)]
    source = write_csv(tmp_path / "wider.csv", header, rows)
    with pytest.raises(InvalidInput, match=r"params\.columns: 40 columns do not fit") as got:
        render_pages(source, tmp_path / "r.pdf")
    # (named after its file, as a plain InvalidInput: the record said "_DoesNotFit: ...",
    # without the file; audit DC)
    assert type(got.value) is InvalidInput and str(got.value).startswith("wider.csv: ")
    # (chosen fewer, it renders)
    assert render_pages(source, tmp_path / "r.pdf", columns=["region", "c01", "c02"])


def test_a_total_keeps_every_decimal_its_cells_have(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "p.csv", ["name", "x"],
                       [["a", "0.1"], ["b", "0.000000000001"], ["c", "0.2"]])
    # (it was cut to 10 decimals: 0.3000000000, audit BI)
    assert "Total\n0.300000000001" in render_pages(source, tmp_path / "r.pdf")[0]


def test_a_number_wider_than_its_share_of_the_page_is_still_whole(tmp_path: Path) -> None:
    # Given a long text column and a column whose total has 27 digits and 27 decimals
    rows = [["x" * 300, "999999999999999999999999999"], ["y", "0.000000000000000000000000001"]]
    source = write_csv(tmp_path / "w.csv", ["note", "amount"], rows)
    # When it is rendered, then the total is there whole (the text column clipped), where
    # it was cut with an ellipsis to its column's share of the page (review BK)
    text = render_pages(source, tmp_path / "r.pdf")[0]
    assert "999,999,999,999,999,999,999,999,999.000000000000000000000000001" in text


def test_few_columns_of_wide_numbers_go_landscape_before_smaller_type(tmp_path: Path) -> None:
    # Given five columns of 28-digit sums: too wide upright, in full-size type
    rows = [[f"{(r + 1) * 10 ** 27 + c}" for c in range(5)] for r in range(9)]
    source = write_csv(tmp_path / "five.csv", [f"c{i}" for i in range(5)], rows)
    out = tmp_path / "r.pdf"
    # When it is rendered, then the page is turned rather than the report refused or its
    # type shrunk (review BK: refused upright, naming params.columns)
    render_pages(source, out)
    page = PdfReader(out).pages[0]
    assert page.mediabox.width > page.mediabox.height


def test_identifier_columns_get_no_total_by_default(tmp_path: Path) -> None:
    # Given an export whose numeric columns include keys: an invoice number, a customer id,
    # a year (audit BI: their "totals" were printed, 3,000,006 beside the amounts' sum)
    source = write_csv(
        tmp_path / "inv.csv", ["Invoice No.", "customerId", "year", "Number of items", "amount"],
        [[1_000_001, 17, 2026, 3, "10.50"], [1_000_002, 18, 2026, 4, "2.25"]])
    # When it is rendered with the default totals
    text = render_pages(source, tmp_path / "r.pdf")[-1]
    # Then the quantities are totalled, the keys are not
    last = text.split("\n")
    assert last[last.index("Total"):last.index("Total") + 3] == ["Total", "7", "12.75"]
    assert "2,000,003" not in text and "4,052" not in text and "35" not in text


def test_totals_param_names_the_columns_to_total_or_none(tmp_path: Path, sales: Path) -> None:
    # Given the sales export: units and revenue are numeric
    # When only revenue is to be totalled, then units has no total
    text = render_pages(sales, tmp_path / "a.pdf", totals=["revenue"])[-1]
    assert "Total\n73,326.00" in text and "7,260" not in text
    # When no totals are wanted, then there is no totals row at all
    assert all("Total" not in page for page in render_pages(sales, tmp_path / "b.pdf", totals=[]))
    # When an identifier-looking column is asked for by name, then it is totalled
    source = write_csv(tmp_path / "y.csv", ["region", "year"], [["N", 2025], ["S", 2026]])
    assert "Total\n4,051" in render_pages(source, tmp_path / "c.pdf", totals=["year"])[-1]


@pytest.mark.parametrize(
    ("totals", "message"),
    [
        ("revenue", "params.totals: expected a list of column names"),
        (["profit"], "params.totals: no column 'profit'"),
        (["region"], "params.totals: column 'region' is not numeric"),
        (["revenue", "units"], "params.totals: column 'revenue' is not among params.columns"),
    ],
)
def test_bad_totals_name_the_param_and_column(
    tmp_path: Path, sales: Path, totals: Any, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        report.render([sales], tmp_path / "r.pdf",
                      {"title": "T", "columns": ["region", "units"], "totals": totals})


def test_chart_names_are_printed_below_negative_bars_not_over_them(tmp_path: Path) -> None:
    # Given a charted column running from -600 to 500
    source = write_csv(tmp_path / "p.csv", ["product", "profit"],
                       [[f"Product {i}", (i - 6) * 100] for i in range(12)])
    report.render([source], tmp_path / "r.pdf", {"title": "P", "chart": "profit"})
    heights: dict[str, float] = {}

    def seen(text: str, cm: Any, tm: Any, font: Any, size: Any) -> None:
        if text.strip():
            heights.setdefault(text.strip(), cm[5] + tm[5] * cm[3])

    PdfReader(tmp_path / "r.pdf").pages[0].extract_text(visitor_text=seen)
    # Then every bar's name lies below the value axis' lowest label (before: on the zero
    # line, across the negative bars)
    assert max(heights[f"Product {i}"] for i in range(12)) < heights["-600"]


@pytest.mark.parametrize("count", [44, 45, 46, 93, 94, 95])
def test_the_totals_row_never_stands_alone_on_the_last_page(tmp_path: Path, count: int) -> None:
    # Given as many rows as fill the pages exactly, so that only the totals row is left
    # over (45 and 94 rows without a chart: audit BS)
    source = _numbered_rows(tmp_path / "rows.csv", count)
    # When it is rendered
    pages = render_pages(source, tmp_path / "r.pdf")
    # Then the last page holds a row of the table above the totals, and every row is there
    # once, in order
    last = pages[-1].split("\n")
    assert "Total" in last and any(line.startswith("Item ") for line in last), last
    seen = [int(line[5:]) for page in pages for line in page.split("\n")
            if line.startswith("Item ")]
    assert seen == list(range(1, count + 1))


def _words_at(path: Path) -> list[tuple[str, float, float]]:
    """Each piece of text on the first page with where it starts (x, y), in page space."""
    found: list[tuple[str, float, float]] = []

    def seen(text: str, cm: Any, tm: Any, font: Any, size: Any) -> None:
        if text.strip():
            found.append((text.strip(), cm[4] + tm[4] * cm[0] + tm[5] * cm[2],
                          cm[5] + tm[4] * cm[1] + tm[5] * cm[3]))

    PdfReader(path).pages[0].extract_text(visitor_text=seen)
    return found


def test_a_chart_of_negative_values_only_measures_its_bars_from_zero(tmp_path: Path) -> None:
    # Given a charted column whose values are all below zero
    source = write_csv(tmp_path / "n.csv", ["name", "delta"],
                       [[f"R{i}", -5_000 - 7_000 * i] for i in range(12)])
    report.render([source], tmp_path / "r.pdf", {"title": "N", "chart": "delta"})
    # Then the value axis reaches 0 (before: its top was the highest value, about -10,000,
    # the bars hung from there, and the smallest one was not drawn: audit BS), and its
    # labels are grouped
    labels = {t for t, _, _ in _words_at(tmp_path / "r.pdf")}
    assert "0" in labels and "-20,000" in labels, labels


def test_chart_names_that_end_alike_are_told_apart(tmp_path: Path) -> None:
    # Given rows named alike in their first 60 points ("Region number N with a longer
    # label": each was printed "Region num…" under its bar, audit BS)
    source = write_csv(tmp_path / "l.csv", ["region", "v"],
                       [[f"Region number {i} with a longer label", i] for i in range(1, 21)])
    report.render([source], tmp_path / "r.pdf", {"title": "L", "chart": "v"})
    # Then each bar's name is its own
    labels = [t for t, _, _ in _words_at(tmp_path / "r.pdf") if t.startswith("…")]
    assert labels == [f"…{i}…" for i in range(1, 21)], labels


def test_a_chart_of_huge_values_keeps_its_labels_and_caption_on_the_page(tmp_path: Path) -> None:
    # Given values of 5e11 and more, and a column named at great length
    name = " ".join(["Revenue in the reporting currency"] * 6)
    source = write_csv(tmp_path / "b.csv", ["name", name], [[f"R{i}", i * 5e11] for i in range(8)])
    report.render([source], tmp_path / "r.pdf", {"title": "B", "chart": name})
    words = _words_at(tmp_path / "r.pdf")
    # Then the axis labels are grouped and start inside the page's margin (before:
    # "3500000000000" ran into it), and the caption is clipped like the header
    axis = [(t, x) for t, x, _ in words if t.replace(",", "").isdigit() and "," in t]
    assert "3,000,000,000,000" in dict(axis), axis
    assert all(x >= report.MARGIN for _, x in axis), axis
    caption = next(t for t, _, _ in words if t.startswith("Revenue in the reporting"))
    assert caption.endswith("…")
    assert "1 row from" in render_pages(write_csv(tmp_path / "one.csv", ["a", "b"], [["x", 1]]),
                                        tmp_path / "one.pdf")[0]


def test_quantities_named_like_identifiers_keep_their_totals(tmp_path: Path) -> None:
    # Given quantity columns whose last word is an identifier word, and an "id" column of
    # amounts (review BW: each lost its total, silently)
    header = ["region", "Sales per year", "Units sold this year", "Orders (number)",
              "Total number", "refund_id"]
    source = write_csv(tmp_path / "q.csv", header,
                       [["N", "10.50", 3, 4, 5, "1.25"], ["S", "2.25", 1, 2, 3, "2.5"]])
    # When it is rendered with the default totals, then each is totalled
    text = render_pages(source, tmp_path / "r.pdf")[-1].split("\n")
    at = text.index("Total")
    assert text[at:at + 6] == ["Total", "12.75", "4", "6", "8", "3.75"], text


def test_a_totals_row_is_labelled_even_when_its_first_column_has_a_total(
        tmp_path: Path) -> None:
    # Given a report whose first column is a quantity and whose second is text
    source = write_csv(tmp_path / "u.csv", ["units", "product", "price"],
                       [[3, "Bolt", "1.50"], [4, "Nut", "0.25"]])
    # When it is rendered, then its totals row says what it is, in the text column
    last = render_pages(source, tmp_path / "r.pdf")[-1].split("\n")
    at = last.index("Total")
    assert last[at - 1:at + 2] == ["7", "Total", "1.75"], last


def test_headers_cut_to_fit_stay_told_apart(tmp_path: Path) -> None:
    # Given twenty columns of amounts in the thousands (they fit a landscape A4 only in
    # small type, their headers cut)
    header = [f"Amount {n}" for n in range(1, 21)]
    rows = [[f"{1000 * n + r}.25" for n in range(1, 21)] for r in range(3)]
    source = write_csv(tmp_path / "twenty.csv", header, rows)

    # When it is rendered
    text = render_pages(source, tmp_path / "r.pdf")[0]

    # Then each column's header ends with its own number: cut at their ends, 12 of them
    # printed "Amount…" alike (audit EN)
    for n in (1, 9, 10, 17, 20):
        assert f"{n}\n" in text or f"{n} " in text, text[:400]
    assert text.count("Amount…") <= 1, text[:400]


def test_text_sorts_by_letter_whatever_the_accent(tmp_path: Path) -> None:
    names = ["zulu", "École", "apple", "Ärger", "Zebra", "banana", "eagle", "Øre"]
    source = write_csv(tmp_path / "s.csv", ["name", "n"], [[n, i] for i, n in enumerate(names)])
    text = render_pages(source, tmp_path / "r.pdf", sort_by="name")[0]
    # Accented letters among their base letters, not after "z" (audit EN)
    order = sorted(names, key=text.index)
    # (and letters that carry their mark in themselves, as Ø: review EO)
    assert order == ["apple", "Ärger", "banana", "eagle", "École", "Øre", "Zebra",
                     "zulu"], order


@pytest.mark.parametrize(("content", "header"), [
    # a one-column CSV whose header, quoted, holds a semicolon (refused: review EO)
    (b'"Comments; notes"\nfine\nok\n', ("Comments; notes",)),
    # a semicolon in one header of two, trailing tabs, a bare quote (refused: review EQ)
    (b"Name,Tags;comma;list\na,b\n", ("Name", "Tags;comma;list")),
    (b"Name,Amount\t\t\na,1\n", ("Name", "Amount")),
    (b'Name,Size (5")\n"Smith; Jr; John",12\n', ("Name", 'Size (5")')),
    (b"Name,Notes (a;b),Tags (x;y)\nann,1,2\n", ("Name", "Notes (a;b)", "Tags (x;y)")),
])
def test_a_comma_csv_may_hold_semicolons_and_tabs(tmp_path: Path, content: bytes,
                                                  header: tuple[str, ...]) -> None:
    source = tmp_path / "c.csv"
    source.write_bytes(content)
    assert report.load_csv(source).header == header


def test_headers_that_share_words_are_told_apart_by_the_rest(tmp_path: Path) -> None:
    header = [f"Amount {n}" for n in range(1, 21)]
    rows = [[f"{1000 * n + r}.25" for n in range(1, 21)] for r in range(3)]
    source = write_csv(tmp_path / "twenty.csv", header, rows)
    lines = render_pages(source, tmp_path / "r.pdf")[0].split("\n")
    # "Amount 10" and "Amount 20" both printed "Am…0" when cut in the middle (review EO)
    assert [f"…{n}" for n in range(1, 21)] == [ln for ln in lines if ln.startswith("…")][:20]


def test_two_groups_of_alike_headers_each_lose_their_own_shared_words(tmp_path: Path) -> None:
    header = ["Revenue 2023 Q1 forecast", "Revenue 2023 Q2 forecast", "Cost 2024 H1 plan",
              "Cost 2024 H2 plan"]
    source = write_csv(tmp_path / "g.csv", header, [["1.5"] * 4])
    names = report._header_names(header, [40.0] * 4, 8.5)
    # (all four stripped of what all four share left two pairs alike, then numbered: review EQ)
    assert len(set(names)) == 4 and not any(n.startswith("#") for n in names), names
    assert render_pages(source, tmp_path / "r.pdf")
