"""The pypdf renderers: ``merge``, ``stamp`` and ``split``, and ``open_pdf`` for their inputs.

An input that pypdf cannot read (not a PDF, truncated, encrypted, no pages, or past the
limits ``safety.harden`` sets) is ``InvalidInput``: no retry can fix it.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pypdf import PageObject, PdfReader, PdfWriter, Transformation
from pypdf.constants import PageAttributes as PG
from pypdf.errors import DependencyError, DeprecationError, LimitReachedError, PyPdfError
from pypdf.generic import (
    ArrayObject,
    ByteStringObject,
    DecodedStreamObject,
    Destination,
    DictionaryObject,
    FloatObject,
    IndirectObject,
    NameObject,
    NumberObject,
    PdfObject,
    StreamObject,
    TextStringObject,
)
from reportlab.lib.colors import Color
from reportlab.pdfgen.canvas import Canvas

from renderctl.errors import InvalidInput
from renderctl.render import rules
from renderctl.render.inputs import open_input, refuse_beyond_ceiling
from renderctl.render.registry import MAX_PAGES_PER_PART, MAX_PAGES_PER_PDF
from renderctl.render.text import plain, quoted

# The PDF spec lets the header sit anywhere in the first 1024 bytes.
HEADER_WINDOW = 1024
# Writers put %%EOF at the very end; a little trailing junk is common and harmless.
EOF_WINDOW = 2048
# Some transfers pad a file (NULs to a block size, a mail trailer) by more than EOF_WINDOW;
# pypdf reads those. Looking further back is bounded so a huge file costs one bounded search.
EOF_SEARCH = 1 << 20
# A cut-off file can still hold an earlier %%EOF (an incremental update's base, or a
# linearized file's first-page section): then what follows it is PDF structure, never padding.
# Matched as syntax ("12 0 obj", "trailer <<"), not as words: a mail trailer saying "sent
# from the stream of my obj phone" after a whole file was refused as truncated (audit BL).
_PDF_STRUCTURE = re.compile(
    rb"\d+\s+\d+\s+obj\b|\bendobj\b|\bendstream\b|(?:^|[\r\n])xref\s"
    rb"|\btrailer\s*<<|\bstartxref\s+\d")

POSITIONS = ("center", "top", "bottom", "top-left", "top-right", "bottom-left", "bottom-right")


@contextmanager
def pdf_errors(source: str) -> Iterator[None]:
    """Turn pypdf's errors while reading ``source`` (a file name) into InvalidInput."""
    try:
        yield
    except InvalidInput:
        raise
    except MemoryError:
        raise  # the memory ceiling's business, not the input's
    except LimitReachedError as exc:
        raise InvalidInput(f"{source}: unreadable PDF: {_steady(str(exc))} (safety limit)"
                           ) from exc
    except DeprecationError as exc:
        # A filter name the file uses that pypdf no longer reads (the abbreviation /Fl): not
        # a PyPdfError, it was a `failed` attempt, retried to the end (audit DU). Only from
        # its filters: one from a call of ours to an API pypdf has since removed is our bug,
        # not the input's (review DX).
        if not _passed_through(exc, "pypdf.filters"):
            raise
        raise InvalidInput(f"{source}: unreadable PDF: {str(exc)[:300]}") from exc
    except DependencyError as exc:
        # A filter pypdf decodes only with an optional package or program (BrotliDecode,
        # JBIG2Decode: jbig2dec is never run from a job, see safety.py): not a PyPdfError,
        # it was a `failed` attempt, retried to no end. The same file fails every time.
        raise InvalidInput(f"{source}: unreadable PDF here: {str(exc)[:300]}") from exc
    except (
        PyPdfError,
        RecursionError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
        AssertionError,
        UnicodeError,
        OverflowError,
        # What pypdf knows of but cannot do: a filter it lacks, an encryption method.
        NotImplementedError,
    ) as exc:
        # pypdf raises plain Python errors from deep inside a malformed file as well as its
        # own; either way the same bytes fail the same way on every attempt.
        reason = _steady(str(exc)) or type(exc).__name__
        if not isinstance(exc, (PyPdfError, NotImplementedError)):
            # Its own words mean nothing to a user ("'NoneType' object has no attribute
            # 'idnum'": audit DM): what they mean first, then them, for whoever debugs,
            # with the library that raised them (reportlab draws a stamp: review DP).
            reason = (f"its structure is damaged ({type(exc).__name__} in "
                      f"{_raised_by(exc)}: {reason})")
        raise InvalidInput(f"{source}: unreadable PDF: {reason[:300]}") from exc


# pypdf's repr of an indirect reference ends with the id() of its reader object.
_INDIRECT_REPR = re.compile(r"IndirectObject\((\d+), (\d+), \d+\)")


def _steady(reason: str) -> str:
    """``reason`` without the memory addresses pypdf puts in some messages ("Detected loop
    with self reference for IndirectObject(4, 0, 140268125127952)"): the same file's
    error differed between attempts and jobs."""
    return _INDIRECT_REPR.sub(r"\1 \2 R", reason)


