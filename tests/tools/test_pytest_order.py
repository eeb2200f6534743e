"""The order make pytest hands the test files to its workers in (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected_files(*args: str) -> list[str]:
    """The test files in the order pytest collects them, each once."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    files: list[str] = []
    for line in run.stdout.splitlines():
        name = line.split("::")[0]
        if "::" in line and name not in files:
            files.append(name)
    return files


def test_the_slowest_files_are_collected_first_and_unknown_ones_before_them() -> None:
    durations = json.loads((ROOT / "tests" / "durations.json").read_text())
    files = collected_files("tests/tools", "tests/health_gate", "tests/bakeoff")
    known = [f for f in files if f in durations]
    assert len(known) >= 3, files
    assert known == sorted(known, key=lambda f: -durations[f])
    unknown = [f for f in files if f not in durations]
    assert files[: len(unknown)] == unknown


def test_a_run_records_each_files_seconds(tmp_path: Path) -> None:
    out = tmp_path / "durations.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "health_gate/test_gate_maths.py",
            "tools/test_makefile.py",
            "--record-durations",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT / "tests",
    )
    # Run from tests/: the names are still the repository's.
    recorded = json.loads(out.read_text())
    assert set(recorded) == {"tests/health_gate/test_gate_maths.py", "tests/tools/test_makefile.py"}
    assert recorded["tests/tools/test_makefile.py"] > 0  # it runs make: never under 0.05 s
