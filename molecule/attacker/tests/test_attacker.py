"""The attacker scenario: accounts below root planted links to a root-owned canary wherever they could
write and a playbook had touched, then every playbook ran. Root changed no root-owned file outside
what the playbooks are declared to write, never wrote through a planted link, and sent no key to the
local user who held the server's port during a start (files/attacker.py, files/run_steps.py)."""

from __future__ import annotations

import re

import pytest

# molecule/shared: the helpers of every scenario's verifier (molecule/shared/verify_steps.py).
from verify_steps import recorded

STEPS = [
    "adopt_fails_learn",
    "adopt_fails",
    "adopt",
    "noop",
    "change_rolled_back",
    "upgrade",
    "rollback",
    "bakeoff",
    "nightly",
    "change_under_squat",
    "noop_last",
]
FAKE_KEY = "attacker-scenario-fake-api-key"
BY_HAND_BACK = "so the host is back on the server that ran by hand"
ROLLED_BACK = "The host is back on its last-known-good state"


def step(name: str) -> dict:
    """The driver's record of one step: exit code, output (colours removed), the attacker's rounds."""
    found = recorded(f"attacker-{name}.json")
    found["output"] = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", found["output"]).split())
    return found


@pytest.mark.parametrize("name", STEPS)
def test_root_changed_nothing_outside_the_declared_paths(name):
    for attack in step(name)["rounds"]:
        assert not attack["canary_changed"], f"{attack['step']}: root wrote through a planted link"
        assert attack["differences"] == [], f"{attack['step']}: root-owned files changed: {attack['differences']}"


@pytest.mark.parametrize("name", STEPS)
def test_every_step_reached_its_end_with_the_links_planted(name):
    """A step may stop at a link that an account planted in its own directory (it breaks only what is
    its own, and nothing changed): that link is then planted no more and the step runs again, so that
    what comes after it is attacked too. A step that stops at a link in a shared directory (a local user
    who can refuse every deploy), or fails otherwise, has not reached its end."""
    found = step(name)
    assert found["reached_its_end"], (
        f"{name}: exit {found['rc']}, guarded {found['guarded']}: {found['output'][-3000:]}"
    )
    if name != "adopt_fails_learn":
        assert found["rounds"][-1]["planted"], f"{name} ran with nothing planted"


def test_the_steps_did_what_each_playbook_does():
    """The failed adoptions gave the by-hand server back, the adoption and the plain deploys passed, the
    change was rolled back, the squatter named (run_steps.py's reached only says that a step printed its
    sentence)."""
    outcomes = {name: step(name) for name in STEPS}
    for name in ("adopt_fails_learn", "adopt_fails"):
        assert outcomes[name]["rc"] != 0 and BY_HAND_BACK in outcomes[name]["output"], name
    for name in ("adopt", "noop", "rollback", "bakeoff", "nightly", "noop_last"):
        assert outcomes[name]["rc"] == 0, f"{name}: {outcomes[name]['output'][-2000:]}"
    # Kept, or refused by the relative gate on a loaded machine and rolled back: its path ran either way.
    assert outcomes["upgrade"]["rc"] == 0 or ROLLED_BACK in outcomes["upgrade"]["output"]
    assert outcomes["change_rolled_back"]["rc"] != 0 and ROLLED_BACK in outcomes["change_rolled_back"]["output"]
    assert outcomes["change_under_squat"]["rc"] != 0 and "mallory (uid" in outcomes["change_under_squat"]["output"]


def test_the_by_hand_user_planted_at_its_log_before_the_rescue():
    """Issue 51's repro of item 3: ml's log a link to the canary when the rescue starts the by-hand
    server again (root appended 13 KB to the canary before the fix)."""
    planted = step("adopt_fails")["rounds"][-1]["planted"]
    assert {"path": "/home/ml/s.log", "by": "ml", "own": True} in planted


def test_every_account_below_root_was_an_attacker():
    """The accounts' writable paths were read from the host, and the service account and the by-hand
    user each planted at paths the playbooks touched."""
    attacks = [attack for name in STEPS[1:] for attack in step(name)["rounds"]]
    assert set(attacks[-1]["accounts"]) == {"mallory", "ml", "inference"}
    assert all(attacks[-1]["writable"][account] > 0 for account in ("mallory", "ml", "inference"))
    planters = {item["by"] for attack in attacks for item in attack["planted"]}
    assert {"ml", "inference"} <= planters, planters


def test_no_key_reached_the_squatter():
    """mallory held the server's port from the window between the port guard and the engine's listen of
    a restart, answering 200 to everything: the unit's wait, the gate and the rollback sent her nothing
    that holds the key."""
    *received, bound, _unit_after = step("change_under_squat")["squatter"]
    assert bound["bound"] >= 1, "the squatter never held the port: the case tested nothing"
    for connection in received:
        assert FAKE_KEY not in connection["received"]
        assert "authorization" not in connection["received"].lower()
