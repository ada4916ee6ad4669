"""The runner reads workers' messages without ever waiting for the rest of one
(Runner._read_messages): what arrives is kept until a message is whole. Framed by the real
Connection.send, cut at every kind of place."""

from __future__ import annotations

import multiprocessing
import os
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from renderctl.runner import _take_message


def _sent_bytes(messages: list[object]) -> bytes:
    """What Connection.send puts on the wire for ``messages``, in order."""
    ours, theirs = multiprocessing.Pipe()
    sender = threading.Thread(target=lambda: [theirs.send(m) for m in messages])
    sender.start()
    wire = bytearray()
    while sender.is_alive() or ours.poll(0):
        if ours.poll(0.01):
            wire += os.read(ours.fileno(), 1 << 16)
    sender.join()
    ours.close()
    theirs.close()
    return bytes(wire)


MESSAGES = st.lists(st.one_of(st.text(max_size=50),
                              st.integers(),
                              st.tuples(st.text(max_size=5), st.binary(max_size=5)),
                              # over 16 KB: sent as two writes, header then payload
                              st.integers(16_000, 40_000).map(lambda n: "\U0001f600" * n)),
                    min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(messages=MESSAGES, cuts=st.lists(st.integers(1, 70_000), max_size=12))
def test_messages_cut_anywhere_come_out_whole_and_in_order(
        messages: list[object], cuts: list[int]) -> None:
    # Given the bytes Connection.send wrote for some messages, arriving in pieces
    wire = _sent_bytes(messages)
    pieces, at = [], 0
    for n in cuts:
        pieces.append(wire[at:at + n])
        at += n
    pieces.append(wire[at:])

    # When each piece is added to the inbox and every whole message taken
    inbox = bytearray()
    got: list[object] = []
    for piece in pieces:
        inbox += piece
        while (msg := _take_message(inbox)) is not None:
            got.append(msg)
        # Then nothing is taken before it is whole (nothing half-read is lost either)
        assert len(got) <= len(messages)

    # And every message comes out once, as sent, in order, with nothing left over
    assert got == messages
    assert inbox == bytearray()
