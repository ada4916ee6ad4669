"""Process-wide limits applied before every job, so hostile input cannot exhaust or escape.

The worker calls ``harden()`` before each job. It puts reportlab's configuration and font
registries back to what they were at first import (a previous job in the same process may
have changed them), then forbids reportlab from opening any URL or ``file:`` resource,
bounds pypdf's decompression and parsing work, and bounds Python's recursion depth. Calling
it twice is the same as calling it once.
"""

from __future__ import annotations

import sys
from typing import Any

import pypdf
import reportlab.rl_config as rl_config
from reportlab.lib import fonts as rl_fonts
from reportlab.pdfbase import pdfmetrics

from renderctl.cleanslate import restore_mapping

# Well below the 400 MB default memory ceiling, far above what a real invoice or report needs:
# a bomb fails fast as invalid input instead of being killed as a memory outcome after retries.
MAX_STREAM_OUTPUT_BYTES = 50_000_000
MAX_DECODING_WORK_BYTES = 150_000_000
# pypdf and platypus recurse on nested objects; deeper than this is hostile, and a bounded
# RecursionError is far better than overflowing the C stack (a crash, then a retry).
RECURSION_LIMIT = 2_000

# The only module-level state: snapshots taken once, never mutated.
_RL_SNAPSHOT: dict[str, Any] = rl_config.currentSettings()

# reportlab registers the 14 standard fonts lazily, on first use; registered up front, the
# built-in renderers (which draw with them only) leave the registries as they are, and
# anything else in them is a job's: a TrueType font registered as "Helvetica" was embedded,
# unannounced, in every later invoice of that worker.
for _name in pdfmetrics.standardFonts:
    pdfmetrics.getFont(_name)
_FONT_REGISTRIES: tuple[tuple[dict[Any, Any], dict[Any, Any]], ...] = tuple(
    (live, dict(live)) for live in (
        pdfmetrics._fonts, pdfmetrics._typefaces, pdfmetrics._encodings,
        pdfmetrics._dynFaceNames, rl_fonts._tt2ps_map, rl_fonts._ps2tt_map,
        rl_fonts._family_alias))

_PYPDF_LIMITS: dict[str, Any] = {
    "maximum_declared_stream_length": MAX_STREAM_OUTPUT_BYTES,
    "array_based_stream_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "jbig2_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "lzw_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "run_length_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "zlib_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "zlib_maximum_recovery_input_length": 5_000_000,
    "brotli_maximum_output_length": MAX_STREAM_OUTPUT_BYTES,
    "image_maximum_buffer_size": MAX_STREAM_OUTPUT_BYTES,
    "stream_decoding_work_maximum_length": MAX_DECODING_WORK_BYTES,
    "xfa_decoding_work_maximum_length": MAX_DECODING_WORK_BYTES,
    # Shelling out to jbig2dec from inside a job would escape the worker's accounting.
    "jbig2dec_binary": None,
    # We never modify the deprecated module constants, so skip pypdf's per-reader check.
    "disable_legacy_handling": True,
}


def hardened_pypdf_configuration() -> pypdf.Configuration:
    """The pypdf configuration every job runs with (built from pypdf's defaults)."""
    return pypdf.Configuration().with_overwrites(**_PYPDF_LIMITS)


# Built once: a Configuration is a frozen dataclass, so no job can alter the shared one.
_HARDENED_PYPDF = hardened_pypdf_configuration()
_MISSING = object()


def reset_reportlab_config() -> None:
    """Restore ``reportlab.rl_config`` to the values captured when this module was imported.

    Only what differs is restored: copying and re-applying all 66 settings per job cost
    ~0.15 ms; a job rarely changes any (after harden(), the two trust lists differ)."""
    changed = {k: v for k, v in _RL_SNAPSHOT.items() if getattr(rl_config, k, _MISSING) != v}
    if changed:
        from copy import deepcopy

        # deepcopy: applySettings assigns lists in place, and must not alias the snapshot.
        rl_config.applySettings(deepcopy(changed))


def reset_font_registries() -> None:
    """Put reportlab's font, typeface, encoding and family registries back as they were at
    import (registerFont, registerFontFamily, addMapping), where a job changed them."""
    for live, then in _FONT_REGISTRIES:
        restore_mapping(live, then)


def harden() -> None:
    """Apply renderctl's limits to reportlab, pypdf and the interpreter; idempotent."""
    reset_reportlab_config()
    reset_font_registries()
    # Empty, not None: reportlab then refuses every scheme and every host, including file:.
    rl_config.trustedSchemes = []
    rl_config.trustedHosts = []
    if pypdf.get_configuration() != _HARDENED_PYPDF:  # rebuilding it costs ~15 us
        pypdf.overwrite_configuration(_HARDENED_PYPDF)
    sys.setrecursionlimit(RECURSION_LIMIT)
