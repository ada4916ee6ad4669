"""merge, stamp and split on real PDFs, and open_pdf's refusal of unusable inputs."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.annotations import Link
from pypdf.errors import DeprecationError, PyPdfError
from pypdf.generic import (
    ArrayObject,
    ByteStringObject,
    ContentStream,
    DecodedStreamObject,
    DictionaryObject,
    FloatObject,
    NameObject,
    NumberObject,
    PdfObject,
    RectangleObject,
    StreamObject,
    TextStringObject,
)
from reportlab.lib.pagesizes import A4, landscape, letter
from reportlab.pdfgen.canvas import Canvas

from renderctl.errors import InvalidInput
from renderctl.render import pdfops, safety


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


def make_pdf(
    path: Path, label: str, pages: int, *, sizes: tuple[tuple[float, float], ...] = (A4,)
) -> Path:
    canvas = Canvas(str(path), invariant=True)
    for page in range(pages):
        canvas.setPageSize(sizes[page % len(sizes)])
        canvas.drawString(72, 72, f"{label} page {page + 1}")
        canvas.showPage()
    canvas.save()
    return path


@pytest.fixture
def a_pdf(tmp_path: Path) -> Path:
    return make_pdf(tmp_path / "alpha.pdf", "alpha", 2)


@pytest.fixture
def b_pdf(tmp_path: Path) -> Path:
    return make_pdf(tmp_path / "beta.pdf", "beta", 3, sizes=(letter, landscape(A4)))


# -- merge ---------------------------------------------------------------------------------


def test_merge_keeps_order_and_adds_one_outline_entry_per_input(
    tmp_path: Path, a_pdf: Path, b_pdf: Path
) -> None:
    out = tmp_path / "merged.pdf"
    pdfops.merge([a_pdf, b_pdf, a_pdf], out, {})
    reader = PdfReader(out)
    assert len(reader.pages) == 2 + 3 + 2
    texts = [page.extract_text() for page in reader.pages]
    assert [t.strip() for t in texts] == [
        "alpha page 1",
        "alpha page 2",
        "beta page 1",
        "beta page 2",
        "beta page 3",
        "alpha page 1",
        "alpha page 2",
    ]
    outline = reader.outline
    assert [entry.title for entry in outline] == ["alpha", "beta", "alpha"]
    assert [reader.get_destination_page_number(entry) for entry in outline] == [0, 2, 5]


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda data: data[: len(data) // 2], "truncated PDF"),
        (lambda data: b"", "empty file"),
        (lambda data: b"%PDF-1.7\n" + bytes(range(256)) * 4 + b"\n%%EOF\n", "unreadable PDF"),
    ],
    ids=["truncated", "empty", "garbage"],
)
def test_merge_names_the_bad_inputs_position_and_full_path(
    tmp_path: Path, a_pdf: Path, spoil: object, reason: str
) -> None:
    # Given 400 inputs named alike in different folders, of which inputs[376] is broken
    inputs = []
    for index in range(400):
        folder = tmp_path / f"batch{index % 7}" / f"n{index}"
        folder.mkdir(parents=True)
        path = folder / f"doc{index + 1}.pdf"
        path.write_bytes(a_pdf.read_bytes())
        inputs.append(path)
    inputs[376].write_bytes(spoil(a_pdf.read_bytes()))  # type: ignore[operator]
    with pytest.raises(InvalidInput) as caught:
        pdfops.merge(inputs, tmp_path / "out.pdf", {})
    assert str(caught.value).startswith(f"inputs[376] {inputs[376]}: {reason}")
    assert str(inputs[376]).startswith("/")


# -- stamp ---------------------------------------------------------------------------------


@pytest.mark.parametrize("position", pdfops.POSITIONS)
def test_stamp_text_is_on_every_page(tmp_path: Path, b_pdf: Path, position: str) -> None:
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([b_pdf], out, {"text": "DRAFT <b>", "position": position, "opacity": 0.5})
    reader = PdfReader(out)
    assert len(reader.pages) == 3
    for number, page in enumerate(reader.pages, 1):
        text = page.extract_text()
        assert "DRAFT <b>" in text
        assert f"beta page {number}" in text


def test_stamp_adds_each_page_a_bounded_set_of_resources(tmp_path: Path) -> None:
    # Given 60 pages sharing one /Font dictionary (as reportlab writes them)
    source = make_pdf(tmp_path / "many.pdf", "many", 60)
    fonts = PdfReader(source).pages
    assert fonts[0]["/Resources"]["/Font"] is fonts[59]["/Resources"]["/Font"]

    # When they are stamped
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([source], out, {"text": "PAID"})

    # Then each page names its own font and the stamp's (before, the shared dictionary got
    # the stamp's font again under a new name for every page, each merge looking through
    # all the names before: 121 on every page here, quadratic time), and every page still
    # shows its text and the stamp
    reader = PdfReader(out)
    for number, page in enumerate(reader.pages, 1):
        assert len(page["/Resources"]["/Font"]) <= 3, (number, page["/Resources"]["/Font"])
        text = page.extract_text()
        assert f"many page {number}" in text and "PAID" in text


def test_stamp_draws_once_on_pages_that_share_one_content_stream(tmp_path: Path) -> None:
    # Given three pages drawn by one content stream object (a file may store identical
    # pages once)
    text = b"BT /F1 24 Tf 72 720 Td (same on each) Tj ET"
    kids = b" ".join(b"%d 0 R" % n for n in (3, 4, 5))
    page = b"<< /Type /Page /Parent 2 0 R /Contents 6 0 R /Resources << /Font << /F1 7 0 R >> >> >>"
    source = _raw_pdf(tmp_path / "shared.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count 3 /MediaBox [0 0 612 792] >>",
        page, page, page,
        b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ])

    # When they are stamped
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([source], out, {"text": "PAID"})

    # Then each shows its text and one stamp (before, pypdf wrote each page's merged content
    # over the shared stream: the pages after the first drew every stamp before theirs)
    for number, stamped in enumerate(PdfReader(out).pages, 1):
        assert stamped.extract_text().split() == ["same", "on", "each", "PAID"], number


def test_stamp_follows_a_mediabox_that_does_not_start_at_zero(tmp_path: Path, a_pdf: Path) -> None:
    shifted = tmp_path / "shifted.pdf"
    writer = PdfWriter(clone_from=a_pdf)
    for page in writer.pages:
        page.mediabox = RectangleObject((100, 200, 100 + 595, 200 + 842))
    writer.write(shifted)
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([shifted], out, {"text": "COPY", "rotation": 0})
    x, y, _, _ = _stamp_at(PdfReader(out).pages[0], "COPY")
    assert 100 < x < 100 + 595 and 200 < y < 200 + 842


def _stamp_matrix(page: Any) -> list[float]:
    """The transformation the page's content sets before it draws the stamp's form."""
    cm = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    for operands, operator in ContentStream(page.get_contents(), page.pdf).operations:
        if operator == b"cm":
            cm = [float(v) for v in operands]
        elif operator == b"Do" and str(operands[0]).startswith("/RctlStamp"):
            return cm
    raise AssertionError("the page draws no stamp")


def _stamp_at(page: Any, word: str) -> tuple[float, float, float, float]:
    """Where ``word`` of the stamp starts and which way it runs, in the page's own space.
    (pypdf 7's text visitor reports text in a form in the form's own space, without the
    transformation in force where the page draws it: that is applied here.)"""
    found: list[tuple[float, float, float, float]] = []

    def visit(text: str, cm: list[float], tm: list[float], *_: object) -> None:
        if word in text:
            x = tm[4] * cm[0] + tm[5] * cm[2] + cm[4]
            y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
            dx, dy = tm[0] * cm[0] + tm[1] * cm[2], tm[0] * cm[1] + tm[1] * cm[3]
            found.append((x, y, dx, dy))

    page.extract_text(visitor_text=visit)
    assert found, f"{word} not found"
    x, y, dx, dy = found[0]
    a, b, c, d, e, f = _stamp_matrix(page)
    return a * x + c * y + e, b * x + d * y + f, a * dx + c * dy, b * dx + d * dy


def _shown_stamp(page: Any, word: str) -> tuple[float, float, float, float, float, float]:
    """Where ``word`` starts and which way it runs, as a viewer shows the page: in the crop
    box turned clockwise by /Rotate. Returns (x, y, dx, dy, shown width, shown height)."""
    x, y, dx, dy = _stamp_at(page, word)
    box = page.cropbox
    w, h = float(box.width), float(box.height)
    x, y = x - float(box.left), y - float(box.bottom)
    turn = page.rotation % 360
    if turn == 90:
        return y, w - x, dy, -dx, h, w
    if turn == 180:
        return w - x, h - y, -dx, -dy, w, h
    if turn == 270:
        return h - y, x, -dy, dx, h, w
    return x, y, dx, dy, w, h


@pytest.mark.parametrize("size", [(842, 200), (960, 540), (540, 960), (595, 842), (60, 40)],
                         ids=["banner", "slide", "portrait-slide", "A4", "tiny"])
@pytest.mark.parametrize("rotation", [45.0, 0.0, 90.0, -30.0])
@pytest.mark.parametrize("position", ["center", "bottom-right", "top-left", "bottom"])
def test_a_long_stamp_fits_the_page_whatever_its_turn(tmp_path: Path, size: tuple[int, int],
                                                      rotation: float, position: str) -> None:
    from reportlab.pdfbase.pdfmetrics import stringWidth

    # Given a page of this shape, and a long centred stamp at this angle
    text = "CONFIDENTIAL - INTERNAL USE ONLY"
    src = make_pdf(tmp_path / "in.pdf", "in", 1, sizes=(size,))

    # When it is stamped
    out = tmp_path / "out.pdf"
    pdfops.stamp([src], out, {"text": text, "rotation": rotation, "position": position})

    # Then both ends of the stamp's line of text lie on the page (before: fitted to the
    # width before it was turned, a 45-degree stamp ran off a banner's and a slide's top
    # and bottom, its middle all that showed: audit BI; placed at an edge or corner as if
    # unturned, it ran off there: review BK)
    page = PdfReader(out).pages[0]
    sizes: list[float] = []
    page.extract_text(visitor_text=lambda t, cm, tm, font, fs: sizes.append(
        fs * (tm[0] ** 2 + tm[1] ** 2) ** 0.5) if "CONFIDENTIAL" in t else None)
    x, y, dx, dy = _stamp_at(page, "CONFIDENTIAL")
    length = stringWidth(text, "Helvetica-Bold", sizes[0])
    norm = (dx * dx + dy * dy) ** 0.5
    for px, py in ((x, y), (x + dx / norm * length, y + dy / norm * length)):
        assert 0 <= px <= size[0] and 0 <= py <= size[1], (px, py, size)


def test_stamp_lands_upright_where_asked_on_turned_and_cropped_pages(tmp_path: Path) -> None:
    # Given pages turned 0, 90, 180 and 270 degrees by /Rotate, and one whose crop box is
    # a window well inside its media box
    source = make_pdf(tmp_path / "mixed.pdf", "mixed", 5, sizes=((600, 800),))
    writer = PdfWriter(clone_from=source)
    for page, turn in zip(writer.pages, (0, 90, 180, 270, 0), strict=True):
        page.rotate(turn)
    writer.pages[4].cropbox = RectangleObject((150, 150, 450, 650))
    writer.write(tmp_path / "turned.pdf")

    # When it is stamped at the top right, unrotated
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([tmp_path / "turned.pdf"], out, {"text": "OK", "position": "top-right"})

    # Then on every page, as shown, the text reads left to right in the top-right quarter
    # of what is visible (it used to land sideways or upside down in another corner, and
    # above the crop box where nobody sees it)
    for number, page in enumerate(PdfReader(out).pages, 1):
        x, y, dx, dy, w, h = _shown_stamp(page, "OK")
        assert dx > 0 and abs(dy) < 1e-6 * dx, (number, dx, dy)
        assert w / 2 < x < w and h / 2 < y < h, (number, x, y, w, h)


@pytest.mark.parametrize("crop", [(0, 0, 1224, 792), (700, 0, 1300, 792), (10, 10, 10, 10),
                                  (-300, 100, 400, 700)],
                         ids=["twice-as-wide", "outside", "no-area", "overhanging-left"])
def test_stamp_lands_in_what_a_viewer_shows_when_the_crop_box_overhangs_the_media_box(
        tmp_path: Path, a_pdf: Path, crop: tuple[int, int, int, int]) -> None:
    # Given a letter page (612 x 792) whose crop box reaches past its media box, lies
    # outside it, or has no area: a viewer shows the two boxes' intersection (the media box
    # when that is empty)
    writer = PdfWriter(clone_from=a_pdf)
    writer.pages[0].mediabox = RectangleObject((0, 0, 612, 792))
    writer.pages[0].cropbox = RectangleObject(crop)
    writer.write(tmp_path / "cropped.pdf")
    x0, y0, x1, y1 = crop
    left, bottom, right, top = max(0, x0), max(0, y0), min(612, x1), min(792, y1)
    if right <= left or top <= bottom:
        left, bottom, right, top = 0, 0, 612, 792

    # When it is stamped in the centre, unturned
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([tmp_path / "cropped.pdf"], out, {"text": "OK", "rotation": 0})

    # Then the stamp starts inside what is shown, and is centred there (before: centred on
    # the crop box as written, half off the page, or off it altogether: audit BL)
    x, y, dx, dy = _stamp_at(PdfReader(out).pages[0], "OK")
    assert left < x < (left + right) / 2 < right and bottom < y < top, (x, y)
    assert dx > 0 and abs(dy) < 1e-6 * dx


@pytest.mark.parametrize(("pages", "said"), [(3, 1), (1, 5), (2, 999_999_999)])
def test_stamp_publishes_the_true_page_count_where_the_input_lied(
        tmp_path: Path, pages: int, said: int) -> None:
    # Given a PDF whose page tree says /Count N but holds another number of pages
    writer = PdfWriter(clone_from=make_pdf(tmp_path / "in.pdf", "page", pages))
    writer._root_object["/Pages"].get_object()[NameObject("/Count")] = NumberObject(said)
    writer.write(tmp_path / "lying.pdf")

    # When it is stamped
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([tmp_path / "lying.pdf"], out, {"text": "SEEN"})

    # Then the output's /Count is its real number of pages, each stamped (before: the lie
    # was copied, and a viewer trusting /Count showed 1 of 3 stamped pages: audit BL)
    reader = PdfReader(out)
    assert reader.trailer["/Root"]["/Pages"]["/Count"] == pages == len(reader.pages)
    assert all("SEEN" in page.extract_text() for page in reader.pages)


def test_stamp_lands_upright_on_a_page_whose_box_is_written_corner_to_corner_reversed(
    tmp_path: Path, a_pdf: Path
) -> None:
    # Given a media box written from its top-right corner to its bottom-left one, which the
    # PDF standard allows (any two opposite corners) and viewers show as the same page
    writer = PdfWriter(clone_from=a_pdf)
    writer.pages[0].mediabox = RectangleObject((595, 842, 0, 0))
    writer.write(tmp_path / "reversed.pdf")

    # When it is stamped at the top left
    out = tmp_path / "stamped.pdf"
    pdfops.stamp([tmp_path / "reversed.pdf"], out, {"text": "OK", "position": "top-left"})

    # Then the stamp reads left to right, at its size, in the top-left quarter of the page
    # (it was drawn mirrored and upside down at the bottom: a negative width and font size)
    found: list[tuple[float, float, float, float]] = []

    def visit(text: str, cm: list[float], tm: list[float], *_: object) -> None:
        if "OK" in text:
            x = tm[4] * cm[0] + tm[5] * cm[2] + cm[4]
            y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
            found.append((x, y, tm[0] * cm[0] + tm[1] * cm[2], tm[0] * cm[1] + tm[1] * cm[3]))

    PdfReader(out).pages[0].extract_text(visitor_text=visit)
    x, y, dx, dy = found[0]
    assert dx > 0 and abs(dy) < 1e-6 * dx
    assert 0 < x < 595 / 2 and 842 / 2 < y < 842


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "params.text"),
        ({"text": "   "}, "params.text"),
        ({"text": "X", "opacity": 2}, "params.opacity"),
        ({"text": "X", "font_size": 0}, "params.font_size"),
        ({"text": "X", "position": "middle"}, "params.position"),
        ({"text": "X", "rotation": "45"}, "params.rotation"),
    ],
)
def test_stamp_rejects_bad_params(
    tmp_path: Path, a_pdf: Path, params: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        pdfops.stamp([a_pdf], tmp_path / "out.pdf", params)


# -- split ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("per_part", "expected"), [(1, [1] * 5), (2, [2, 2, 1]), (5, [5]), (9, [5])]
)
def test_split_writes_numbered_parts(tmp_path: Path, per_part: int, expected: list[int]) -> None:
    source = make_pdf(tmp_path / "five.pdf", "five", 5)
    out = tmp_path / "parts"
    out.mkdir()
    pdfops.split([source], out, {"pages_per_part": per_part})
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"part-{i:04d}.pdf" for i in range(1, len(expected) + 1)]
    counts = [len(PdfReader(out / name).pages) for name in names]
    assert counts == expected
    first_texts = [PdfReader(out / name).pages[0].extract_text().strip() for name in names]
    assert first_texts == [f"five page {1 + i * per_part}" for i in range(len(expected))]


def test_a_split_part_carries_no_page_of_another_part(tmp_path: Path) -> None:
    # Given a five-page PDF whose first page links to its fifth (a table of contents)
    canvas = Canvas(str(tmp_path / "linked.pdf"))
    for n in range(1, 6):
        canvas.drawString(72, 720, f"linked page {n}")
        canvas.bookmarkPage(f"p{n}")
        if n == 1:
            canvas.linkAbsolute("to page 5", "p5", (72, 700, 200, 740))
            canvas.linkAbsolute("to page 2", "p2", (72, 600, 200, 640))
        if n == 2:
            canvas.linkAbsolute("to page 1", "p1", (72, 600, 200, 640))
        canvas.showPage()
    canvas.save()
    # and notes that lead there too: a reply (/IRT) to a note on page 5, and a note whose
    # /P, left stale by a tool that reordered pages, names page 4
    writer = PdfWriter(clone_from=tmp_path / "linked.pdf")
    refs = [page.indirect_reference for page in writer.pages]

    def note(on: int, **keys: Any) -> Any:
        annot = DictionaryObject({NameObject("/Type"): NameObject("/Annot"),
                                  NameObject("/Subtype"): NameObject("/Text"),
                                  NameObject("/Rect"): RectangleObject([0, 0, 20, 20]),
                                  **{NameObject("/" + k): v for k, v in keys.items()}})
        ref = writer._add_object(annot)
        page = writer.pages[on]
        if "/Annots" not in page:
            page[NameObject("/Annots")] = ArrayObject()
        page["/Annots"].append(ref)
        return ref

    note(0, P=refs[0], IRT=note(4, P=refs[4]))
    note(1, P=refs[3])
    writer.write(tmp_path / "linked.pdf")
    out = tmp_path / "parts"
    out.mkdir()

    # When it is split into parts of two pages
    pdfops.split([tmp_path / "linked.pdf"], out, {"pages_per_part": 2})

    # Then the first part holds its two pages and nothing of pages 4 or 5: the link's target
    # came along, unseen in its page tree, its text sent to whoever got the part (audit
    # EN), and with pypdf's append a note's reference carried the whole document (review
    # EO); the notes stay, on their own pages
    part = PdfReader(out / "part-0001.pdf")
    assert [[a.get_object()["/Subtype"] for a in page.get("/Annots", [])]
            for page in part.pages] == [["/Link", "/Text"], ["/Link", "/Text"]]
    # and its links within the part lead to its pages, the one to a later page too (a copy
    # of page 2 outside the page tree, before: review EQ)
    own = [page.indirect_reference.idnum for page in part.pages]
    assert [page["/Annots"][0].get_object()["/Dest"][0].idnum
            for page in part.pages] == [own[1], own[0]]
    assert len(part.pages) == 2
    texts = []
    for num in {n for gens in part.xref.values() for n in gens}:
        obj = part.get_object(num)
        if isinstance(obj, DictionaryObject) and obj.get("/Type") == "/Page":
            shown = re.search(rb"linked page \d", obj["/Contents"].get_object().get_data())
            texts.append(shown.group().decode() if shown else "")
    assert sorted(texts) == ["linked page 1", "linked page 2"], texts


def _page_with_box(path: Path, box: object) -> Path:
    """A one-page PDF whose page has ``box`` as its /MediaBox (None: none at all)."""
    writer = PdfWriter()
    page = writer.add_blank_page(100, 100)
    if box is None:
        del page[NameObject("/MediaBox")]
    else:
        page[NameObject("/MediaBox")] = box  # type: ignore[assignment]
    writer.write(path)
    return path


@pytest.mark.parametrize("op", ["merge", "split", "stamp"])
@pytest.mark.parametrize(("box", "message"), [
    (None, "no usable page size (/MediaBox)"),
    (RectangleObject([0, 0, 0, 0]), "has no area"),
], ids=["missing", "no-area"])
def test_a_page_without_a_usable_size_is_invalid_input(
        tmp_path: Path, a_pdf: Path, op: str, box: object, message: str) -> None:
    # Given an input whose first page has no page size, or one of no area (split and merge
    # published both, stamp the one of no area, and pypdf itself could not size the page
    # read back)
    bad = _page_with_box(tmp_path / "bad.pdf", box)
    out = tmp_path / ("parts" if op == "split" else "out.pdf")
    if op == "split":
        out.mkdir()
    inputs = [a_pdf, bad] if op == "merge" else [bad]
    with pytest.raises(InvalidInput, match=r"bad\.pdf: page 1: .*" + re.escape(message)):
        getattr(pdfops, op)(inputs, out, {"text": "X"} if op == "stamp" else {})


@pytest.mark.parametrize("op", ["merge", "split", "stamp"])
def test_a_page_tree_entry_that_is_no_page_is_said_so_by_every_operation(
        tmp_path: Path, op: str) -> None:
    # Given an input whose page tree lists a null, a page, and a page written in place
    # that has no size
    bad = _raw_pdf(tmp_path / "bad.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [null 3 0 R << /Type /Page >>] /Count 2 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>"])
    out = tmp_path / ("parts" if op == "split" else "out.pdf")
    if op == "split":
        out.mkdir()

    # When it is merged, split or stamped
    # Then each says the second page has no size, as merge and split did (stamp said
    # pypdf's "'NoneType' object has no attribute 'idnum'" as damage; audit FO)
    with pytest.raises(InvalidInput, match=r"bad\.pdf: page 2: no usable page size"):
        getattr(pdfops, op)([bad], out, {"text": "X"} if op == "stamp" else {})


def _raw_pdf(path: Path, objects: list[bytes]) -> Path:
    """A PDF of ``objects`` (numbered from 1) with a correct xref table."""
    out, offsets = b"%PDF-1.7\n", []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    path.write_bytes(out)
    return path


def _in_object_stream(path: Path, filter_name: bytes) -> Path:
    """A one-page PDF whose page tree is in an object stream compressed with the filter
    named ``filter_name`` (its objects found through a cross-reference stream)."""
    inner = [b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
             b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>"]
    header = b"2 0 3 %d " % (len(inner[0]) + 1)
    packed = zlib.compress(header + b" ".join(inner))
    content = b"BT /F1 12 Tf 72 700 Td (hi) Tj ET"
    bodies = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
              4: b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
              5: b"<< /Type /ObjStm /N 2 /First %d /Length %d /Filter /%s >>\nstream\n%s"
                 b"\nendstream" % (len(header), len(packed), filter_name, packed)}
    out, at = b"%PDF-1.7\n", {}
    for n, body in bodies.items():
        at[n] = len(out)
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    at[6] = len(out)
    rows = b"".join(struct.pack(">BIH", *row) for row in [
        (0, 0, 65535), (1, at[1], 0), (2, 5, 0), (2, 5, 1), (1, at[4], 0), (1, at[5], 0),
        (1, at[6], 0)])
    out += (b"6 0 obj\n<< /Type /XRef /Size 7 /W [1 4 2] /Root 1 0 R /Length %d >>\nstream\n"
            b"%s\nendstream\nendobj\nstartxref\n%d\n%%%%EOF\n" % (len(rows), rows, at[6]))
    path.write_bytes(out)
    return path


@pytest.mark.parametrize("operation", ["merge", "stamp", "split"])
def test_a_filter_name_pypdf_no_longer_reads_is_invalid_input_not_a_retried_failure(
        tmp_path: Path, operation: str) -> None:
    # Given the same PDF twice, its object stream's filter named in full, then abbreviated
    # (/Fl: pypdf raises its DeprecationError, which is no PyPdfError)
    full = _in_object_stream(tmp_path / "full.pdf", b"FlateDecode")
    short = _in_object_stream(tmp_path / "short.pdf", b"Fl")
    out = tmp_path / "out"
    out.mkdir()
    getattr(pdfops, operation)([full], out if operation == "split" else out / "a.pdf",
                               {"text": "X"})

    # When the abbreviated one is used, then it is invalid input, naming the file (it was a
    # `failed` attempt, retried to max_attempts, then dead: audit DU)
    with pytest.raises(InvalidInput, match=r"short\.pdf: unreadable PDF: .*/Fl"):
        getattr(pdfops, operation)([short], out if operation == "split" else out / "b.pdf",
                                   {"text": "X"})


def test_a_deprecation_error_not_from_a_filter_is_no_verdict_on_the_input() -> None:
    # pypdf raises it too where its caller uses an API it has removed: renderctl's bug after
    # an upgrade, which must not dead-letter every input as unreadable (review DX)
    with pytest.raises(DeprecationError), pdfops.pdf_errors("in.pdf"):
        raise DeprecationError("PdfMerger is deprecated and was removed in pypdf 5.0.0")


def test_the_same_broken_input_fails_with_the_same_message_every_time(tmp_path: Path) -> None:
    # Given a page whose content stream's /Length refers to its own stream object
    bad = _raw_pdf(tmp_path / "loop.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length 4 0 R >>\nstream\nBT ET\nendstream"])

    # When it is stamped twice (as two attempts, or two jobs, would)
    messages = []
    for _ in range(2):
        with pytest.raises(InvalidInput) as info:
            pdfops.stamp([bad], tmp_path / "out.pdf", {"text": "X"})
        messages.append(str(info.value))

    # Then both say the same, naming the object (pypdf's message held a memory address)
    assert messages[0] == messages[1] and "4 0 R" in messages[0], messages


def test_split_rejects_a_bad_part_size(tmp_path: Path, a_pdf: Path) -> None:
    (tmp_path / "parts").mkdir()
    with pytest.raises(InvalidInput, match="pages_per_part"):
        pdfops.split([a_pdf], tmp_path / "parts", {"pages_per_part": 0})


# -- unusable inputs -----------------------------------------------------------------------


def _encrypted(path: Path, source: Path, password: str) -> Path:
    writer = PdfWriter(clone_from=source)
    writer.encrypt(password, algorithm="RC4-128")  # pure Python in pypdf: no cryptography
    writer.write(path)
    return path


def _zero_pages(path: Path) -> Path:
    PdfWriter().write(path)
    return path


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda p, src: p.write_bytes(b"") and p, "empty file"),
        (lambda p, src: p.write_bytes(b"hello, I am a text file\n" * 20) and p, "not a PDF"),
        (lambda p, src: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200)) and p, "not a PDF"),
        (
            lambda p, src: p.write_bytes(src.read_bytes()[: src.stat().st_size // 2]) and p,
            "truncated",
        ),
        (
            lambda p, src: (
                p.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4 + b"\n%%EOF\n") and p
            ),
            "unreadable PDF",
        ),
        (lambda p, src: _encrypted(p, src, ""), "encrypted"),
        (lambda p, src: _encrypted(p, src, "secret"), "encrypted"),
        (lambda p, src: _zero_pages(p), "no pages"),
    ],
    ids=[
        "zero-bytes",
        "text",
        "png",
        "truncated",
        "garbage-body",
        "encrypted-empty-password",
        "encrypted",
        "zero-pages",
    ],
)
@pytest.mark.parametrize("operation", ["merge", "stamp", "split"])
def test_unusable_pdf_is_invalid_input(
    tmp_path: Path, a_pdf: Path, build: object, reason: str, operation: str
) -> None:
    bad = tmp_path / "bad.pdf"
    build(bad, a_pdf)  # type: ignore[operator]
    out = tmp_path / "out"
    if operation == "split":
        out.mkdir()
    with pytest.raises(InvalidInput, match=reason) as caught:
        getattr(pdfops, operation)([bad], out, {"text": "X"})
    assert "bad.pdf" in str(caught.value)


@pytest.mark.parametrize("padding", [4096, 200_000])
@pytest.mark.parametrize("operation", ["merge", "stamp", "split"])
def test_a_pdf_padded_after_its_eof_marker_is_read(
    tmp_path: Path, a_pdf: Path, padding: int, operation: str
) -> None:
    # Given a valid PDF that a transfer padded with NULs past the old 2 KB window
    padded = tmp_path / "padded.pdf"
    padded.write_bytes(a_pdf.read_bytes() + b"\0" * padding)
    out = tmp_path / "out"
    if operation == "split":
        out.mkdir()
    # When it is used, Then its pages come through like the unpadded file's
    getattr(pdfops, operation)([padded], out, {"text": "X", "pages_per_part": 5})
    written = next(out.iterdir()) if operation == "split" else out
    assert [p.extract_text().strip()[:12] for p in PdfReader(written).pages] == [
        "alpha page 1",
        "alpha page 2",
    ]


def _updated(path: Path, source: Path) -> Path:
    # An incremental update appends objects, an xref and a second %%EOF after the first.
    writer = PdfWriter(source, incremental=True)
    for number in range(40):
        writer.add_metadata({f"/Note{number}": "x" * 100})
        writer.pages[0][NameObject(f"/Extra{number}")] = writer._add_object(
            StreamObject()
        )
    writer.write(path)
    return path


@pytest.mark.parametrize("after", [16, 40, 300, 3000])
def test_a_pdf_cut_inside_an_appended_update_stays_truncated(
        tmp_path: Path, a_pdf: Path, after: int) -> None:
    whole = _updated(tmp_path / "whole.pdf", a_pdf)
    data = whole.read_bytes()
    first_eof = data.index(b"%%EOF")
    assert data.count(b"%%EOF") == 2 and len(data) - first_eof > 4096
    cut = tmp_path / "cut.pdf"
    # Cut after the base file's %%EOF, inside the update (3000: more than 2 KB after it)
    cut.write_bytes(data[: first_eof + after])
    with pytest.raises(InvalidInput, match="cut.pdf: truncated"):
        pdfops.open_pdf(cut)
    assert len(pdfops.open_pdf(whole).pages) == 2


@pytest.mark.parametrize("trailer", [
    b"\n-- \nSent from the stream of my obj phone; see the trailer and xref below\n",
    b"\r\n\r\n[attachment: scan 12 of 40, object 3 obj-free]\r\n",
], ids=["signature", "attachment-note"])
def test_a_whole_pdf_followed_by_a_mail_trailer_is_read(
        tmp_path: Path, a_pdf: Path, trailer: bytes) -> None:
    # Given a whole PDF after whose %%EOF a mail system appended a signature that uses
    # words PDF syntax uses too (before: refused as "truncated PDF": audit BL)
    mailed = tmp_path / "mailed.pdf"
    mailed.write_bytes(a_pdf.read_bytes() + trailer)
    # When it is opened, then all its pages are there
    assert len(pdfops.open_pdf(mailed).pages) == 2


def test_padding_beyond_the_search_window_is_refused(tmp_path: Path, a_pdf: Path) -> None:
    padded = tmp_path / "padded.pdf"
    padded.write_bytes(a_pdf.read_bytes() + b"\0" * (pdfops.EOF_SEARCH + 1))
    # (said with where it looked: the file may be whole, padded past the search; audit DU)
    with pytest.raises(InvalidInput, match=r"padded.pdf: truncated PDF \(no %%EOF marker at "
                                           r"its end, nor in its last 1024 KB\)"):
        pdfops.open_pdf(padded)


def test_missing_input_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        pdfops.open_pdf(tmp_path / "nope.pdf")


def test_stamp_leaves_a_page_content_as_it_is_even_a_decompression_bomb(
        tmp_path: Path, decompression_bomb: Path) -> None:
    # Given a page whose content stream inflates to 60 MB (above safety's 50 MB limit)
    source = decompression_bomb
    assert source.stat().st_size < 200_000
    # When it is stamped
    out = tmp_path / "out.pdf"
    pdfops.stamp([source], out, {"text": "X"})
    # Then the page's content is drawn as it was, never inflated (the stamp is drawn after
    # it, as a form of its own), as merge and split copy it
    streams = [s.get_object() for s in PdfReader(out).pages[0]["/Contents"]]
    original = PdfReader(source).pages[0]["/Contents"].get_object()
    assert len(streams) == 4 and streams[1]._data == original._data
    assert out.stat().st_size < 2 * source.stat().st_size


@pytest.mark.parametrize("codec", ["/JBIG2Decode", "/BrotliDecode"])
def test_a_page_in_a_filter_this_installation_cannot_decode_is_stamped_all_the_same(
        tmp_path: Path, codec: str) -> None:
    # Given a page whose content stream uses a filter pypdf decodes only with an optional
    # package or program (jbig2dec is never run from a job; brotli is an extra, not
    # installed by renderctl)
    pytest.importorskip("pypdf")
    if codec == "/BrotliDecode":
        try:
            import brotli  # noqa: F401
            pytest.skip("brotli is installed: pypdf decodes the filter")
        except ImportError:
            pass
    writer = PdfWriter()
    page = writer.add_blank_page(width=200, height=200)
    stream = StreamObject()
    stream._data = b"\x0b\x02\x80hello\x03"
    stream[NameObject("/Filter")] = NameObject(codec)
    page[NameObject("/Contents")] = writer._add_object(stream)
    source = tmp_path / "coded.pdf"
    with source.open("wb") as fh:
        writer.write(fh)
    # When it is stamped
    out = tmp_path / "out.pdf"
    pdfops.stamp([source], out, {"text": "X"})
    # Then its content is kept as it was, undecoded, the stamp drawn after it (it was
    # refused: the stamp decoded the page's content to merge into it)
    page = PdfReader(out).pages[0]
    streams = [s.get_object() for s in page["/Contents"]]
    assert streams[1]["/Filter"] == codec and streams[1]._data == b"\x0b\x02\x80hello\x03"
    assert "X" in page["/Resources"]["/XObject"]["/RctlStamp"].get_data().decode()


def test_a_pdf_larger_than_the_jobs_memory_ceiling_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.render import inputs

    # Given a job whose memory ceiling is 1 MB, and a 2 MB input (sparse: a header, then
    # nothing), which would be read whole
    monkeypatch.setattr(inputs, "memory_ceiling_bytes", 1 << 20)
    big = tmp_path / "big.pdf"
    with big.open("wb") as fh:
        fh.write(b"%PDF-1.7\n")
        fh.truncate(2 << 20)
    # When it is opened, Then it is refused, naming the file, its size and the ceiling
    with pytest.raises(InvalidInput, match=r"big\.pdf: 2 MB; a PDF is read whole, and this "
                                           r"job's memory ceiling is 1 MB"):
        pdfops.open_pdf(big)


def _none_written() -> None:
    import io

    from pypdf.generic import ArrayObject

    ArrayObject([None]).write_to_stream(io.BytesIO())  # an AttributeError raised in pypdf


def _pypdf_refuses() -> None:
    raise PyPdfError("Could not read malformed PDF file")


def _drawing_fails() -> None:
    from reportlab.pdfgen.canvas import Canvas

    Canvas("x.pdf").setFillColorRGB("red", 0, 0)  # a TypeError raised in reportlab


@pytest.mark.parametrize("fault, said", [
    (_none_written, "x.pdf: unreadable PDF: its structure is damaged (AttributeError in "
                    "pypdf: 'NoneType' object has no attribute"),
    (_pypdf_refuses, "x.pdf: unreadable PDF: Could not read malformed PDF file"),
    (_drawing_fails, "x.pdf: unreadable PDF: its structure is damaged (TypeError in "
                     "reportlab: "),
])
def test_a_plain_python_error_from_inside_a_library_is_said_as_damage(
        fault: Any, said: str) -> None:
    # A plain Python error raised deep in pypdf by a malformed file says what it means
    # before its own words (audit DM: "'NoneType' object has no attribute 'idnum'" alone),
    # naming the library that raised it (review DP: a stamp's drawing is reportlab's);
    # pypdf's own errors, written for users, are passed on as they are
    with pytest.raises(InvalidInput) as caught, pdfops.pdf_errors("x.pdf"):
        fault()
    assert str(caught.value).startswith(said), str(caught.value)


def test_a_split_of_pages_linked_in_a_chain_is_not_refused(tmp_path: Path) -> None:
    # Given 300 pages, each linking to the next (a "next page" button)
    canvas = Canvas(str(tmp_path / "chain.pdf"))
    for n in range(1, 301):
        canvas.drawString(72, 720, f"chain page {n}")
        canvas.bookmarkPage(f"p{n}")
        if n < 300:
            canvas.linkAbsolute("next", f"p{n + 1}", (72, 700, 200, 740))
        canvas.showPage()
    canvas.save()
    out = tmp_path / "parts"
    out.mkdir()

    # When it is split page by page (with the worker's recursion limit)
    pdfops.split([tmp_path / "chain.pdf"], out, {"pages_per_part": 1})

    # Then every part is its one page: each link's target was copied, and its link, and
    # so on down the chain, until pypdf's recursion overflowed and the valid PDF was
    # refused as unreadable (review EQ)
    assert len(list(out.iterdir())) == 300
    last = PdfReader(out / "part-0300.pdf")
    assert len(last.pages) == 1 and "chain page 300" in last.pages[0].extract_text()


def _linked_chain(path: Path, pages: int) -> Path:
    """``pages`` pages, each with a link to the next (a "next page" button)."""
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(200, 200)
    for n in range(pages - 1):
        writer.add_annotation(page_number=n, annotation=Link(
            rect=(10, 10, 50, 50), target_page_index=n + 1))
    with path.open("wb") as fh:
        writer.write(fh)
    return path


def _link_targets(path: Path) -> list[int | None]:
    """For each page of ``path``: the number (0-based) of the page its link leads to."""
    pages = PdfReader(path).pages
    index = {page.indirect_reference.idnum: n for n, page in enumerate(pages)}
    targets: list[int | None] = []
    for page in pages:
        links = [a.get_object() for a in page.get("/Annots") or []]
        targets.append(index.get(links[0]["/Dest"][0].idnum) if links else None)
    return targets


def test_a_merge_and_a_stamp_of_pages_linked_in_a_chain_keep_every_link(
        tmp_path: Path) -> None:
    # Given 500 pages, each linking to the next
    chain = _linked_chain(tmp_path / "chain.pdf", 500)
    next_pages: list[int | None] = [*range(1, 500), None]

    # When the document is merged after itself, and stamped
    pdfops.merge([chain, chain], tmp_path / "merged.pdf", {})
    pdfops.stamp([chain], tmp_path / "stamped.pdf", {"text": "DRAFT"})

    # Then both are written, each link leading to the copy of its target, in its own copy
    # of the document (copied with its page, a link took its target along, and so on down
    # the chain: pypdf's recursion overflowed at 400 pages and the valid PDF was dead-
    # lettered as damaged; audit FO)
    assert _link_targets(tmp_path / "merged.pdf") == next_pages + [
        n + 500 if n is not None else None for n in next_pages]
    assert _link_targets(tmp_path / "stamped.pdf") == next_pages
    stamped = PdfReader(tmp_path / "stamped.pdf").pages
    assert "DRAFT" in stamped[0].extract_text() and "DRAFT" in stamped[499].extract_text()


def test_a_merge_past_the_pages_one_pdf_can_hold_is_refused_before_it_is_written(
        tmp_path: Path) -> None:
    # Given an input of 50,002 pages (one page listed 25,001 times in each of two branches
    # of its page tree: 600 KB)
    kids = b"[" + b" ".join([b"4 0 R"] * 25_001) + b"]"
    big = _raw_pdf(tmp_path / "big.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R 5 0 R] /Count 50002 >>",
        b"<< /Type /Pages /Parent 2 0 R /Kids " + kids + b" /Count 25001 >>",
        b"<< /Type /Page /Parent 3 0 R /MediaBox [0 0 200 200] >>",
        b"<< /Type /Pages /Parent 2 0 R /Kids " + kids + b" /Count 25001 >>"])

    # When it is merged with itself (100,004 pages)
    with pytest.raises(InvalidInput) as caught:
        pdfops.merge([big, big], tmp_path / "out.pdf", {})

    # Then the merge is refused as the second input comes, saying why, and nothing is
    # written: pypdf writes a document's pages as one array and reads back at most 100,000
    # elements of one, so the output was dead-lettered as an unreadable PDF after the work
    # (audit FO)
    assert str(caught.value).startswith(
        f"inputs[1] {big}: the merge would have more than 100,000 pages (50,002 before this "
        "input's 50,002)"), str(caught.value)
    assert not (tmp_path / "out.pdf").exists()


def _link(**keys: PdfObject) -> DictionaryObject:
    return DictionaryObject({NameObject("/Type"): NameObject("/Annot"),
                             NameObject("/Subtype"): NameObject("/Link"),
                             NameObject("/Rect"): RectangleObject([0, 0, 50, 50]),
                             **{NameObject(f"/{k}"): v for k, v in keys.items()}})


def _named_links(path: Path) -> Path:
    """Three pages, the first linking by name to the second (/Dest) and the third (a GoTo
    action), as LaTeX's hyperref links every reference, each name with a view (/XYZ)."""
    writer = PdfWriter()
    for _ in range(3):
        writer.add_blank_page(200, 200)
    for name, n in (("chap2", 1), ("chap3", 2)):
        writer.add_named_destination_array(TextStringObject(name), ArrayObject([
            writer.pages[n].indirect_reference, NameObject("/XYZ"), NumberObject(0),
            NumberObject(150), NumberObject(0)]))
    goto = DictionaryObject({NameObject("/S"): NameObject("/GoTo"),
                             NameObject("/D"): TextStringObject("chap3")})
    remote = DictionaryObject({NameObject("/S"): NameObject("/GoToR"),
                               NameObject("/F"): TextStringObject("other.pdf"),
                               NameObject("/D"): TextStringObject("chap2")})
    writer.pages[0][NameObject("/Annots")] = ArrayObject([
        writer._add_object(_link(Dest=TextStringObject("chap2"))),
        writer._add_object(_link(A=goto)), writer._add_object(_link(A=remote))])
    writer.write(path)
    return path


