"""The PDF check of an output (DESIGN.md: a .pdf must open with pypdf and have a page).

Real PDFs written with pypdf, their page trees damaged by hand where a case needs it, read
back by the worker's check. The check walks the whole page tree as pypdf does: a page tree
pypdf cannot list is refused, even when its first branch is fine (a shortcut that trusted
the tree's declared /Count published PDFs that a downstream merge then refused)."""

from __future__ import annotations

import io

import pytest
from pypdf import PdfWriter
from pypdf.generic import ArrayObject, DictionaryObject, NameObject, NumberObject

from renderctl.errors import InvalidOutput
from renderctl.worker import pdf_pages


def _pdf(writer: PdfWriter) -> bytes:
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def _blank(n: int) -> PdfWriter:
    w = PdfWriter()
    for _ in range(n):
        w.add_blank_page(200, 200)
    return w


def _pages_node(w: PdfWriter, kids: list[object], count: int) -> object:
    root = w._root_object["/Pages"]
    return w._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Pages"), NameObject("/Kids"): ArrayObject(kids),
        NameObject("/Count"): NumberObject(count), NameObject("/Parent"): root.indirect_reference}))


def test_counts_the_pages_there_are() -> None:
    assert pdf_pages(_pdf(_blank(3)), "out.pdf") == 3


def test_counts_the_pages_there_are_not_the_ones_declared() -> None:
    for declared in (1, 10**12):
        w = _blank(3)
        w._root_object["/Pages"][NameObject("/Count")] = NumberObject(declared)
        assert pdf_pages(_pdf(w), "out.pdf") == 3, declared


def test_no_pages_is_invalid() -> None:
    with pytest.raises(InvalidOutput, match="out.pdf: the PDF has no pages"):
        pdf_pages(_pdf(PdfWriter()), "out.pdf")
    w = PdfWriter()
    w._root_object["/Pages"][NameObject("/Count")] = NumberObject(2)  # declared, not there
    with pytest.raises(InvalidOutput, match="has no pages"):
        pdf_pages(_pdf(w), "out.pdf")


def test_damage_after_a_good_first_page_is_invalid() -> None:
    # A cycle in the second branch: the first page is fine, the tree is not
    w = _blank(1)
    root = w._root_object["/Pages"]
    looped = _pages_node(w, [], 1)
    looped.get_object()[NameObject("/Kids")] = ArrayObject([looped])
    root["/Kids"].append(looped)
    root[NameObject("/Count")] = NumberObject(2)
    with pytest.raises(InvalidOutput, match="out.pdf: not a readable PDF: .*cyclic"):
        pdf_pages(_pdf(w), "out.pdf")
    # A second branch whose /Kids is not an array
    w = _blank(1)
    root = w._root_object["/Pages"]
    broken = _pages_node(w, [], 1)
    broken.get_object()[NameObject("/Kids")] = NumberObject(5)
    root["/Kids"].append(broken)
    with pytest.raises(InvalidOutput, match="out.pdf: not a readable PDF: .*Kids"):
        pdf_pages(_pdf(w), "out.pdf")


def test_a_tree_whose_root_is_its_own_kid_is_invalid() -> None:
    w = _blank(1)
    root = w._root_object["/Pages"]
    root["/Kids"][0] = root.indirect_reference
    with pytest.raises(InvalidOutput, match="out.pdf: not a readable PDF"):
        pdf_pages(_pdf(w), "out.pdf")


def test_an_encrypted_pdf_cannot_be_checked() -> None:
    w = _blank(2)
    w.encrypt("secret", algorithm="RC4-128")
    with pytest.raises(InvalidOutput, match="not a readable PDF: .*not been decrypted"):
        pdf_pages(_pdf(w), "out.pdf")


def test_not_a_pdf() -> None:
    with pytest.raises(InvalidOutput, match=r"out.pdf: not a PDF \(no %PDF- header\)"):
        pdf_pages(b"hello", "out.pdf")
    with pytest.raises(InvalidOutput, match="out.pdf: not a readable PDF"):
        pdf_pages(b"%PDF-1.7\nnothing else", "out.pdf")
