"""Print pyproject.toml's runtime dependencies pinned to their floors ("pypdf>=7,<8" ->
"pypdf==7"), for .ci/run to install and run the demo batch on: a floor nothing checks
drifts below what the code needs (audit BQ found three)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
pins = []
for dep in deps["project"]["dependencies"]:
    found = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)(\s*,.*)?", dep)
    if found is None:
        sys.exit(f"floors: {dep!r} has no >= floor to check")
    pins.append(f"{found[1]}=={found[2]}")
print("\n".join(pins))