def _named_link_targets(path: Path) -> list[list[tuple[int, str]]]:
    """For each page of ``path``: where each of its links by name leads (page, view)."""
    out = PdfReader(path)
    names = out.named_destinations
    targets = []
    for page in out.pages:
        here = []
        for ref in page.get("/Annots") or []:
            annot = ref.get_object()
            if "/A" in annot and annot["/A"]["/S"] == "/GoToR":
                here.append((-1, annot["/A"]["/D"]))  # (a name in another file)
                continue
            name = annot["/Dest"] if "/Dest" in annot else annot["/A"]["/D"]
            here.append((out.get_destination_page_number(names[name]), names[name].typ))
        targets.append(here)
    return targets


def test_a_merge_keeps_the_destinations_its_links_by_name_lead_to(tmp_path: Path) -> None:
    # Given a document whose links lead by name, as hyperref's do
    named = _named_links(tmp_path / "named.pdf")

    # When it is merged after another document, and after itself
    pdfops.merge([make_pdf(tmp_path / "first.pdf", "first", 2), named],
                 tmp_path / "after.pdf", {})
    pdfops.merge([named, named], tmp_path / "twice.pdf", {})

    # Then its links lead to its pages in the output, at their views: with the links
    # copied after the pages (out of pypdf's sight) the names were gone (review FP); by
    # pypdf's way every view was "fit width", and the links of a name two inputs share
    # (hyperref's page.1 is in every document) led to the first one's page (review FR)
    # (a GoToR's name is another file's: kept as it is, review FS)
    assert _named_link_targets(tmp_path / "after.pdf") == [
        [], [], [(3, "/XYZ"), (4, "/XYZ"), (-1, "chap2")], [], []]
    assert _named_link_targets(tmp_path / "twice.pdf") == [
        [(1, "/XYZ"), (2, "/XYZ"), (-1, "chap2")], [], [],
        [(4, "/XYZ"), (5, "/XYZ"), (-1, "chap2")], [], []]


