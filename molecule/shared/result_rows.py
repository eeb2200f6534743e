"""The rows a scenario adds to docs/reliability.md: written in one results file format, checked
against the committed copy.

molecule/reliability (every table, ``artifacts/reliability/results.json``) and molecule/fleet (its
fault rows, ``artifacts/fleet/faults.json``) write their rows with :func:`write_results`, and
compare them with the committed files (docs/reliability-results.json,
docs/reliability-results-fleet.json) with :func:`check_rows`; ``tools/reliability-report``
(deploytools.reliability_report, which owns the schema) renders them and does the comparing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from deploytools.reliability_report import SCHEMA

REPO = Path(__file__).resolve().parents[2]


def _commit() -> str:
    """The checkout's short commit, with ``+dirty`` when its tree has changes."""
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def write_results(path: Path, rows: list[dict[str, Any]], **fields: Any) -> None:
    """Write ``rows`` to ``path`` as a results file that tools/reliability-report reads: the schema,
    when, from which commit and on what machine, then ``fields`` (what the scenario adds: its
    name, its image, its duration, ...), then the rows, each with its ``table``, ``test`` and
    ``outcome``."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    results = {
        "schema": SCHEMA,
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg": [round(x, 2) for x in load],
            "python": platform.python_version(),
        },
        **fields,
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def check_rows(results: Path, committed: Path) -> tuple[bool, str]:
    """Whether the rows of ``results`` and their outcomes are those of ``committed`` (timings
    aside), and what ``tools/reliability-report --check-rows`` said (each difference)."""
    check = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "reliability-report"),
            "--results",
            str(results),
            "--check-rows",
            str(committed),
        ],
        capture_output=True,
        text=True,
    )
    return check.returncode == 0, check.stdout + check.stderr