def open_pdf(path: Path, label: str | None = None) -> PdfReader:
    """Open a PDF for reading, or raise InvalidInput saying why it cannot be used.

    Messages start with ``label`` (default: the file's name)."""
    label = path.name if label is None else label
    with open_input(path, label) as (fh, size):
        refuse_beyond_ceiling(label, size)
        head = fh.read(HEADER_WINDOW)
        if not head:
            raise InvalidInput(f"{label}: empty file, not a PDF")
        if b"%PDF-" not in head:
            raise InvalidInput(f"{label}: not a PDF (no %PDF- header)")
        # pypdf reads a file it is given by path whole into memory too; reading it here, from
        # the descriptor checked above, means pypdf parses what was checked.
        fh.seek(0)
        data = fh.read()
        # Judged with the file still open: a verdict on a file written to meanwhile is
        # InputChanged, tried again (open_input).
        return _parsed(data, label)


def _parsed(data: bytes, label: str) -> PdfReader:
    """The PDF in ``data`` (read from the input ``label``), or InvalidInput saying why not."""
    tail = data[-EOF_WINDOW:]
    if b"%%EOF" not in tail:
        tail = data[-EOF_SEARCH:]
    marker = tail.rfind(b"%%EOF")
    if marker < 0 or _PDF_STRUCTURE.search(tail, marker + 5):
        # (Or padded past the search: a PDF followed by more than EOF_SEARCH bytes of
        # anything is as unusable, and the message says where it looked; audit DU.)
        raise InvalidInput(f"{label}: truncated PDF (no %%EOF marker at its end, nor in its "
                           f"last {EOF_SEARCH // 1024} KB)")
    with pdf_errors(label):
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
        except NotImplementedError as exc:
            # pypdf sets up decryption while opening, before is_encrypted can be asked: an
            # encryption it lacks (a certificate handler, an unknown method) fails right here.
            if _raised_in(exc, "pypdf._encryption"):
                raise InvalidInput(f"{label}: encrypted PDF ({exc})") from exc
            raise
        if reader.is_encrypted:
            # Even an empty user password means someone meant to restrict it: not ours to open.
            raise InvalidInput(f"{label}: encrypted PDF")
        pages = len(reader.pages)
    if pages == 0:
        raise InvalidInput(f"{label}: PDF has no pages")
    return reader


def _raised_by(exc: BaseException) -> str:
    """The top-level package whose code raised ``exc`` (its innermost frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return str(name).partition(".")[0] or "?"


def _passed_through(exc: BaseException, module: str) -> bool:
    """Whether code of ``module`` is on the way from where ``exc`` was caught to where it was
    raised."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == module:
            return True
        tb = tb.tb_next
    return False


def _raised_in(exc: BaseException, module: str) -> bool:
    """Whether ``exc`` was raised by code of ``module`` (its innermost frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == module


# -- merge ---------------------------------------------------------------------------------


def merge(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Concatenate ``inputs`` in order into ``output``, one outline entry per input."""
    if not inputs:
        raise InvalidInput("merge needs at least one input")
    writer = PdfWriter()
    names: dict[str, ArrayObject] = {}  # the output's named destinations (see _carry_names)
    for index, path in enumerate(inputs):
        # Up to 1,000 inputs from many folders, often with like names (doc377.pdf in each):
        # only the position and the full path say which one to fix.
        label = _input_label(index, path)
        reader = open_pdf(path, label)
        with pdf_errors(label):
            first = len(writer.pages)
            if first + len(reader.pages) > MAX_PAGES_PER_PDF:
                # Refused before the work: written, it was 13 s of work dead-lettered as an
                # invalid output no reader here opens (audit FO).
                raise InvalidInput(
                    f"{label}: the merge would have more than {MAX_PAGES_PER_PDF:,} pages "
                    f"({first:,} before this input's {len(reader.pages):,}), more than "
                    "one PDF written here can hold; merge fewer inputs per job")
            sources = list(reader.pages)
            copies = [writer.add_page(_without_links(_sized(page, f"{label}: page {number}")))
                      for number, page in enumerate(sources, start=1)]
            _copy_page_links(writer, sources, copies)
            _carry_names(reader, sources, copies, names, index)
        writer.add_outline_item(title=plain(path.stem) or path.name, page_number=first)
    writer.page_mode = "/UseOutlines"
    if names:
        _write_name_tree(writer, names)
    # Objects are copied from the inputs lazily, while writing: a fault there is still theirs,
    # though no longer one input's to name.
    with pdf_errors(_inputs_label(inputs)), output.open("wb") as fh:
        writer.write(fh)