def test_a_split_part_keeps_the_names_of_its_pages_and_drops_links_by_name_out_of_it(
        tmp_path: Path) -> None:
    # Given a document whose first page links by name to the second and the third
    named = _named_links(tmp_path / "named.pdf")

    # When it is split into parts of two pages
    out = tmp_path / "parts"
    out.mkdir()
    pdfops.split([named], out, {"pages_per_part": 2})

    # Then each part names the destinations on its own pages, at their views, and its links
    # by name lead there; a link by a name on the other part's page is dropped, as a link
    # to that page is (every link by name led nowhere: audit FY); a GoToR's stays
    first, second = out / "part-0001.pdf", out / "part-0002.pdf"
    assert list(PdfReader(first).named_destinations) == ["chap2"]
    assert list(PdfReader(second).named_destinations) == ["chap3"]
    assert _named_link_targets(first) == [[(1, "/XYZ"), (-1, "chap2")], []]
    assert _named_link_targets(second) == [[]]


def _split_in_one_part(path: Path, out: Path) -> PdfReader:
    out.mkdir()
    pdfops.split([path], out, {"pages_per_part": 9})
    return PdfReader(out / "part-0001.pdf")


def test_a_split_beside_an_old_dests_dictionary_keeps_its_links_by_name(tmp_path: Path) -> None:
    # Given a document with a name tree and the old /Dests dictionary both (pypdf reads
    # only the dictionary then), its first page linking by a string name to its second
    named = _named_links(tmp_path / "named.pdf")
    writer = PdfWriter(clone_from=named)
    writer._root_object[NameObject("/Dests")] = writer._add_object(DictionaryObject({
        NameObject("/old"): ArrayObject([writer.pages[2].indirect_reference,
                                         NameObject("/Fit")])}))
    writer.write(tmp_path / "both.pdf")

    # When it is split, then its links by name stay as they were (each was dropped as
    # leading to a name the part did not have: review GB)
    part = _split_in_one_part(tmp_path / "both.pdf", tmp_path / "parts")
    dests = [ref.get_object().get("/Dest") for ref in part.pages[0]["/Annots"]]
    assert "chap2" in dests, dests


