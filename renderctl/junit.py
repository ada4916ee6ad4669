"""A JUnit XML report of one `run`, for CI systems: one testcase per job the run handled.

``JUnitCollector`` listens to the runner's events (it is a Reporter): the last terminal event
of each job decides its testcase. A dead-lettered, cancelled or expired job is a
``<failure>`` whose message is its cause and whose text ends with its stderr tail (read
from the job's record at the end). A job the run started but did not finish (released on
SIGTERM) is ``<skipped>``. ``classname`` is the job's kind.
"""

from __future__ import annotations

import os
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from renderctl.errors import text_lines
from renderctl.fsutil import replace_beside
from renderctl.store import Queue

TERMINAL_EVENTS = {"completed": "done", "dead": "dead", "cancelled": "cancelled",
                   "expired": "expired"}
STDERR_TAIL_LINES = 20
# What XML 1.0 has no character for: the C0 controls but tab, newline and carriage return,
# a lone surrogate, U+FFFE and U+FFFF. A job's exception or stderr may hold them (an ANSI
# colour code, a NUL); written as they are, no XML parser would read the report.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class Case:
    """One job as a testcase."""

    name: str
    classname: str
    time_s: float
    state: str  # done, dead, cancelled, expired, or "unfinished"
    message: str = ""
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.state in ("dead", "cancelled", "expired")


def xml_text(text: str) -> str:
    """``text`` with each character XML cannot hold shown as an escape (``\\x1b``,
    ``\\udcff``), as a `dead list` row shows a control character; the rest as it was."""
    return _NOT_XML.sub(lambda m: (f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100
                                   else f"\\u{ord(m[0]):04x}"), text)


def junit_xml(cases: Sequence[Case], *, suite: str = "renderctl", wall_s: float = 0.0) -> bytes:
    """The document: one ``<testsuite>`` inside ``<testsuites>``."""
    failures = sum(1 for c in cases if c.failed)
    skipped = sum(1 for c in cases if c.state == "unfinished")
    attrs = {"name": suite, "tests": str(len(cases)), "failures": str(failures),
             "errors": "0", "skipped": str(skipped), "time": f"{wall_s:.3f}"}
    root = ET.Element("testsuites", attrs)
    ts = ET.SubElement(root, "testsuite", {
        **attrs, "hostname": socket.gethostname(),
        # When the run began (JUnit's meaning: the suite's start), not when this is written.
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - wall_s))})
    for c in cases:
        tc = ET.SubElement(ts, "testcase", {"name": xml_text(c.name),
                                            "classname": xml_text(c.classname),
                                            "time": f"{c.time_s:.3f}"})
        if c.failed:
            f = ET.SubElement(tc, "failure", {"message": xml_text(c.message or c.state),
                                              "type": c.state})
            f.text = xml_text(c.detail or c.message)
        elif c.state == "unfinished":
            ET.SubElement(tc, "skipped",
                          {"message": xml_text(c.message or "not finished in this run")})
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``path`` atomically (a temporary file beside it, then rename).

    Its folder is not created: `run` checks it exists before the run, as a missing one is
    most likely a typo (and, run as root, would have made /nonexistent/... appear)."""
    replace_beside(path, data)


class JUnitCollector:
    """Remembers what happened to each job during a run (Reporter protocol), then reports."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, Any]] = {}  # job id -> its latest event, in order
        self.ran: set[str] = set()  # jobs an attempt of which started in this run
        self.started = time.monotonic()

    def event(self, ev: Mapping[str, Any]) -> None:
        job = ev.get("job")
        name = ev.get("event")
        if not isinstance(job, str) or name not in (*TERMINAL_EVENTS, "started", "retry",
                                                    "released", "recovered"):
            return
        prev = self.last.pop(job, {})
        merged = {**prev, **ev}
        if name in TERMINAL_EVENTS and "error" not in ev:
            # An ending of its own (cancelled while it waited for its retry): not the error
            # of the attempt before, which read as the failure's message (audit BJ).
            merged.pop("error", None)
        if name in ("started", "retry") or (name == "released" and "attempt" in ev):
            self.ran.add(job)
        if name == "started":
            merged.pop("state", None)
        self.last[job] = merged

    def tick(self, runner: object) -> None:
        pass

    def cases(self, queue: Queue | None = None) -> list[Case]:
        out: list[Case] = []
        for job, ev in self.last.items():
            state = TERMINAL_EVENTS.get(str(ev.get("event")))
            if ev.get("event") == "recovered":
                state = ev.get("state") if ev.get("state") in TERMINAL_EVENTS.values() else None
            if state is None and job not in self.ran:
                continue  # released before it started (claimed ahead): not run, not a case
            kind = ev.get("kind")
            message = str(ev.get("error") or ev.get("reason") or ev.get("outcome") or "")
            detail = ""
            if (state != "done" or not kind) and queue is not None:
                # (A job recovered to done has no kind in its event: its class was "job".)
                view = queue.find(job)
                if view is not None:
                    rec = view.record
                    kind = kind or rec.spec.kind
                    if state != "done":
                        last = rec.attempts[-1] if rec.attempts else {}
                        message = message or str(last.get("error") or rec.reason or "")
                        detail = _detail(last, rec.reason)
            if state is None:
                out.append(Case(job, str(kind or "job"), float(ev.get("elapsed_s") or 0.0),
                                "unfinished", "not finished in this run (released or "
                                "still pending a retry)"))
                continue
            out.append(Case(job, str(kind or "job"), float(ev.get("elapsed_s") or 0.0), state,
                            message or state, detail))
        return out

    def write(self, path: str | os.PathLike[str], queue: Queue | None = None) -> None:
        write_junit(path, junit_xml(self.cases(queue),
                                    wall_s=time.monotonic() - self.started))


def _detail(attempt: Mapping[str, Any], reason: str) -> str:
    lines = []
    if attempt:
        lines.append(f"attempt {attempt.get('n')}: {attempt.get('outcome')}")
        for key in ("error", "exit_code", "signal"):
            if attempt.get(key) is not None:
                lines.append(f"{key}: {attempt[key]}")
    if reason:
        lines.append(f"reason: {reason}")
    tail = text_lines(str(attempt.get("stderr_tail") or ""))[-STDERR_TAIL_LINES:]
    if tail:
        lines.append("stderr (last lines):")
        lines.extend(tail)
    return "\n".join(lines)
