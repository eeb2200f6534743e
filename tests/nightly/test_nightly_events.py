"""nightly-deploy's reading of the event stream, the drop check, history, pruning, the lock.

The roles' reports (the gate, the restarts) come from the run's set_stats data in the
``playbook_on_stats`` event, as test_nightly_role_stats.py proves with the real roles; the
changed and failed tasks from event streams built the way ansible-runner writes them, and from
two recorded runs (tests/nightly/fixtures/events, see its README).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_nightly_support import load_tool

nd = load_tool()


def ok_event(
    host: str, task: str, action: str, res: dict[str, Any], role: str = "", uuid: str = "", kind: str = "runner_on_ok"
) -> dict[str, Any]:
    """A job event shaped like ansible-runner's (only the fields the summary reads, plus a few)."""
    data: dict[str, Any] = {
        "host": host,
        "task": task,
        "task_action": action,
        "resolved_action": action,
        "task_uuid": uuid or f"uuid-{task}-{action}",
        "res": res,
        "playbook": "deploy.yml",
        "play": "Deploy the LLM inference server",
    }
    if role:
        data["role"] = role
    return {"event": kind, "event_data": data, "counter": 1}


def stats_event(reported: dict[str, Any] | None = None, **counters: dict[str, int]) -> dict[str, Any]:
    """A ``playbook_on_stats`` event; ``reported``: the roles' set_stats data (``artifact_data.llm_deploy``)."""
    data: dict[str, Any] = {
        k: {} for k in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
    }
    data.update(counters)
    data["artifact_data"] = {nd.events.STATS_KEY: reported} if reported is not None else {}
    return {"event": "playbook_on_stats", "event_data": data}


def gate_stats(tps: Any = 52.4, passed: Any = True, **changes: Any) -> dict[str, Any]:
    """A host's gate entry as roles/health_gate/tasks/gate.yml reports it."""
    entry = {
        "passed": passed,
        "summary": "gate PASS: 52.4 tok/s decode (min 40), TTFT p95 0.41 s (max 3), 8 requests\nsecond line",
        "report_path": "/var/lib/inference-server-deploy/gate/20261130T020000Z.json",
        "timestamp": "2026-11-30T02:00:00Z",
        "figures": {"decode_tps_mean": tps, "ttft_p95_s": 0.41, "accept_length": 2.31, "requests": 8},
        "unit": {"InvocationID": "inv-2", "ExecMainStartTimestamp": "Mon 2026-11-30 01:58:00 UTC"},
    }
    entry.update(changes)
    return entry


# --- What the roles reported through set_stats ------------------------------------------------


def test_the_gate_entry_gives_the_figure_and_the_unit():
    hosts = nd.events.summarize_events([stats_event({"ct129": {"gate": gate_stats()}}, processed={"ct129": 1})])
    gate = hosts["ct129"].gate
    assert (gate.decode_tps, gate.ttft_p95_s, gate.accept_length, gate.passed) == (52.4, 0.41, 2.31, True)
    assert gate.summary == "gate PASS: 52.4 tok/s decode (min 40), TTFT p95 0.41 s (max 3), 8 requests"
    assert gate.report_path.endswith("20261130T020000Z.json") and gate.timestamp == "2026-11-30T02:00:00Z"
    assert (gate.unit_invocation_id, gate.unit_started) == ("inv-2", "Mon 2026-11-30 01:58:00 UTC")
    assert gate.source == "set_stats llm_deploy"


@pytest.mark.parametrize(
    "entry, tps, passed",
    [
        (gate_stats(tps="48.5"), 48.5, True),  # a number as a string
        (gate_stats(tps=True), None, True),  # a bool is no figure
        (gate_stats(tps=float("nan")), None, True),
        (gate_stats(figures=None, passed=False), None, False),  # the gate failed before measuring
        (gate_stats(passed="False"), 52.4, False),
        ({"summary": "gate: no result"}, None, None),
    ],
)
def test_the_gate_entry_is_read_tolerantly(entry, tps, passed):
    gate = nd.events.summarize_events([stats_event({"h": {"gate": entry}})])["h"].gate
    assert gate.decode_tps == (pytest.approx(tps) if tps is not None else None) and gate.passed is passed


def test_no_gate_entry_no_figure():
    for reported in (None, {}, {"h": {}}, {"h": {"gate": None}}, {"h": "junk"}):
        hosts = nd.events.summarize_events([stats_event(reported, processed={"h": 1})])
        assert hosts["h"].gate is None, reported