def test_a_split_part_spells_a_links_name_as_its_name_tree_does(tmp_path: Path) -> None:
    # Given a name written in UTF-16 ("sec"), and a link by it in the same bytes
    writer = PdfWriter()
    for _ in range(2):
        writer.add_blank_page(200, 200)
    utf16 = ByteStringObject(b"\xfe\xff\x00s\x00e\x00c")
    names = DictionaryObject({NameObject("/Names"): ArrayObject([
        utf16, ArrayObject([writer.pages[1].indirect_reference, NameObject("/Fit")])])})
    writer._root_object[NameObject("/Names")] = writer._add_object(DictionaryObject({
        NameObject("/Dests"): writer._add_object(names)}))
    writer.pages[0][NameObject("/Annots")] = ArrayObject([
        writer._add_object(_link(Dest=utf16))])
    writer.write(tmp_path / "utf16.pdf")

    # When it is split into one part
    part = _split_in_one_part(tmp_path / "utf16.pdf", tmp_path / "parts")

    # Then the link names it as the part's name tree does (the tree spelled it anew, the
    # link kept its own bytes, and a viewer matching bytes found nothing: review GB)
    tree = part.trailer["/Root"]["/Names"]["/Dests"].get_object()
    leaf = tree["/Kids"][0].get_object() if "/Kids" in tree else tree
    key = leaf["/Names"][0]
    link = part.pages[0]["/Annots"][0].get_object()["/Dest"]
    assert link.get_original_bytes() == key.get_original_bytes(), (link, key)
    assert part.get_destination_page_number(part.named_destinations[str(link)]) == 1


