"""The PDF check of an output (DESIGN.md: a .pdf must open with pypdf and have a page).

Real PDFs written with pypdf, their page trees damaged by hand where a case needs it, read
back by the worker's check. The check walks the whole page tree as pypdf does: a page tree
pypdf cannot list is refused, even when its first branch is fine (a shortcut that trusted
the tree's declared /Count published PDFs that a downstream merge then refused)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

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


@pytest.mark.parametrize("kind", ["file", "dir"])
@pytest.mark.parametrize("made_again", [False, True], ids=["removed", "removed-and-made"])
def test_an_output_missing_because_its_folder_went_is_not_blamed_on_the_job(
        tmp_path: Path, kind: str, made_again: bool) -> None:
    from renderctl.messages import RunJob
    from renderctl.worker import OutputFolderGone, _HeldFolder, check_output

    # Given a job's output folder, held as its job starts
    folder = tmp_path / "sub"
    folder.mkdir()
    tmp = folder / (".rctl-x.tmp" if kind == "file" else ".rctl-x.d.tmp")
    job = RunJob("x", 1, "t-1", {"id": "x", "output": "sub/x"}, str(tmp), kind, 1 << 30)
    held = _HeldFolder(folder)
    try:
        # When the folder is removed while the job runs (and made again: ext4 can give the
        # new one the old one's inode number when nothing holds the old one, review BW)
        shutil.rmtree(folder)
        if made_again:
            folder.mkdir()
        # Then the missing output is the folder's going, not the job's fault (invalid
        # output, dead at once); a folder output too (it was not looked at)
        with pytest.raises(OutputFolderGone, match="was removed while the job ran"):
            check_output(tmp, job, held)
    finally:
        held.close()
    # And where the folder stayed, a missing output is the job's own
    folder.mkdir(exist_ok=True)
    held = _HeldFolder(folder)
    try:
        with pytest.raises(InvalidOutput, match="did not"):
            check_output(tmp, job, held)
    finally:
        held.close()