def test_restarts_are_the_new_starts_the_role_reported():
    reported = {
        # the deploy's restart, then a rollback's
        "ct129": {"restarts": {"inv-2": "inv-1", "inv-3": "inv-2"}, "gate": gate_stats()},
        "ct130": {"gate": gate_stats()},
    }
    hosts = nd.events.summarize_events([stats_event(reported, processed={"ct129": 1, "ct130": 1})])
    assert hosts["ct129"].restarts == 2 and hosts["ct129"].restart_invocations == ["inv-2", "inv-3"]
    assert hosts["ct130"].restarts == 0


def test_task_names_and_modules_mark_nothing():
    """A task named like a restart, or a service module restarting something, is no restart of the server."""
    events = [
        ok_event("h", "Restart inference server", "ansible.builtin.command", {"changed": True}),
        ok_event(
            "h",
            "Restart the server on its last-known-good state",
            "ansible.builtin.systemd_service",
            {"changed": True, "invocation": {"module_args": {"state": "restarted"}}},
        ),
        ok_event("h", "Run the health gate", "health_gate", {"report": {"aggregate": {"decode_tps_mean": 9}}}),
        stats_event({}, changed={"h": 2}, processed={"h": 1}),
    ]
    host = nd.events.summarize_events(events)["h"]
    assert host.restarts == 0 and host.gate is None
    assert host.changed_tasks == ["Restart inference server", "Restart the server on its last-known-good state"]


# --- Changed and failed tasks, counts ------------------------------------------------------------


def test_changed_tasks_and_the_recap_counts():
    events: list[dict[str, Any]] = [
        ok_event("ct129", "Render the unit", "ansible.builtin.template", {"changed": True}, role="inference_server"),
        ok_event("ct129", "Read the state", "ansible.builtin.command", {"changed": False}),
        ok_event("ct130", "Render the unit", "ansible.builtin.template", {"changed": False}),
        stats_event(
            {},
            ok={"ct129": 9, "ct130": 9},
            changed={"ct129": 4, "ct130": 0},
            processed={"ct129": 1, "ct130": 1},
        ),
    ]
    hosts = nd.events.summarize_events(events)
    assert hosts["ct129"].changed_tasks == ["inference_server : Render the unit"]
    assert hosts["ct129"].changed == 4 and hosts["ct129"].ok == 9  # the recap's, not the events'
    assert hosts["ct130"].changed_tasks == [] and hosts["ct130"].changed == 0


def test_failures_unreachable_and_rescue():
    events = [
        ok_event("a", "Gate", "health_gate", {"msg": "boom"}, kind="runner_on_failed"),
        ok_event(
            "a",
            "Roll back",
            "ansible.builtin.fail",
            {"msg": "Deploy step 'Gate' failed on a.\nmore"},
            kind="runner_on_failed",
        ),
        ok_event(
            "b",
            "Gathering Facts",
            "ansible.builtin.gather_facts",
            {"msg": "ssh: connect refused"},
            kind="runner_on_unreachable",
        ),
        ok_event("c", "Gate", "health_gate", {"msg": "boom"}, kind="runner_on_failed"),
        stats_event(failures={"a": 1}, dark={"b": 1}, rescued={"c": 1}, processed={"a": 1, "b": 1, "c": 1}),
    ]
    hosts = nd.events.summarize_events(events)
    assert not hosts["a"].healthy and hosts["a"].failed_tasks[-1]["msg"] == "Deploy step 'Gate' failed on a."
    assert not hosts["b"].healthy and hosts["b"].unreachable == 1
    assert hosts["c"].healthy and hosts["c"].rescued == 1


def test_without_stats_the_events_are_counted():
    events = [
        ok_event("a", "x", "ansible.builtin.copy", {"changed": True}),
        ok_event("a", "y", "ansible.builtin.fail", {"msg": "no"}, kind="runner_on_failed"),
    ]
    hosts = nd.events.summarize_events(events)
    assert hosts["a"].changed == 1 and hosts["a"].failed == 1 and hosts["a"].gate is None


# --- Drop check and history ------------------------------------------------------------