@pytest.mark.parametrize("style", ["string", "old"])
def test_a_merge_tells_a_string_name_with_a_slash_from_an_old_style_name(
        tmp_path: Path, style: str) -> None:
    # Given a document with a link to a string name "/intro" (in its name tree), or to a
    # name /intro (in the old /Dests dictionary): pypdf keys both "/intro"
    writer = PdfWriter()
    for _ in range(2):
        writer.add_blank_page(200, 200)
    dest = ArrayObject([writer.pages[1].indirect_reference, NameObject("/Fit")])
    if style == "string":
        writer.add_named_destination_array(TextStringObject("/intro"), dest)
        link = _link(Dest=TextStringObject("/intro"))
    else:
        writer._root_object[NameObject("/Dests")] = DictionaryObject(
            {NameObject("/intro"): dest})
        link = _link(Dest=NameObject("/intro"))
    writer.pages[0][NameObject("/Annots")] = ArrayObject([writer._add_object(link)])
    writer.write(tmp_path / "slash.pdf")

    # When it is merged
    pdfops.merge([tmp_path / "slash.pdf"], tmp_path / "out.pdf", {})

    # Then the string name is carried, its link leading to page 2 (skipped for its "/", it
    # led nowhere: review FT); the old-style name is not (a string name tree cannot hold
    # it; written there, it was a string no link names)
    out = PdfReader(tmp_path / "out.pdf")
    if style == "string":
        assert list(out.named_destinations) == ["/intro"]
        assert out.get_destination_page_number(out.named_destinations["/intro"]) == 1
    else:
        assert "/Names" not in out.trailer["/Root"]


