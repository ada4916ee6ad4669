"""A job's exception as its attempt's traceback tail: bounded work, whatever the job raised."""

from __future__ import annotations

import time

from renderctl.worker import CHAIN_LINKS, TAIL_LINES, _traceback_tail


def chain(n: int, last: str) -> BaseException:
    """The last of ``n`` + 1 exceptions, each the context of the next."""
    exc: BaseException = ValueError("root")
    for k in range(n):
        nxt = ValueError(f"link {k}")
        nxt.__context__ = exc
        exc = nxt
    return RuntimeError(last) if n == 0 else _with_context(RuntimeError(last), exc)


def _with_context(exc: BaseException, context: BaseException) -> BaseException:
    exc.__context__ = context
    return exc


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - any job's exception
        return caught


def test_a_long_chain_is_formatted_from_its_last_links_only() -> None:
    exc = raised(chain(100_000, "the job's own"))
    t0 = time.perf_counter()
    tail = _traceback_tail(exc)
    took = time.perf_counter() - t0
    assert took < 1.0, took  # (minutes before: quadratic in Python's own formatting)
    assert tail.rstrip().endswith("RuntimeError: the job's own")
    assert len(tail.splitlines()) <= TAIL_LINES
    # What is left of the chain: the last CHAIN_LINKS links
    assert "link 99999" in tail and f"link {99_999 - CHAIN_LINKS}" not in tail


def test_the_chains_inside_an_exception_group_are_cut_too() -> None:
    group = raised(ExceptionGroup("many", [chain(100_000, f"member {i}") for i in range(5)]))
    t0 = time.perf_counter()
    tail = _traceback_tail(group)
    assert time.perf_counter() - t0 < 1.0  # (3.4 s a member before: review CG)
    assert "member 4" in tail


def test_an_exception_that_cannot_be_formatted_still_gives_a_tail() -> None:
    class Evasive(Exception):
        def __getattribute__(self, name: str) -> object:
            if name in ("__traceback__", "__cause__", "__context__", "__suppress_context__"):
                raise RuntimeError(name)
            return object.__getattribute__(self, name)

    assert _traceback_tail(Evasive("x")) == \
        "<the traceback could not be formatted: RuntimeError>\n"