def _copy_page_links(writer: PdfWriter, sources: list[PageObject],
                     copies: list[PageObject]) -> None:
    """Give each of ``copies`` (in ``writer``) the annotations and page actions of its
    source page, once every page of the document is in: copied with its page, a link took
    its target page along, and that page its own link, page after page: a document whose
    pages each link to the next (slides, an e-book) overflowed pypdf's recursion at 400
    pages and was refused as damaged (audit FO). Copied last, a link to a page ends at that
    page's copy (pypdf copies each object of a reader once)."""
    for source, copy in zip(sources, copies, strict=True):
        for key in _NOT_COPIED:
            if key in source:
                copy[NameObject(key)] = source.raw_get(key).clone(writer)


def _carry_names(reader: PdfReader, sources: list[PageObject], copies: list[PageObject],
                 names: dict[str, ArrayObject], index: int) -> None:
    """Add to ``names`` the named destinations of one merged input (hyperref links every
    reference by name), each leading to its page's copy as it led to the page (its view
    kept); a name an earlier input has is renamed, and this input's links by it with it.

    pypdf's own way (what add_page records for its write) looked up each link's page among
    all pages and inserted each name in order: 31 s for 2,000 pages of 10 links each, 107
    s for 4,000 (review FR), made every view "fit width", and led the links of a name that
    two inputs share (hyperref's page.1 is in every document) to the first one's page."""
    where = {src.indirect_reference.idnum: copy.indirect_reference
             for src, copy in zip(sources, copies, strict=True)
             if src.indirect_reference is not None and copy.indirect_reference is not None}
    try:
        dests = _string_names(reader)
    except LimitReachedError:
        # Past what pypdf reads (50,000 names in one flat array): merged without them, as
        # before names were carried (review FS)
        return
    renamed: dict[str, str] = {}
    for name, dest in dests.items():
        page = dest.raw_get("/Page") if "/Page" in dest else None
        target = where.get(page.idnum) if isinstance(page, IndirectObject) else None
        if target is None:
            continue  # (a page outside the page tree, or of another document)
        new = name
        n = index + 1
        while new in names or (new != name and new in dests):
            new, n = f"{name}~{n}", n + 1
        if new != name:
            renamed[name] = new
        names[new] = ArrayObject([target, *dest.dest_array[1:]])
    if renamed:
        _rename_link_targets(copies, renamed)


def _string_names(reader: PdfReader) -> dict[str, Destination]:
    """``reader``'s destinations named by a string (LimitReachedError past what pypdf reads).

    Not the old /Dests dictionary's names (pypdf keys them "/name" among the strings): a
    link names them as a name, not a string, and a string name tree cannot hold them. Not
    told by a leading "/" alone: a string name may begin with one (review FT)."""
    dests = reader.named_destinations
    old_style = reader.root_object.get("/Dests")
    old_style = old_style.get_object() if old_style is not None else None
    if not isinstance(old_style, DictionaryObject):
        return dict(dests)
    return {name: dest for name, dest in dests.items() if name not in old_style}


def _rename_link_targets(copies: list[PageObject], renamed: Mapping[str, str]) -> None:
    """Point the links of ``copies`` (the writer's objects) that lead by a name of
    ``renamed`` to its new name, each link once (pages may share annotations)."""
    seen: set[int] = set()
    for copy in copies:
        annots = copy.get("/Annots")
        annots = annots.get_object() if annots is not None else None
        if not isinstance(annots, ArrayObject):
            continue
        for ref in annots:
            annot = ref.get_object()
            if not isinstance(annot, DictionaryObject):
                continue
            for holder, key, name in _name_holders(annot):
                if id(holder) in seen:
                    continue
                seen.add(id(holder))
                if name in renamed:
                    holder[NameObject(key)] = TextStringObject(renamed[name])


def _name_holders(annot: DictionaryObject) -> list[tuple[DictionaryObject, str, str]]:
    """(the dictionary, its key, the name) of each place ``annot`` leads by a string name:
    its /Dest, its GoTo action's /D (a GoToR's /D names a destination in another file)."""
    action = annot.get("/A")
    action = action.get_object() if action is not None else None
    if not (isinstance(action, DictionaryObject) and action.get("/S") == "/GoTo"):
        action = None
    found: list[tuple[DictionaryObject, str, str]] = []
    for holder, key in ((annot, "/Dest"), (action, "/D")):
        if not isinstance(holder, DictionaryObject):
            continue
        target = holder.get(key)
        if isinstance(target, (TextStringObject, ByteStringObject)):
            found.append((holder, key, str(target)))
    return found


NAMES_PER_NODE = 1000  # pairs a name tree leaf holds, kids a node has