@pytest.mark.parametrize("per_leaf", [1000, 51_000], ids=["tree", "one-array"])
def test_a_merge_of_many_names_writes_them_as_a_tree_pypdf_reads_back(
        tmp_path: Path, per_leaf: int) -> None:
    # Given an input with 51,000 named destinations (pairs in one array are 102,000
    # elements, past the 100,000 pypdf reads), in leaves of 1,000 or in one array
    writer = PdfWriter()
    page = writer.add_blank_page(200, 200)
    pairs = ArrayObject()
    for n in range(51_000):
        pairs.extend([TextStringObject(f"n{n:05d}"), ArrayObject([
            page.indirect_reference, NameObject("/Fit")])])
    leaves = ArrayObject()
    for start in range(0, len(pairs), 2 * per_leaf):
        leaf = ArrayObject(pairs[start:start + 2 * per_leaf])
        leaves.append(writer._add_object(DictionaryObject({
            NameObject("/Names"): leaf,
            NameObject("/Limits"): ArrayObject([leaf[0], leaf[-2]])})))
    writer._root_object[NameObject("/Names")] = DictionaryObject({NameObject("/Dests"):
        writer._add_object(DictionaryObject({NameObject("/Kids"): leaves}))})
    writer.write(tmp_path / "many.pdf")

    # When it is merged
    pdfops.merge([tmp_path / "many.pdf"], tmp_path / "out.pdf", {})

    # Then every name is read back from the output, in order; or, those pypdf cannot read
    # in the input, the merge is made without them (it failed, where before names were
    # carried it was made: review FS)
    names = PdfReader(tmp_path / "out.pdf").named_destinations
    if per_leaf == 1000:
        assert len(names) == 51_000 and sorted(names)[:2] == ["n00000", "n00001"]
    else:
        assert names == {}


