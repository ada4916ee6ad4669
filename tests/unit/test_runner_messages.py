"""What the runner's records say of a job that met its memory ceiling: what it was given."""

from __future__ import annotations

from renderctl.runner import inputs_said


def test_a_memory_outcome_names_the_inputs_without_looking_at_them() -> None:
    # (names only: a stat in the runner's loop could hang it on a stalled mount)
    assert inputs_said([]) == ""
    assert inputs_said(["/in/big.pdf"]) == "; its input: big.pdf"
    assert inputs_said(["/in/a.pdf", "/stalled/b.pdf"]) == "; its 2 inputs: a.pdf, b.pdf"
    assert inputs_said([f"/in/{i}.pdf" for i in range(5)]) == \
        "; its 5 inputs: 0.pdf, 1.pdf, 2.pdf and 2 more"