def _write_name_tree(writer: PdfWriter, names: Mapping[str, ArrayObject]) -> None:
    """``names`` as the output's named destinations: a name tree in byte order, in leaves
    of at most NAMES_PER_NODE pairs (one array of them all would be past what pypdf reads
    back, 100,000 elements, at 50,000 names)."""
    def key(name: str) -> bytes:
        return TextStringObject(name).get_original_bytes()

    ordered = sorted(names, key=key)
    level: list[tuple[IndirectObject, str, str]] = []
    for start in range(0, len(ordered), NAMES_PER_NODE):
        chunk = ordered[start:start + NAMES_PER_NODE]
        pairs = ArrayObject()
        for name in chunk:
            pairs.extend([TextStringObject(name), names[name]])
        level.append((writer._add_object(DictionaryObject({
            NameObject("/Names"): pairs,
            NameObject("/Limits"): ArrayObject([TextStringObject(chunk[0]),
                                                TextStringObject(chunk[-1])])})),
            chunk[0], chunk[-1]))
    while len(level) > NAMES_PER_NODE:
        level = [(writer._add_object(DictionaryObject({
            NameObject("/Kids"): ArrayObject([ref for ref, _, _ in group]),
            NameObject("/Limits"): ArrayObject([TextStringObject(group[0][1]),
                                                TextStringObject(group[-1][2])])})),
            group[0][1], group[-1][2])
            for group in (level[i:i + NAMES_PER_NODE]
                          for i in range(0, len(level), NAMES_PER_NODE))]
    root = DictionaryObject({NameObject("/Kids"): ArrayObject([ref for ref, _, _ in level])})
    catalog_names = DictionaryObject({NameObject("/Dests"): writer._add_object(root)})
    writer._root_object[NameObject("/Names")] = writer._add_object(catalog_names)


def _without_links(page: PageObject) -> PageObject:
    """``page`` without its own annotations and page actions (the keys of _NOT_COPIED), to
    pypdf still the same page (its reference), so that what refers to it is mapped to its
    copy. Not add_page's excluded_keys: pypdf drops those at every depth, and an image or a
    graphics state named /B or /AA in the page's resources, a Type 3 font's glyph /B, went
    missing from the output (review FP)."""
    bare = PageObject(page.pdf, page.indirect_reference)
    bare.clear()  # (given a reference, pypdf fills it with that page's keys)
    bare.update({key: value for key, value in page.items() if key not in _NOT_COPIED})
    return bare


def _sized(page: PageObject, where: str) -> PageObject:
    """``page``, if it has a page size (a /MediaBox of its own or inherited) with an area:
    merge, split and stamp published pages no reader could lay out (pypdf's own `mediabox`
    raised on them)."""
    try:
        box = page.mediabox
    except ValueError as exc:
        raise InvalidInput(f"{where}: no usable page size (/MediaBox): {exc}") from None
    if not box.width or not box.height:
        raise InvalidInput(f"{where}: its page size (/MediaBox {list(box)}) has no area")
    return page


def _input_label(index: int, path: Path) -> str:
    return f"inputs[{index}] {path}"


def _inputs_label(inputs: list[Path]) -> str:
    """All of a merge's inputs in a bounded phrase (a thousand paths would fill a screen)."""
    if len(inputs) <= 3:
        return ", ".join(_input_label(i, p) for i, p in enumerate(inputs))
    last = len(inputs) - 1
    return (
        f"one of {len(inputs)} inputs ({_input_label(0, inputs[0])} … "
        f"{_input_label(last, inputs[last])})"
    )


# -- stamp ---------------------------------------------------------------------------------