@pytest.mark.parametrize("op", ["merge", "split"])
def test_page_resources_named_like_page_actions_are_kept(tmp_path: Path, op: str) -> None:
    # Given a page drawing a form named /B with a graphics state named /AA (names a
    # document may give anything; /B is also a Type 3 font's glyph for "B")
    canvas = Canvas(str(tmp_path / "base.pdf"), pagesize=(200, 200))
    canvas.drawString(20, 100, "hello")
    canvas.showPage()
    canvas.save()
    writer = PdfWriter(clone_from=PdfReader(tmp_path / "base.pdf"))
    page = writer.pages[0]
    form = DecodedStreamObject()
    form.set_data(b"0 0 1 rg 10 10 50 50 re f")
    form.update({NameObject("/Type"): NameObject("/XObject"),
                 NameObject("/Subtype"): NameObject("/Form"),
                 NameObject("/BBox"): RectangleObject([0, 0, 200, 200])})
    resources = page["/Resources"].get_object()
    resources[NameObject("/XObject")] = DictionaryObject({NameObject("/B"):
                                                          writer._add_object(form)})
    resources[NameObject("/ExtGState")] = DictionaryObject({NameObject("/AA"): DictionaryObject(
        {NameObject("/Type"): NameObject("/ExtGState"), NameObject("/ca"): FloatObject(0.5)})})
    drawing = DecodedStreamObject()
    drawing.set_data(b"q /AA gs /B Do Q")
    page[NameObject("/Contents")] = ArrayObject([page.raw_get("/Contents"),
                                                 writer._add_object(drawing)])
    writer.write(tmp_path / "in.pdf")

    # When it is merged, or split
    if op == "merge":
        pdfops.merge([tmp_path / "in.pdf"], tmp_path / "out.pdf", {})
        out = tmp_path / "out.pdf"
    else:
        (tmp_path / "parts").mkdir()
        pdfops.split([tmp_path / "in.pdf"], tmp_path / "parts", {})
        out = tmp_path / "parts" / "part-0001.pdf"

    # Then both are in the output's resources (pypdf's excluded_keys, meant for the page's
    # own /B and /AA, dropped them at every depth: review FP)
    resources = PdfReader(out).pages[0]["/Resources"]
    assert list(resources["/XObject"]) == ["/B"]
    assert list(resources["/ExtGState"]) == ["/AA"]
