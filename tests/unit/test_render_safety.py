"""safety.harden: reportlab fetches nothing, pypdf is bounded, settings never leak between jobs."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pypdf
import pytest
import reportlab.rl_config as rl_config
from reportlab.lib.utils import open_for_read
from reportlab.platypus import Image

from renderctl.render import safety


@pytest.fixture(autouse=True)
def _restore_after() -> Iterator[None]:
    yield
    safety.harden()


def test_harden_is_idempotent() -> None:
    safety.harden()
    first = (rl_config.currentSettings(), pypdf.get_configuration(), sys.getrecursionlimit())
    safety.harden()
    second = (rl_config.currentSettings(), pypdf.get_configuration(), sys.getrecursionlimit())
    assert first == second


def test_harden_empties_reportlab_trust_and_bounds_pypdf() -> None:
    safety.harden()
    assert rl_config.trustedSchemes == []
    assert rl_config.trustedHosts == []
    config = pypdf.get_configuration()
    assert config.zlib_maximum_output_length == safety.MAX_STREAM_OUTPUT_BYTES
    assert config.maximum_declared_stream_length == safety.MAX_STREAM_OUTPUT_BYTES
    assert config.jbig2dec_binary is None
    assert sys.getrecursionlimit() == safety.RECURSION_LIMIT


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "file://localhost/etc/hostname",
        "http://127.0.0.1:9/x",
        "https://example.com/logo.png",
        "data:text/plain,hello",
        "rml:anything",
    ],
)
def test_reportlab_refuses_every_url_scheme(url: str) -> None:
    safety.harden()
    with pytest.raises(OSError, match="Cannot open resource"):
        open_for_read(url)


def test_an_image_flowable_cannot_fetch_a_url() -> None:
    safety.harden()
    with pytest.raises(OSError):
        Image("file:///etc/passwd").drawHeight  # noqa: B018 (the load is the point)


def test_reset_undoes_a_previous_jobs_rl_config_changes() -> None:
    # Given the values a fresh process starts with
    safety.harden()
    before = rl_config.currentSettings()
    # When a job changes reportlab's settings (rebinding and mutating in place)
    rl_config.invariant = 1
    rl_config.pageCompression = 0
    rl_config.trustedSchemes = ["https"]
    rl_config.trustedHosts = ["*"]
    rl_config.T1SearchPath.append("/tmp/evil-fonts")
    # Then the next job's harden() puts them all back
    safety.harden()
    assert rl_config.currentSettings() == before
    assert "/tmp/evil-fonts" not in rl_config.T1SearchPath


def test_reset_reportlab_config_restores_first_import_values() -> None:
    rl_config.shapeChecking = 0
    rl_config.trustedSchemes = []
    safety.reset_reportlab_config()
    assert rl_config.shapeChecking == 1
    assert "https" in rl_config.trustedSchemes


def test_harden_undoes_fonts_a_previous_job_registered() -> None:
    import os

    import reportlab
    from reportlab.lib.fonts import addMapping, ps2tt
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    # Given the standard Helvetica a fresh worker draws with
    safety.harden()
    standard = pdfmetrics.getFont("Helvetica")
    assert standard.face.name == "Helvetica"
    # When a job registers a TrueType font under that name (it took the name in a worker
    # that had not drawn with Helvetica yet: reportlab registers the standard fonts on first
    # use), one of its own, and a family mapping
    vera = os.path.join(os.path.dirname(reportlab.__file__), "fonts", "VeraBd.ttf")
    pdfmetrics.registerFont(TTFont("Helvetica", vera))
    pdfmetrics.registerFont(TTFont("JobFont", vera))
    addMapping("helvetica", 1, 1, "JobFont")
    assert ps2tt("JobFont") == ("helvetica", 1, 1)
    # Then Helvetica is still the standard font, and the next job's harden() puts the
    # registries back as a fresh worker has them
    assert pdfmetrics.getFont("Helvetica") is standard
    safety.harden()
    assert pdfmetrics.getFont("Helvetica") is standard
    assert "JobFont" not in pdfmetrics.getRegisteredFontNames()
    assert "BitstreamVeraSans-Bold" not in pdfmetrics._dynFaceNames
    assert ps2tt("Helvetica-BoldOblique") == ("helvetica", 1, 1)
    with pytest.raises(ValueError):
        ps2tt("JobFont")


def test_harden_bounds_a_raised_recursion_limit() -> None:
    sys.setrecursionlimit(100_000)
    safety.harden()
    assert sys.getrecursionlimit() == safety.RECURSION_LIMIT


def test_harden_restores_pypdf_limits_a_job_loosened() -> None:
    pypdf.overwrite_configuration(zlib_maximum_output_length=10**12)
    safety.harden()
    assert pypdf.get_configuration().zlib_maximum_output_length == safety.MAX_STREAM_OUTPUT_BYTES
