"""The PDF check of an output (DESIGN.md: a .pdf must open with pypdf and have a page).

Real PDFs written with pypdf, their page trees shaped by hand where a case needs it, read
back by the worker's check."""

from __future__ import annotations

import io
import time

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import ArrayObject, DictionaryObject, NameObject, NumberObject

from renderctl.errors import InvalidOutput
from renderctl.worker import _declared_pages, pdf_pages


def _pdf(writer: PdfWriter) -> bytes:
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def _blank(n: int) -> PdfWriter:
    w = PdfWriter()
    for _ in range(n):
        w.add_blank_page(200, 200)
    return w


def _nest_first_page(w: PdfWriter, levels: int) -> None:
    """Put the first page under ``levels`` intermediate /Pages nodes."""
    root = w._root_object["/Pages"]
    kids = root["/Kids"]
    child_ref = kids[0]
    for _ in range(levels):
        node = DictionaryObject({
            NameObject("/Type"): NameObject("/Pages"),
            NameObject("/Kids"): ArrayObject([child_ref]),
            NameObject("/Count"): NumberObject(1),
        })
        ref = w._add_object(node)
        child_ref.get_object()[NameObject("/Parent")] = ref
        child_ref = ref
    child_ref.get_object()[NameObject("/Parent")] = root.indirect_reference
    kids[0] = child_ref


def test_counts_pages_of_a_flat_tree() -> None:
    assert pdf_pages(_pdf(_blank(3)), "out.pdf") == 3


def test_reads_the_declared_count_through_nested_nodes() -> None:
    w = _blank(4)
    _nest_first_page(w, 5)
    data = _pdf(w)
    assert _declared_pages(PdfReader(io.BytesIO(data))) == 4
    assert len(PdfReader(io.BytesIO(data)).pages) == 4  # what pypdf's full walk says
    assert pdf_pages(data, "out.pdf") == 4


def test_a_big_pdf_is_not_walked_page_by_page() -> None:
    data = _pdf(_blank(3000))
    reader = PdfReader(io.BytesIO(data))
    t0 = time.process_time()
    assert _declared_pages(reader) == 3000
    quick = time.process_time() - t0
    reader = PdfReader(io.BytesIO(data))
    t0 = time.process_time()
    assert len(reader.pages) == 3000
    full = time.process_time() - t0
    # The quick path reads three objects, the full walk 3,000 (~0.2 s against ~0.1 ms).
    assert quick < full / 10, (quick, full)


def test_no_pages_is_invalid() -> None:
    with pytest.raises(InvalidOutput, match="out.pdf: the PDF has no pages"):
        pdf_pages(_pdf(PdfWriter()), "out.pdf")


def test_a_first_branch_without_pages_leaves_it_to_the_full_walk() -> None:
    w = _blank(1)
    root = w._root_object["/Pages"]
    empty = w._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Pages"), NameObject("/Kids"): ArrayObject(),
        NameObject("/Count"): NumberObject(0), NameObject("/Parent"): root.indirect_reference}))
    root["/Kids"].insert(0, empty)
    data = _pdf(w)
    assert _declared_pages(PdfReader(io.BytesIO(data))) is None
    assert pdf_pages(data, "out.pdf") == 1


def test_a_tree_that_declares_pages_it_lacks_is_invalid() -> None:
    w = PdfWriter()
    w._root_object["/Pages"][NameObject("/Count")] = NumberObject(2)
    with pytest.raises(InvalidOutput, match="has no pages"):
        pdf_pages(_pdf(w), "out.pdf")


def test_a_cyclic_page_tree_ends() -> None:
    w = _blank(1)
    root = w._root_object["/Pages"]
    root["/Kids"][0] = root.indirect_reference  # the root is its own first kid
    data = _pdf(w)
    assert _declared_pages(PdfReader(io.BytesIO(data))) is None
    # pypdf's full walk decides: whatever it says, the check ends with a clear verdict.
    try:
        pages = pdf_pages(data, "out.pdf")
    except InvalidOutput as exc:
        assert str(exc).startswith("out.pdf: ")
    else:
        assert pages >= 0


def test_an_encrypted_pdf_is_judged_by_the_full_walk() -> None:
    w = _blank(2)
    w.encrypt("secret", algorithm="RC4-128")
    data = _pdf(w)
    assert _declared_pages(PdfReader(io.BytesIO(data))) is None
    # pypdf cannot read its page tree without the password: not an output we can check.
    with pytest.raises(InvalidOutput, match="not a readable PDF: .*not been decrypted"):
        pdf_pages(data, "out.pdf")


def test_not_a_pdf() -> None:
    with pytest.raises(InvalidOutput, match=r"out.pdf: not a PDF \(no %PDF- header\)"):
        pdf_pages(b"hello", "out.pdf")
    with pytest.raises(InvalidOutput, match="out.pdf: not a readable PDF"):
        pdf_pages(b"%PDF-1.7\nnothing else", "out.pdf")