def stamp(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Draw ``params['text']`` on every page of ``inputs[0]``."""
    if len(inputs) != 1:
        raise InvalidInput(f"stamp takes exactly one input, got {len(inputs)}")
    rules.require("text", params.get("text"), rules.stamp_text)
    text = plain(params["text"])
    position = params.get("position", "center")
    if position not in POSITIONS:
        raise InvalidInput(
            f"params.position: {quoted(position)} is not one of {', '.join(POSITIONS)}"
        )
    opacity = _param_number(params, "opacity", 0.3, low=0.0, high=1.0)
    rotation = _param_number(
        params, "rotation", 45.0 if position == "center" else 0.0, low=-360.0, high=360.0
    )
    font_size = _param_number(params, "font_size", 48.0, low=1.0, high=500.0)

    path = inputs[0]
    reader = open_pdf(path)
    with pdf_errors(path.name):
        # The document is cloned without its pages' links and page actions, then they are
        # added: cloned with their pages, a chain of pages linking each to the next
        # overflowed pypdf's recursion (see _copy_page_links). The clone walks the reader's
        # parsed objects (parsed once, cached); reader.pages are copies of them.
        sources = list(reader.pages)
        for number, page in enumerate(sources, start=1):
            # (a 0x0 page was stamped, published; checked before the clone, a page tree
            # entry that is no page is said so, as merge and split say it: audit FO)
            _sized(page, f"{path.name}: page {number}")
        held: list[tuple[DictionaryObject, dict[str, PdfObject]]] = []
        for page in sources:
            parsed = page.indirect_reference.get_object() \
                if page.indirect_reference is not None else None
            if isinstance(parsed, DictionaryObject):
                keys = {key: parsed.raw_get(key) for key in _NOT_COPIED if key in parsed}
                for key in keys:
                    del parsed[key]
                held.append((parsed, keys))
        writer = PdfWriter(clone_from=reader)
        for parsed, keys in held:
            parsed.update(keys)
        _copy_page_links(writer, sources, list(writer.pages))
        stamper = _Stamper(writer, lambda size: _stamp_page(
            size, text, position=position, opacity=opacity, rotation=rotation,
            font_size=font_size))
        for page in writer.pages:
            stamper.stamp(page)
        pages = writer._root_object["/Pages"].get_object()
        if isinstance(pages, DictionaryObject):
            _recount(pages, set())
        with output.open("wb") as fh:
            writer.write(fh)


def _shown_box(page: PageObject) -> tuple[float, float, float, float]:
    """The part of ``page`` a viewer shows, as (left, bottom, width, height): its crop box
    (written from any corner) cut to its media box, as the PDF standard says (14.11.2); a
    crop box with no area inside the media box gives the media box, as pdf.js and pdfium
    show such a page. (The crop box as written: a stamp centred on one twice the page's
    width was half off the page, one outside it could not be seen at all: audit BL.)"""
    mx0, my0, mx1, my1 = (float(v) for v in page.mediabox)
    cx0, cy0, cx1, cy1 = (float(v) for v in page.cropbox)
    media = (min(mx0, mx1), min(my0, my1), max(mx0, mx1), max(my0, my1))
    left, bottom = max(media[0], min(cx0, cx1)), max(media[1], min(cy0, cy1))
    right, top = min(media[2], max(cx0, cx1)), min(media[3], max(cy0, cy1))
    if right <= left or top <= bottom:
        left, bottom, right, top = media
    return left, bottom, right - left, top - bottom


def _recount(node: DictionaryObject, seen: set[int]) -> int:
    """Set each page tree node's /Count to the pages under it; that number. The clone keeps
    the input's counts, and one that lied (3 pages, /Count 1) was published so: a reader
    that trusts /Count (pdf.js) shows one page, where our check walks the tree (audit BL).
    A page listed twice counts twice, as readers show it; an inner node met again counts
    nothing (open_pdf refused the trees that loop, this is not trusted to have)."""
    if node.get("/Type") != "/Pages":
        return 1
    if id(node) in seen:
        return 0
    seen.add(id(node))
    kids = node.get("/Kids")
    kids = kids.get_object() if kids is not None else None
    count = 0
    for kid in kids if isinstance(kids, ArrayObject) else ():
        kid = kid.get_object()
        if isinstance(kid, DictionaryObject):
            count += _recount(kid, seen)
    node[NameObject("/Count")] = NumberObject(count)
    return count


class _Stamper:
    """Draws the stamp on pages of ``writer`` as a Form XObject: one per page size, added to
    each page's resources and drawn after the page's own content, which is left as it is.

    Not pypdf's merge_transformed_page, which decodes each page's content and writes it
    back merged, uncompressed, over the page's content stream object, and merges the stamp's
    resources into the page's in place. Where pages share a /Font dictionary (reportlab's
    do), each merge added the stamp's font to it again under a new name, after looking
    through every name before: quadratic (2,000 pages 10-15 s; 5,000 timed out: audit
    AU). Where pages share a content stream, every page drew every page's stamp, and a
    page's content stream that was also another page's Form XObject was replaced (audit
    AW). Now the pages' streams and dictionaries are referred to, never changed, and shared
    ones stay shared: 500 pages drawing one background stream, 110 KB, are stamped into
    159 KB (copied to each page, 167 MB), and a page's content is never decoded."""

    def __init__(self, writer: PdfWriter,
                 overlay: Callable[[tuple[float, float]], PageObject]) -> None:
        self.writer = writer
        self.overlay = overlay
        self.forms: dict[tuple[float, float], IndirectObject] = {}
        # A page's resources with the stamp added, by (their object, the form): pages that
        # shared resources share the result. (The object is kept too: its id names it only
        # while it lives.)
        self.resources: dict[tuple[int, int],
                             tuple[IndirectObject, NameObject, DictionaryObject]] = {}
        self.no_resources = DictionaryObject()
        self.draws: dict[tuple[NameObject, tuple[float, ...]], IndirectObject] = {}
        self.open = self._stream(b"q\n")
        self.close = self._stream(b"\nQ\n")

    def _stream(self, data: bytes, fields: dict[str, PdfObject] | None = None
                ) -> IndirectObject:
        stream = DecodedStreamObject()
        stream.set_data(data)
        for key, value in (fields or {}).items():
            stream[NameObject(key)] = value
        # (_add_object: pypdf's one way to give a new stream an object number, since 1.x)
        return self.writer._add_object(stream)

    def _form(self, size: tuple[float, float]) -> IndirectObject:
        form = self.forms.get(size)
        if form is None:
            page = self.overlay(size)
            content = page.get_contents()
            resources = page.get(PG.RESOURCES)
            form = self.forms[size] = self._stream(
                content.get_data() if content is not None else b"", {
                    "/Type": NameObject("/XObject"), "/Subtype": NameObject("/Form"),
                    "/BBox": ArrayObject(FloatObject(v) for v in (0, 0, *size)),
                    "/Resources": (resources.get_object().clone(self.writer)
                                   if resources is not None else DictionaryObject()),
                })
        return form

    def stamp(self, page: PageObject) -> None:
        # What a viewer shows: the crop box (the media box when there is none), turned
        # clockwise by /Rotate. The stamp is drawn upright in that view, then mapped back
        # into the page's own coordinates. The box may be written from any corner to the
        # opposite one: normalise it, or a negative width turns into a mirrored stamp of
        # negative size.
        left, bottom, width, height = _shown_box(page)
        turn = _page_turn(page)
        shown = (width, height) if turn in (0, 180) else (height, width)
        form = self._form((round(shown[0], 2), round(shown[1], 2)))
        # Undo the viewer's turn (a counter-clockwise rotation by the same angle, which
        # leaves the view's origin at another corner of the box), then move to the box.
        corner = {0: (0.0, 0.0), 90: (width, 0.0), 180: (width, height),
                  90 * 3: (0.0, height)}[turn]
        matrix = Transformation().rotate(turn).translate(left + corner[0],
                                                         bottom + corner[1]).ctm
        name = self._add_to_resources(page, form)
        draw = self.draws.get((name, matrix))
        if draw is None:
            cm = " ".join(f"{v:.6f}".rstrip("0").rstrip(".") for v in matrix)
            draw = self.draws[(name, matrix)] = self._stream(
                f"q {cm} cm {name} Do Q\n".encode())
        # The page's own content between q and Q, so that a graphics state it leaves set
        # (a transformation, a clip) does not move or hide the stamp.
        page[NameObject(PG.CONTENTS)] = ArrayObject(
            [self.open, *_content_refs(page, self.writer), self.close, draw])

    def _add_to_resources(self, page: PageObject, form: IndirectObject) -> NameObject:
        """Name ``form`` in the resources ``page`` uses (its own or inherited), through a
        copy of them made once for every page that uses them; the name."""
        found = _inherited(page, PG.RESOURCES)
        source = found.get_object() if found is not None else None
        if not isinstance(source, DictionaryObject):
            source = self.no_resources
        key = (id(source), form.idnum)
        done = self.resources.get(key)
        if done is None:
            resources = DictionaryObject(source)  # shallow: fonts and images stay shared
            named = resources.get("/XObject")
            named = named.get_object() if isinstance(named, PdfObject) else None
            xobjects = DictionaryObject(named if isinstance(named, DictionaryObject) else {})
            name = NameObject("/RctlStamp")
            n = 0
            while name in xobjects:
                n += 1
                name = NameObject(f"/RctlStamp{n}")
            xobjects[name] = form
            resources[NameObject("/XObject")] = xobjects
            done = self.resources[key] = (self.writer._add_object(resources), name, source)
        page[NameObject(PG.RESOURCES)] = done[0]
        return done[1]