@pytest.mark.parametrize(
    "current, previous, max_drop, verdict",
    [
        (40.0, 50.0, 20, "ok"),  # exactly 20 % below: allowed
        (39.9, 50.0, 20, "regression"),  # 20.2 % below
        (45.0, 50.0, 5, "regression"),
        (60.0, 50.0, 20, "ok"),  # faster is fine
        (50.0, None, 20, "no-baseline"),
        (None, 50.0, 20, "no-figure"),
        (49.0, 50.0, 0, "regression"),  # 0 % allows no drop at all
    ],
)
def test_check_drop(current, previous, max_drop, verdict):
    assert nd.state.check_drop(current, previous, max_drop)[0] == verdict


def test_drop_percent_value():
    assert nd.state.check_drop(39.0, 50.0, 20) == ("regression", 22.0)
    assert nd.state.check_drop(55.0, 50.0, 20) == ("ok", -10.0)


def test_history_baseline_skips_rejected_figures(tmp_path):
    history = nd.state.load_history(tmp_path / "missing.json")
    nd.state.record_history(history, "h", {"run_id": "r1", "decode_tps": 50.0, "baseline": True})
    nd.state.record_history(history, "h", {"run_id": "r2", "decode_tps": 30.0, "baseline": False})
    assert nd.state.last_entry(history, "h", baseline_only=True)["run_id"] == "r1"
    assert nd.state.last_entry(history, "h", baseline_only=False)["run_id"] == "r2"
    assert nd.state.last_entry(history, "other", baseline_only=True) is None
    for i in range(nd.state.HISTORY_KEEP + 5):
        nd.state.record_history(history, "h", {"run_id": f"n{i}", "decode_tps": 1.0, "baseline": True})
    assert len(history["hosts"]["h"]) == nd.state.HISTORY_KEEP
    assert history["hosts"]["h"][-1]["run_id"] == f"n{nd.state.HISTORY_KEEP + 4}"


def test_unreadable_history_starts_empty(tmp_path):
    path = tmp_path / "history.json"
    path.write_text("{not json")
    assert nd.state.load_history(path) == {"schema": nd.state.HISTORY_SCHEMA, "hosts": {}}


# --- Pruning -----------------------------------------------------------------------------


def test_prune_removes_old_run_dirs_only(tmp_path):
    now = dt.datetime(2026, 11, 30, 2, 0, 0, tzinfo=dt.timezone.utc)
    old = ["20261101T020000Z", "20261115T015959Z", "20261110T020000Z-2"]
    young = ["20261116T020001Z", "20261129T020000Z", "20261130T020000Z"]
    for name in old + young:
        (tmp_path / name / "artifacts").mkdir(parents=True)
    (tmp_path / "20261101T020000Z" / "artifacts" / "stdout").write_text("x")
    others = ["history.json", "latest.json", "nightly.lock", "20261001T020000Z.json"]
    for name in others:
        (tmp_path / name).write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "20261001T020000").mkdir()  # no Z: not a run name
    target = tmp_path.parent / (tmp_path.name + "-elsewhere")
    target.mkdir()
    os.symlink(target, tmp_path / "20261002T020000Z")  # a link named like a run: never followed
    removed, errors = nd.state.prune_runs(tmp_path, 14, now, keep=["20261130T020000Z"])
    assert sorted(removed) == sorted(old)
    assert errors == []
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(young + others + ["notes", "20261001T020000", "20261002T020000Z"])
    assert target.is_dir()


def test_prune_keeps_the_current_run_and_zero_disables(tmp_path):
    now = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)
    (tmp_path / "20200101T000000Z").mkdir()
    assert nd.state.prune_runs(tmp_path, 0, now) == ([], [])
    assert nd.state.prune_runs(tmp_path, 1, now, keep=["20200101T000000Z"]) == ([], [])
    assert nd.state.prune_runs(tmp_path, 1, now) == (["20200101T000000Z"], [])


def test_new_run_dir_never_reuses_a_name(tmp_path):
    moment = dt.datetime(2026, 11, 30, 2, 0, 0, tzinfo=dt.timezone.utc)
    names = [nd.state.new_run_dir(tmp_path, moment).name for _ in range(3)]
    assert names == ["20261130T020000Z", "20261130T020000Z-2", "20261130T020000Z-3"]
    assert all(nd.state.run_time(n) == moment for n in names)
    assert oct((tmp_path / names[0]).stat().st_mode & 0o777) == "0o700"


# --- Lock, redaction, extra vars -----------------------------------------------------------


def test_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / "sub" / "nightly.lock"
    first, second = nd.state.RunLock(path), nd.state.RunLock(path)
    assert first.acquire()
    assert not second.acquire()
    assert f"pid={os.getpid()}" in second.holder()
    first.release()
    assert second.acquire()
    second.release()


