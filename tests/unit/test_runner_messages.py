"""What the runner's records say of a job that met its memory ceiling: what it was given."""

from __future__ import annotations

from pathlib import Path

from renderctl.runner import INPUTS_LOOKED_AT, inputs_said

MB = 1 << 20


def test_a_memory_outcome_names_the_largest_input_and_the_total(tmp_path: Path) -> None:
    small, big = tmp_path / "a.pdf", tmp_path / "b.pdf"
    small.write_bytes(b"x" * MB)
    big.write_bytes(b"x" * (5 * MB))
    assert inputs_said([str(small), str(big)]) == \
        "; its 2 inputs total 6 MB, the largest b.pdf (5 MB)"
    assert inputs_said([str(big)]) == "; its input b.pdf is 5 MB"


def test_inputs_gone_or_too_many_to_look_at_are_said_as_such(tmp_path: Path) -> None:
    assert inputs_said([]) == ""
    assert inputs_said([str(tmp_path / "gone.pdf")]) == ""
    one = tmp_path / "p.pdf"
    one.write_bytes(b"x" * MB)
    many = [str(one)] * (INPUTS_LOOKED_AT + 1)
    # (only the first ones looked at, in the runner's loop: "at least" the total)
    assert inputs_said(many) == (f"; its {INPUTS_LOOKED_AT + 1} inputs total "
                                 f"{INPUTS_LOOKED_AT}+ MB, the largest p.pdf (1 MB)")