def _content_refs(page: PageObject, writer: PdfWriter) -> list[PdfObject]:
    """The streams ``page`` draws, as the references its /Contents holds (nothing copied)."""
    if PG.CONTENTS not in page:
        return []
    raw = page.raw_get(PG.CONTENTS)
    target = raw.get_object()
    if isinstance(target, ArrayObject):
        return list(target)
    if isinstance(target, StreamObject):
        return [raw if isinstance(raw, IndirectObject) else
                # (a stream must be an indirect object: one written inline is made one)
                writer._add_object(target)]
    return []  # null, or not a content stream: nothing a reader could draw


def _inherited(page: PageObject, key: str) -> PdfObject | None:
    """``page``'s ``key``, or the nearest ancestor's in the page tree (its /Parent chain,
    bounded and loop-safe: a malformed tree can loop)."""
    node: PdfObject | None = page
    seen: set[int] = set()
    while isinstance(node, DictionaryObject) and id(node) not in seen and len(seen) < 1000:
        seen.add(id(node))
        if key in node:
            return node.raw_get(key)
        parent = node.raw_get(PG.PARENT) if PG.PARENT in node else None
        node = parent.get_object() if parent is not None else None
    return None


def _page_turn(page: PageObject) -> int:
    """The page's /Rotate (inherited ones included), as 0, 90, 180 or 270 (clockwise). The
    standard allows only multiples of 90; anything else is shown unrotated, as viewers do."""
    try:
        turn = int(page.rotation) % 360
    except (TypeError, ValueError):
        return 0
    return turn if turn % 90 == 0 else 0


def _param_number(
    params: Mapping[str, Any], name: str, default: float, *, low: float, high: float
) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"params.{name}: expected a number, got {quoted(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int of thousands of digits: also too big to print whole
        number = math.inf
    if not math.isfinite(number) or not low <= number <= high:
        raise InvalidInput(f"params.{name}: {number:g} is not between {low:g} and {high:g}")
    return number