def test_command_file_values_are_redacted(tmp_path):
    path = tmp_path / "command"
    path.write_text(
        json.dumps(
            {
                "command": ["ansible-playbook"],
                "cwd": "/r",
                "env": {
                    "PATH": "/usr/bin",
                    "HF_TOKEN": "hf_secret",
                    "ANSIBLE_CONFIG": "/r/ansible.cfg",
                    "ANSIBLE_VAULT_PASSWORD": "pw",
                    "AWS_SECRET_ACCESS_KEY": "k",
                    "DEPLOY_CACHE_DIR": "/c",
                },
            }
        )
    )
    nd.state.redact_command_file(path)
    env = json.loads(path.read_text())["env"]
    assert env["PATH"] == "/usr/bin" and env["ANSIBLE_CONFIG"] == "/r/ansible.cfg"
    assert env["DEPLOY_CACHE_DIR"] == "/c"
    assert env["HF_TOKEN"] == env["ANSIBLE_VAULT_PASSWORD"] == env["AWS_SECRET_ACCESS_KEY"] == nd.state.REDACTED
    assert "hf_secret" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_extra_vars_go_to_ansible_playbook_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = nd.cli.extra_vars_cmdline(["x=1", '{"y": 2}', "@vars.yml", "@/abs/v.yml"])
    assert args == ["-e", "x=1", "-e", '{"y": 2}', "-e", "@{}".format(tmp_path / "vars.yml"), "-e", "@/abs/v.yml"]


def test_gate_text():
    def host(tps):
        summary = nd.events.HostSummary()
        summary.gate = nd.events.GateFigure(decode_tps=tps) if tps is not None else None
        return summary

    assert nd.cli.gate_text({"ct129": host(52.14)}) == "52.1 tok/s"
    assert nd.cli.gate_text({"b": host(50.0), "a": host(None)}) == "a:n/a,b:50.0 tok/s"
    assert nd.cli.gate_text({"a": host(None)}) == "n/a"
    assert nd.cli.gate_text({}) == "n/a"


# --- Recorded runs of the real deploy.yml against a rehearsal host ------------------------


def recorded_run(name: str) -> list[dict[str, Any]]:
    """The events of a recorded deploy run (see tests/nightly/fixtures/events/README.md)."""
    return json.loads((Path(__file__).parent / "fixtures" / "events" / name).read_text())


def test_a_censored_loop_counts_as_changed_when_a_visible_item_changed():
    """A loop with one no_log item ends censored whole (ansible-runner keeps no `changed`)."""
    censored = {"censored": "the output has been hidden due to the fact that 'no_log: true' was specified"}
    task = "Write the unit and its inputs (the secret ones without log or diff)"

    def run(plain_changed: bool) -> list[dict[str, Any]]:
        item = {"changed": plain_changed, "dest": "/etc/systemd/system/inference-server.service"}
        action, role = "ansible.builtin.template", "inference_server"
        return [
            ok_event("h", task, action, item, role=role, kind="runner_item_on_ok"),
            ok_event("h", task, action, censored, role=role, kind="runner_item_on_ok"),
            ok_event("h", task, action, censored, role=role),
        ]

    assert nd.events.summarize_events(run(True))["h"].changed_tasks == [f"inference_server : {task}"]
    assert nd.events.summarize_events(run(False))["h"].changed_tasks == []
    other = ok_event("h", "Another task", "ansible.builtin.copy", censored, uuid="uuid-other")
    assert nd.events.summarize_events([*run(True)[:2], other])["h"].changed_tasks == []


def test_recorded_noop_deploy_has_no_change():
    hosts = nd.events.summarize_events(recorded_run("sim_noop_run.json"))
    sim = hosts["nr-sim"]
    assert sim.changed == 0 and sim.changed_tasks == []
    assert sim.ok > 20 and sim.healthy


def test_recorded_drift_deploy_names_the_repair():
    events = recorded_run("sim_drift_run.json")
    sim = nd.events.summarize_events(events)["nr-sim"]
    assert sim.changed_tasks == [
        "inference_server : Render the systemd unit",
        "inference_server : Restart inference server",
    ]
    stats = [e for e in events if e["event"] == "playbook_on_stats"][0]["event_data"]
    assert sim.changed == stats["changed"]["nr-sim"] == 2
    # Recorded before the roles reported through set_stats: the handler's name counts for nothing.
    assert sim.restarts == 0 and sim.gate is None
