"""A command job's argv placeholders, as the worker expands them (never through a shell)."""

from __future__ import annotations

from pathlib import Path

import pytest

from renderctl.errors import InvalidInput
from renderctl.worker import expand_argv

OUT = Path("/o/.rctl-ab-1.tmp")


def test_placeholders_expand_whole_and_inside_an_argument() -> None:
    argv = ["magick", "{input}", "-density", "150", "pdf:{output}", "--log={output}.log"]
    assert expand_argv(argv, [Path("/i/a.png"), Path("/i/b.png")], OUT) == [
        "magick", "/i/a.png", "-density", "150", f"pdf:{OUT}", f"--log={OUT}.log"]


def test_inputs_becomes_one_argument_per_input_even_with_spaces() -> None:
    inputs = [Path("/i/a b.pdf"), Path("/i/c.pdf")]
    assert expand_argv(["qpdf", "--empty", "--pages", "{inputs}", "--", "{output}"],
                       inputs, OUT) == ["qpdf", "--empty", "--pages", "/i/a b.pdf",
                                        "/i/c.pdf", "--", str(OUT)]
    # only as a whole argument: inside one it is left as written
    assert expand_argv(["x={inputs}"], inputs, OUT) == ["x={inputs}"]


def test_input_without_any_input_is_the_jobs_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="no input"):
        expand_argv(["cat", "{input}"], [], OUT)


def test_a_substituted_path_is_never_substituted_again() -> None:
    # Given an output (or output root) whose path holds "{input}", and an input whose path
    # holds "{output}" (audit CB: the input's path was put inside the output's)
    out = Path("/o/{input}/.rctl-ab-1.tmp")
    inputs = [Path("/i/{output}.pdf")]
    # Then each placeholder is replaced once, by its own value
    assert expand_argv(["cp", "{input}", "{output}", "--to={output}"], inputs, out) == [
        "cp", "/i/{output}.pdf", str(out), f"--to={out}"]
