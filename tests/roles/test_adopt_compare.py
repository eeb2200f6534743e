"""roles/adopt/tasks/compare.yml holds an adopted host's new server to adopt_min_decode_share of the
by-hand server's decode speed, reading the gate's verdict (its ``reference``); run with
ansible-playbook on localhost against the verdicts the gate returns. A verdict without the
comparison is refused, not passed. The molecule scenario ``adopt`` runs it in a whole adoption."""

from __future__ import annotations

from pathlib import Path

import pytest
from role_files import run_role_tasks

# The gate's verdict as llm_gate/verdict.py returns it, with and without the comparison.
REFERENCE = {"figure": "decode_tps_mean", "value": 21.0, "reference": 30.0, "share": 0.7, "min_share": 0.9}
PASSED = {"passed": True, "reference": {**REFERENCE, "value": 29.0, "needed": 27.0, "ok": True}}
SLOWER = {"passed": True, "reference": {**REFERENCE, "needed": 27.0, "ok": False}}
NO_REFERENCE = {"passed": True, "reference": None}


def compare(tmp_path: Path, verdict: dict) -> str:
    """Run compare.yml with the gate's ``verdict``; its output as one line, or '' when it passed."""
    variables = {"health_gate_verdict": verdict, "adopt_min_decode_share": 0.9}
    proc = run_role_tasks(tmp_path, variables, ["compare.yml"], check_mode=False, role="adopt")
    flat = " ".join(proc.stdout.split())
    assert proc.returncode in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
    return "" if proc.returncode == 0 else flat


def test_a_new_server_at_its_share_passes(tmp_path):
    assert compare(tmp_path, PASSED) == ""


def test_a_new_server_below_its_share_is_refused(tmp_path):
    assert (
        "The new server decodes 21.0 tok/s, less than adopt_min_decode_share 0.9 of the by-hand server's 30.0 tok/s "
        "(needs 27.0): find what makes it slower, or lower adopt_min_decode_share."
    ) in compare(tmp_path, SLOWER)


@pytest.mark.parametrize("verdict", [NO_REFERENCE, {"passed": True}], ids=["reference-null", "no-reference-key"])
def test_a_verdict_without_the_comparison_is_refused_not_passed(tmp_path, verdict):
    out = compare(tmp_path, verdict)
    assert "TASK [adopt : Refuse a gate verdict that holds no comparison with the by-hand server]" in out
    assert (
        "The gate of the new server on localhost compared nothing with the by-hand server's decode speed (its verdict "
        "has no reference), so adopt_min_decode_share 0.9 was not checked: let the adoption's baseline hand the gate "
        "health_gate_reference (drop any -e of it) and deploy again."
    ) in out
