"""A fleet of three rehearsal hosts: a good change rolls through all, a bad change stops at
the first host (rolled back) and never touches the others, a no-op nightly run changes and
restarts nothing, and drift is put back and reported."""
from __future__ import annotations

import json
import os
from pathlib import Path

HOSTS = ["molecule-fleet-1", "molecule-fleet-2", "molecule-fleet-3"]


def step(name: str) -> dict:
    """What side_effect.yml recorded for one step: rc, output, per-host [unit sha, start]."""
    return json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / f"fleet-{name}.json").read_text())


def unit_sha(record: dict, host: str) -> str:
    return record[host][0]


def started(record: dict, host: str) -> str:
    return record[host][1]


def test_good_change_rolls_through_every_host():
    run = step("good_change")
    assert run["rc"] == 0, run["output"][-3000:]
    for host in HOSTS:
        assert unit_sha(run["after"], host) != unit_sha(run["before"], host)
        assert started(run["after"], host) != started(run["before"], host)


def test_bad_change_stops_at_the_first_host_which_is_back_on_its_previous_state():
    run = step("bad_change")
    assert run["rc"] != 0
    output = " ".join(run["output"].split())
    assert "Unsupported attention implementation: 'no_such_attention'" in output
    assert "The host is back on its last-known-good state" in output
    first, others = HOSTS[0], HOSTS[1:]
    assert unit_sha(run["after"], first) == unit_sha(run["before"], first)
    for host in others:
        assert run["after"][host] == run["before"][host], f"{host} was touched"
        assert f"{host} : ok=" not in output.split("PLAY RECAP")[-1]


def test_noop_nightly_run_changes_and_restarts_nothing_and_still_measures():
    run = step("nightly_noop")
    assert run["rc"] == 0, run["output"][-3000:]
    summary = json.loads(run["stdout"])
    assert summary["status"] == "OK"
    assert summary["totals"]["changed"] == 0 and summary["totals"]["restarts"] == 0
    for host in HOSTS:
        assert summary["hosts"][host]["changed_tasks"] == []
        assert summary["hosts"][host]["gate"]["decode_tps"] > 0
        assert run["after"][host] == run["before"][host]


def test_nightly_run_puts_drift_back_and_reports_it():
    run = step("nightly_drift")
    assert run["rc"] == 0, run["output"][-3000:]
    summary = json.loads(run["stdout"])
    drifted = summary["hosts"]["molecule-fleet-2"]
    changed = " ".join(drifted["changed_tasks"])
    assert "Render the systemd unit" in changed
    assert "Install exactly the locked packages" in changed
    assert drifted["restarts"] == 1
    assert unit_sha(run["after"], "molecule-fleet-2") == unit_sha(run["before"], "molecule-fleet-2")
    assert started(run["after"], "molecule-fleet-2") != started(run["before"], "molecule-fleet-2")
    for host in (HOSTS[0], HOSTS[2]):
        assert summary["hosts"][host]["changed_tasks"] == [] and summary["hosts"][host]["restarts"] == 0
        assert run["after"][host] == run["before"][host]


def test_every_host_serves_the_good_change(host):
    unit = host.file("/etc/systemd/system/inference-server.service").content_string
    assert 'Environment="FLEET_CHANGE=good"' in unit
    assert "no_such_attention" not in unit
    assert host.service("inference-server").is_running
