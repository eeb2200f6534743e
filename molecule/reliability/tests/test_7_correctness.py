"""What the server says (issue 46): servers that are up and fast but wrong, refused; outputs changed on purpose.

The correctness probe of the gate (docs/health-gate.md, "Correctness") against the real CPU engine:
a model revision with perturbed weights (the same shapes and files, wrong answers); greedy outputs
that are not deterministic (the faulty-engine stand-in turns the server's decoding into sampling
while the unit carries the deploy's marker, molecule/shared/files/faulty-engine.py); and an operator
who changes the outputs on purpose (the stand-in shifts the completions while the unit carries the
other marker), with health_gate_accept_output_change. Each refused deploy must leave the host on its
last-known-good state, serving; the stand-ins are transparent for the restored unit. They run last:
the first deploy puts the host back on the group's model (the remote-code row left another).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import CACHE, HOST, REPO, UNIT, Deployer, dexec, full_match, healthy, record, sh, unit_sha_and_lkg

FAULTY_ENGINE = "/usr/local/lib/faulty-engine.py"
UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"
# Each stand-in: its fault, its port, the marker a deploy puts in the unit to turn it on.
STAND_INS = {"sample": (8102, "RELIABILITY_FAULT=sample"), "corrupt": (8103, "RELIABILITY_FAULT=corrupt")}
BACK_ON_LKG = (
    r"Deploy step 'Fail when the gate failed' failed on rel-molecule: gate FAIL: .* The host is back on "
    r"its last-known-good state \(engine transformers 5\.6\.0, model revision [0-9a-f]{12}, venv lock "
    r"transformers-cpu\) and serving: gate PASS: .*right: golden 5/5.*"
)


def lkg() -> dict[str, Any]:
    """The last-known-good record on the host."""
    return json.loads(sh(f"cat /var/lib/{UNIT}-deploy/last-known-good/state.json"))


def through(fault: str) -> dict[str, Any]:
    """The deploy variables that turn ``fault``'s stand-in on (the unit's marker) and gate through it."""
    port, marker = STAND_INS[fault]
    name, value = marker.split("=")
    # The stand-in runs as root (systemd-run), not as the service account: the gate's listener check expects root.
    return {
        "inference_server_environment": {name: value},
        "health_gate_url": f"http://127.0.0.1:{port}",
        "health_gate_listener_user": "root",
    }


@pytest.fixture(scope="module")
def stand_ins() -> None:
    """The two stand-ins, each a transient unit in front of the real server."""
    subprocess.run(["docker", "cp", str(REPO / "molecule/shared/files/faulty-engine.py"), f"{HOST}:{FAULTY_ENGINE}"],
                   check=True)  # fmt: skip
    for fault, (port, marker) in STAND_INS.items():
        dexec("systemd-run", "--unit", f"rel-{fault}-engine", "python3", FAULTY_ENGINE, str(port), "8000", fault,
              "--when-unit", UNIT_FILE, marker)  # fmt: skip
    yield
    for fault in STAND_INS:
        dexec("systemctl", "stop", f"rel-{fault}-engine", check=False)


def test_a_fast_model_revision_that_answers_wrong_is_refused(deployer: Deployer, workdir: Path) -> None:
    """Perturbed weights: the same files and shapes, as fast, 1 in 20 of the eval right."""
    back = deployer.run({"health_gate_correctness": "always"})
    assert back.rc == 0, back.tail()
    before = lkg()
    wrong = workdir / "tiny-qwen3.5-perturbed"
    if not wrong.exists():
        subprocess.run(
            [str(CACHE / "venvs/transformers-cpu/bin/python"), str(REPO / "tools/make-tiny-model"), "--out", str(wrong),
             "--from", str(CACHE / "models/tiny-qwen3.5"), "--perturb", "1.5"],
            check=True, capture_output=True,
        )  # fmt: skip
    run = deployer.run({"model_sync_source": {"type": "controller_dir", "path": str(wrong), "revision": "perturbed"}})
    refused = re.search(r"gate FAIL: ([^\n]*?) - ", run.message)
    record(
        "faults",
        id="fast-but-wrong",
        fault="a new model revision is fast but answers wrong",
        how="a deploy of the rehearsal model with seeded noise of 1.5 standard deviations on every weight matrix "
        "(tools/make-tiny-model --perturb: the same files, shapes and speed)",
        happened=f"the new server was healthy and as fast ({refused.group(1) if refused else '?'})",
        host_did="the gate's eval score failed it (a new revision is judged by its score, not by the old one's "
        "outputs); the rescue put back the last-known-good model link, unit and venv, restarted and gated it "
        "(the probe again: its golden outputs the recorded ones), and the play failed with one message",
        message=run.message[:400],
        recover_s=run.duration_s,
        rc=run.rc,
    )
    assert run.rc != 0 and full_match(BACK_ON_LKG, run.message), run.message
    assert "is below min_eval_score 0.8" in run.message
    # Healthy and as fast: the speed checks passed, only the answers failed it.
    assert refused and "tok/s decode" in refused.group(1) and "below min_decode_tps" not in refused.group(1)
    after = lkg()
    assert after["model_dir"] == before["model_dir"] and after["gate_baseline"] == before["gate_baseline"]
    assert "perturbed" not in sh("readlink /srv/models/tiny-qwen3.5/current")
    assert healthy()


def test_greedy_outputs_that_are_not_deterministic_are_refused(deployer: Deployer, stand_ins: None) -> None:
    run = deployer.run(through("sample"))
    reason = re.search(r"greedy decoding is not deterministic[^;]*", run.message)
    record(
        "faults",
        id="nondeterministic",
        fault="greedy decoding is not deterministic",
        how="a deploy whose server samples instead of decoding greedily (the faulty-engine stand-in in front of "
        "the real one, on while the unit carries RELIABILITY_FAULT=sample)",
        happened="the same prompt, asked again in the same cache state, gave other tokens",
        host_did=f"the gate's consistency check failed it ({reason.group(0) if reason else '?'}); the rescue "
        "restored the last-known-good unit (the stand-in is transparent for it), re-gated it, and the play "
        "failed with one message",
        message=run.message[:400],
        recover_s=run.duration_s,
        rc=run.rc,
    )
    assert run.rc != 0 and full_match(BACK_ON_LKG, run.message), run.message
    assert reason, run.message
    assert "RELIABILITY_FAULT" not in sh(f"cat {UNIT_FILE}") and healthy()


def test_outputs_changed_on_purpose_become_the_reference(deployer: Deployer, stand_ins: None) -> None:
    """A change of outputs is refused with how to accept it, accepted with one variable, and then the reference."""
    golden = lkg()["gate_baseline"]["correctness"]["golden"]
    refused = deployer.run(through("corrupt"))
    accepted = deployer.run(dict(through("corrupt"), health_gate_accept_output_change=True))
    moved = lkg()["gate_baseline"]["correctness"]["golden"]
    back = deployer.run({"health_gate_accept_output_change": True})
    record(
        "faults",
        id="rebaseline",
        fault="an operator changes the server's outputs on purpose",
        how="a deploy whose completions come back shifted by one character (the faulty-engine stand-in, on while "
        "the unit carries RELIABILITY_FAULT=corrupt), first as is, then with "
        "-e health_gate_accept_output_change=true; then back, accepted again",
        happened="the golden outputs differed from the last-known-good's on every prompt; the eval did not",
        host_did="refused and rolled back the first, naming health_gate_accept_output_change; kept the second, whose "
        "outputs became the last-known-good's golden ones; kept the third the same way",
        message=refused.message[:300],
        recover_s=accepted.duration_s,
        rc=accepted.rc,
    )
    assert refused.rc != 0 and full_match(BACK_ON_LKG, refused.message), refused.message
    assert "health_gate_accept_output_change=true (the new outputs then become the golden ones)" in refused.message
    assert accepted.rc == 0, accepted.tail()
    assert moved != golden and all(moved[key]["text"] != golden[key]["text"] for key in golden)
    assert back.rc == 0, back.tail()
    assert lkg()["gate_baseline"]["correctness"]["golden"] == golden
    unit, kept = unit_sha_and_lkg()
    assert unit == kept and healthy()