def _stamp_page(
    size: tuple[float, float],
    text: str,
    *,
    position: str,
    opacity: float,
    rotation: float,
    font_size: float,
) -> PageObject:
    """A one-page PDF of ``size`` holding only the stamp, built in memory."""
    width, height = size
    buf = io.BytesIO()
    canvas = Canvas(buf, pagesize=size, invariant=True)
    font = "Helvetica-Bold"
    # Never more than 90% of the page across or down, whatever font_size asks for, judged
    # by the box the text takes once rotated: fitted to the width before the rotation, a
    # long stamp at 45 degrees ran off the top and bottom of any page wider than ~1.5:1
    # (a 16:9 slide, a banner), its middle all that showed (audit BI).
    # A stamp at an edge or corner keeps a margin (a tenth of a small page at most) and is
    # placed by that same box: placed as if unturned, a turned corner stamp ran off the
    # page (review BK: A4 bottom-right at 45 degrees drew up to y = 872 of 842).
    margin = 0.0 if position == "center" else min(max(18.0, font_size * 0.6),
                                                  0.1 * min(width, height))
    text_width = canvas.stringWidth(text, font, font_size)
    turn = math.radians(rotation)
    cos, sin = abs(math.cos(turn)), abs(math.sin(turn))
    across = text_width * cos + font_size * sin
    down = text_width * sin + font_size * cos
    fit = min(1.0, *(min(0.9 * room, room - 2 * margin) / span
                     for room, span in ((width, across), (height, down)) if span > 0))
    if fit < 1.0:
        font_size *= fit
        across, down = across * fit, down * fit
    vertical, _, horizontal = position.partition("-")
    # (x, y): the middle of the turned text's box, which the text is drawn about.
    if position == "center":
        x, y = width / 2, height / 2
    else:
        y = height - margin - down / 2 if vertical == "top" else margin + down / 2
        if horizontal == "left":
            x = margin + across / 2
        elif horizontal == "right":
            x = width - margin - across / 2
        else:
            x = width / 2
    canvas.setFillColor(Color(0.75, 0.1, 0.1, alpha=opacity))
    canvas.setStrokeColor(Color(0.75, 0.1, 0.1, alpha=opacity))
    canvas.translate(x, y)
    canvas.rotate(rotation)
    canvas.setFont(font, font_size)
    # Centre the text's x-height on the anchor so rotation pivots about its middle.
    canvas.drawCentredString(0, -font_size * 0.35, text)
    canvas.showPage()
    canvas.save()
    buf.seek(0)
    return PdfReader(buf).pages[0]


# -- split ---------------------------------------------------------------------------------


def _leads_out(start: PdfObject, own: set[int], known: dict[int, bool] | None = None) -> bool:
    """Whether a page (or page tree) other than those numbered ``own`` can be reached from
    ``start``; pages of ``own`` are not entered (their content leads nowhere it should not).
    ``known``: objects already judged (True: leads out), added to as walks end: a form
    field with a widget on each of 2,000 pages was walked whole for every widget (review
    ER: 11.7 s for one part)."""
    memo = known if known is not None else {}
    stack: list[Any] = [start]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if isinstance(obj, IndirectObject):
            if obj.idnum in seen or obj.idnum in own:
                continue
            judged = memo.get(obj.idnum)
            if judged is not None:
                if judged:
                    break
                continue
            seen.add(obj.idnum)
            obj = obj.get_object()
        if isinstance(obj, DictionaryObject):
            if obj.get("/Type") in ("/Page", "/Pages"):
                break
            stack.extend(obj.values())
        elif isinstance(obj, ArrayObject):
            stack.extend(obj)
    else:
        memo.update(dict.fromkeys(seen, False))  # (all they lead to was walked: nothing out)
        return False
    if isinstance(start, IndirectObject):
        memo[start.idnum] = True
    return True


