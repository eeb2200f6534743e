#!/usr/bin/env python3
"""Compare the distributions installed in this interpreter's environment with a lock file.

Kept instead of ``uv pip sync`` or ``ansible.builtin.pip``: it runs with the new venv's python and
the standard library before anything is installed, where uv is not on the host and the pip module
never removes a package the lock does not name (docs/architecture.md, 'Hand-written code beside a
library or builtin').

Run with the venv's own python: ``<venv>/bin/python venv_state.py LOCK``. Prints one JSON
object: ``installed`` (name -> version), ``missing`` (locked, not installed),
``mismatched`` ([name, locked, installed]), ``extra`` (installed, not locked; pip's own
seed packages are ignored). Reads package metadata only: no pip subprocess, no network.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata

# Packages a fresh venv brings with it; they are tools, not part of the locked set.
SEED_PACKAGES = {"pip", "setuptools", "wheel", "pkg-resources"}


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


_MARKER_CLAUSE = re.compile(r'^python_version\s*(<=|>=|==|!=|<|>)\s*"(\d+(?:\.\d+)*)"$')


def marker_applies(marker: str, python: tuple[int, ...]) -> bool:
    """Evaluate a lock line's environment marker for this interpreter.

    Locks made by tools/lock-profile only use ``python_version`` comparisons joined by
    ``and``; anything else is refused rather than guessed.
    """
    compare = {
        "<": tuple.__lt__,
        "<=": tuple.__le__,
        ">": tuple.__gt__,
        ">=": tuple.__ge__,
        "==": tuple.__eq__,
        "!=": tuple.__ne__,
    }
    for clause in marker.split(" and "):
        match = _MARKER_CLAUSE.match(clause.strip())
        if not match:
            raise SystemExit(f"unsupported environment marker in lock: '{marker}'")
        wanted = tuple(int(part) for part in match.group(2).split("."))
        if not compare[match.group(1)](python[: len(wanted)], wanted):
            return False
    return True


def logical_lines(text: str) -> list[str]:
    """The lock's lines as pip reads them: a line ending in a backslash goes on with the next
    (a comment line never continues)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            pending += raw[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    return lines + ([pending] if pending else [])


# A wheel's sha256 on a lock line (``--hash=sha256:<hex>``, tools/lock-profile): not part of the pin.
_HASH_OPTION = re.compile(r"\s--hash[=\s]\s*\S+")


def read_lock(path: str, python: tuple[int, ...] = sys.version_info[:2]) -> dict[str, str]:
    """Map canonical name -> pinned version for every ``name==version`` line of the lock
    whose marker (if any) applies to ``python``; ``--hash`` options and continued lines are
    read as pip reads them."""
    pins: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for raw in logical_lines(handle.read()):
            line = _HASH_OPTION.sub("", " " + raw.split("#", 1)[0]).strip()
            if not line:
                continue
            requirement, _, marker = line.partition(";")
            if marker.strip() and not marker_applies(marker.strip(), python):
                continue
            name, sep, version = requirement.partition("==")
            if not sep:
                raise SystemExit(f"{path}: '{line}' is not pinned with ==")
            name = name.split("[", 1)[0]
            pins[canonical(name.strip())] = version.strip()
    return pins


def installed() -> dict[str, str]:
    """Map canonical name -> version of every distribution visible to this interpreter."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[canonical(name)] = dist.version
    return found


def compare(pins: dict[str, str], have: dict[str, str]) -> dict[str, object]:
    """Describe how ``have`` differs from ``pins``."""
    missing = sorted(n for n in pins if n not in have)
    mismatched = sorted([n, pins[n], have[n]] for n in pins if n in have and have[n] != pins[n])
    extra = sorted(n for n in have if n not in pins and n not in SEED_PACKAGES)
    return {
        "installed": dict(sorted(have.items())),
        "missing": missing,
        "mismatched": mismatched,
        "extra": extra,
        "in_sync": not (missing or mismatched or extra),
    }


def main() -> int:
    """Entry point."""
    if len(sys.argv) != 2:
        print("usage: venv_state.py LOCK", file=sys.stderr)
        return 2
    print(json.dumps(compare(read_lock(sys.argv[1]), installed())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
