# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Report storage: ``<UTC timestamp>.json`` plus ``latest.json``, the history pruned."""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
from typing import Any

REPORT_NAME_RE = re.compile(r"^\d{8}T\d{6}Z(?:-\d+)?\.json$")
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> datetime.datetime:
    """Current UTC time (timezone aware)."""
    return datetime.datetime.now(datetime.timezone.utc)


def _atomic_write(path: str, text: str) -> None:
    """Write ``path`` through a temporary file beside it (readers never see half a report)."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)  # root's: the deploy's own state (mkstemp's mode, stated)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def store_report(report: dict[str, Any], report_dir: str, keep: int) -> str:
    """Write ``<UTC timestamp>.json`` and ``latest.json`` in ``report_dir``; prune the history.

    Keeps the newest ``keep`` timestamped reports; returns the new report's path.
    Failed gates are stored too, so a failed attempt stays on record.
    """
    os.makedirs(report_dir, mode=0o700, exist_ok=True)
    # Root's only, also where an older deploy made it 0755 (the reports name the host's paths and figures).
    os.chmod(report_dir, 0o700)
    stamp = str(report.get("timestamp") or utc_now().strftime(TIMESTAMP_FORMAT))
    base = stamp.replace("-", "").replace(":", "")
    name = base + ".json"
    n = 0
    while os.path.exists(os.path.join(report_dir, name)):
        n += 1
        name = f"{base}-{n}.json"
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    path = os.path.join(report_dir, name)
    _atomic_write(path, text)
    _atomic_write(os.path.join(report_dir, "latest.json"), text)
    history = sorted((f for f in os.listdir(report_dir) if REPORT_NAME_RE.match(f)), key=_report_sort_key)
    for old in history[:-keep] if len(history) > keep else []:
        try:
            os.unlink(os.path.join(report_dir, old))
        except OSError:
            pass
    return path


def _report_sort_key(name: str) -> tuple[str, int]:
    """Order ``<stamp>.json`` before ``<stamp>-1.json``, ``-2`` ... (oldest first)."""
    stem = name[:-5]
    if "-" in stem:
        base, n = stem.split("-", 1)
        return base, int(n)
    return stem, 0