def split(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write ``inputs[0]`` as ``part-0001.pdf``, ... of ``pages_per_part`` pages into ``output``."""
    if len(inputs) != 1:
        raise InvalidInput(f"split takes exactly one input, got {len(inputs)}")
    per_part = params.get("pages_per_part", 1)
    if (
        isinstance(per_part, bool)
        or not isinstance(per_part, int)
        or not (1 <= per_part <= MAX_PAGES_PER_PART)
    ):
        raise InvalidInput(
            f"params.pages_per_part: {quoted(per_part)} is not a whole number >= 1"
        )
    if not output.is_dir():
        # The runner prepares the folder; its absence is our bug, so a plain (retried) error.
        raise NotADirectoryError(f"split output {output} is not a directory")
    path = inputs[0]
    reader = open_pdf(path)
    with pdf_errors(path.name):
        names = _names_by_page(reader)
        total = len(reader.pages)
        parts = math.ceil(total / per_part)
        width = max(4, len(str(parts)))
        for index in range(parts):
            first, stop = index * per_part, min(total, (index + 1) * per_part)
            for page_number in range(first, stop):
                _sized(reader.pages[page_number], f"{path.name}: page {page_number + 1}")
            _write_part(reader, range(first, stop),
                        output / f"part-{index + 1:0{width}d}.pdf", names)


PartNames = dict[int, list[tuple[str, list[PdfObject]]]]


def _names_by_page(reader: PdfReader) -> PartNames | None:
    """``reader``'s string-named destinations by the object number of their page, each
    with its view (not the Destination: 40,000 of them held ~130 MB of a job's ceiling;
    review GB); None where they cannot all be read, and the parts go without names and
    keep their links by name, as before names were carried (a broken name tree must not
    refuse pages that are whole; a document with the old /Dests dictionary too, where pypdf
    reads only that one and every string name would look missing: review GB)."""
    if "/Dests" in reader.root_object:
        return None
    try:
        dests = _string_names(reader)
    except MemoryError:
        raise  # (the job's ceiling: said as such, not as a document without names)
    except Exception:  # noqa: BLE001 - names are the parts' extra, never a reason to refuse
        return None
    by_page: PartNames = {}
    for name, dest in dests.items():
        page = dest.raw_get("/Page") if "/Page" in dest else None
        if isinstance(page, IndirectObject):
            by_page.setdefault(page.idnum, []).append((name, list(dest.dest_array[1:])))
    return by_page


def _named_target(annot: DictionaryObject) -> str | None:
    """The destination name a link leads to (its /Dest, or else its GoTo action's /D), if
    a string; None for a link to a page, another file's name (GoToR), or no link."""
    holders = _name_holders(annot)
    if "/Dest" in annot:
        holders = [h for h in holders if h[1] == "/Dest"]
    return holders[0][2] if holders else None


def _write_part(reader: PdfReader, numbers: range, path: Path,
                names: PartNames | None) -> None:
    """Pages ``numbers`` of ``reader`` as a PDF of their own at ``path``.

    The pages go in first without their annotations and page actions, then each
    annotation, as long as nothing it refers to leads to a page outside the part (what
    does is cut: the keys, or the annotation). add_page copied a page's annotations with
    whatever they named: a link's target page (its content, unseen in the part's page tree,
    for whoever got the part: audit EN), and through it that page's own links, page after
    page (a chain of 300 pages overflowed pypdf's recursion: review EQ); pypdf's append
    drops links only, and carried the whole document through a note's reference, at a cost
    per part growing with the named destinations (review EO). Added first, the part's pages
    are where links within the part lead (pypdf maps each page it copied once).

    The named destinations of the part's pages go with it (hyperref links every reference
    by name: in a part they all led nowhere, audit FY), each to its page's copy, its view
    kept; a link by a name on another part's page is dropped, as a link to that page is."""
    writer = PdfWriter()
    added = [writer.add_page(_without_links(reader.pages[n])) for n in numbers]
    own = {ref.idnum for n in numbers
           if (ref := reader.pages[n].indirect_reference) is not None}
    here: dict[str, ArrayObject] = {}
    for n, page in zip(numbers, added, strict=True):
        ref = reader.pages[n].indirect_reference
        for name, view in (names or {}).get(ref.idnum, ()) if ref is not None else ():
            here[name] = ArrayObject([page.indirect_reference, *view])
    safe: dict[int, bool] = {}  # (see _leads_out)
    for n, page in zip(numbers, added, strict=True):
        annots = reader.pages[n].get("/Annots")
        annots = annots.get_object() if annots is not None else None
        if not isinstance(annots, ArrayObject):
            continue
        kept = ArrayObject()
        for ref in annots:
            annot = ref.get_object()
            if not isinstance(annot, DictionaryObject):
                continue
            target = _named_target(annot) if names is not None else None
            if target is not None and target not in here and annot.get("/Subtype") == "/Link":
                continue
            if _leads_out(annot, own, safe):
                cut = _cut_out(annot, own, safe)
                if cut is not None:
                    kept.append(writer._add_object(cut.clone(writer)))
            elif isinstance(ref, IndirectObject):
                kept.append(ref.clone(writer))
            else:
                kept.append(writer._add_object(annot.clone(writer)))
        if kept:
            page[NameObject("/Annots")] = kept
    if here:
        _write_name_tree(writer, here)
        # Each link by name as the tree spells the name (a name read from UTF-16 or bytes
        # no text encoding holds was written anew there, and a viewer matching bytes found
        # nothing for the link's own spelling: review GB).
        _rename_link_targets(added, {name: name for name in here})
    # "xb": the folder is ours and starts empty; never clobber whatever appeared in it.
    with path.open("xb") as fh:
        writer.write(fh)


# A page's own keys a part does not copy: its annotations (added after, checked), page
# open/close actions and article beads, which may lead to other pages.
_NOT_COPIED = ("/Annots", "/AA", "/B")


def _cut_out(annot: DictionaryObject, own: set[int],
             safe: dict[int, bool]) -> DictionaryObject | None:
    """A copy of ``annot`` without the keys that lead out of the part (``own``: its pages'
    numbers in the source), or None if it still does, or is a link left with no target."""
    copy = DictionaryObject({k: v for k, v in annot.items() if not _leads_out(v, own, safe)})
    if _leads_out(copy, own, safe) or (copy.get("/Subtype") == "/Link"
                                 and "/Dest" not in copy and "/A" not in copy):
        return None
    return copy
