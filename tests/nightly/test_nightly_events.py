"""nightly-deploy's reading of the event stream, the drop check, history, pruning, the lock.

The gate figures come from job events recorded from the real health_gate module
(tests/nightly/fixtures/events, see its README); restarts and changed tasks from event
streams built the way ansible-runner writes them.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_nightly_support import load_tool, recorded_event

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


def fact_event(host: str, value: Any) -> dict[str, Any]:
    """The set_fact result of the inference_server role's "Note whether this run restarts the server"."""
    return ok_event(
        host,
        "Note whether this run restarts the server",
        "ansible.builtin.set_fact",
        {"changed": False, "ansible_facts": {"inference_server_restarted": value}},
        role="inference_server",
    )


def stats_event(**counters: dict[str, int]) -> dict[str, Any]:
    """A ``playbook_on_stats`` event."""
    data = {k: {} for k in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")}
    data.update(counters)
    return {"event": "playbook_on_stats", "event_data": data}


# --- Gate figures from recorded events ------------------------------------------------


def test_gate_figure_from_the_recorded_passing_gate():
    event = recorded_event("health_gate_pass.json")
    hosts = nd.events.summarize_events([event])
    gate = hosts["ct129"].gate
    report = event["event_data"]["res"]["report"]
    assert gate.decode_tps == pytest.approx(report["aggregate"]["decode_tps_mean"])
    assert 52 < gate.decode_tps < 53
    assert gate.passed is True
    assert gate.ttft_p95_s == pytest.approx(report["aggregate"]["ttft_p95_s"])
    assert gate.accept_length == pytest.approx(2.31)
    assert gate.unit_invocation_id == report["unit"]["InvocationID"]
    assert gate.unit_started == report["unit"]["ExecMainStartTimestamp"]
    assert gate.report_path.startswith("/var/lib/inference-server/gate/")
    assert gate.summary.startswith("gate PASS")
    # The gate changes nothing: the summary must not count it as a changed task.
    assert hosts["ct129"].changed_tasks == []


def test_gate_figure_from_the_recorded_failing_gate():
    hosts = nd.events.summarize_events([recorded_event("health_gate_fail.json")])
    gate = hosts["ct129"].gate
    assert gate.passed is False
    assert 22 < gate.decode_tps < 23
    assert "below min_decode_tps" in gate.summary


def test_async_ok_and_ok_of_the_same_task_count_once():
    """ansible-runner emits runner_on_async_ok and runner_on_ok for the async gate task."""
    event = recorded_event("health_gate_pass.json")
    async_event = copy.deepcopy(event)
    async_event["event"] = "runner_on_async_ok"
    async_event["event_data"]["res"]["report"]["aggregate"]["decode_tps_mean"] = 1.0
    hosts = nd.events.summarize_events([async_event, event])
    assert hosts["ct129"].gate.decode_tps > 50  # runner_on_ok wins
    only_async = nd.events.summarize_events([async_event])
    assert only_async["ct129"].gate.decode_tps == 1.0  # used when no runner_on_ok came


def test_set_fact_of_the_report_is_the_fallback():
    event = recorded_event("health_gate_set_fact.json")
    hosts = nd.events.summarize_events([event])
    assert hosts["ct129"].gate.decode_tps == pytest.approx(
        event["event_data"]["res"]["ansible_facts"]["health_gate_report"]["aggregate"]["decode_tps_mean"]
    )
    assert hosts["ct129"].gate.source == "fact health_gate_report"


def test_module_result_wins_over_the_fact():
    gate_event = recorded_event("health_gate_pass.json")
    fact_event = recorded_event("health_gate_set_fact.json")
    fact_event["event_data"]["res"]["ansible_facts"]["health_gate_report"]["aggregate"]["decode_tps_mean"] = 7.0
    hosts = nd.events.summarize_events([gate_event, fact_event])
    assert hosts["ct129"].gate.decode_tps > 50
    assert hosts["ct129"].gate.source == "health_gate result"


def test_the_key_path_constant_drives_the_extraction(monkeypatch):
    event = recorded_event("health_gate_pass.json")
    event["event_data"]["res"]["report"]["aggregate"]["tokens_per_second_p50"] = 33.3
    monkeypatch.setattr(nd.events, "GATE_TPS_KEY_PATHS", (("report", "aggregate", "tokens_per_second_p50"),))
    assert nd.events.summarize_events([event])["ct129"].gate.decode_tps == 33.3


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r["report"]["aggregate"].update(decode_tps_mean="48.5"), 48.5),  # number as a string
        (
            lambda r: (
                r["report"]["aggregate"].pop("decode_tps_mean")
                and None
                or r["report"]["aggregate"].update(decode_tps=47.0)
            ),
            47.0,
        ),  # a later path
        (lambda r: r["report"].update(aggregate=None), None),  # gate failed before measuring
        (lambda r: r["report"]["aggregate"].update(decode_tps_mean=True), None),  # a bool is no figure
        (lambda r: r["report"]["aggregate"].update(decode_tps_mean=float("nan")), None),
        (lambda r: r.update(report="not a dict", decode_tps=45.0), 45.0),
    ],
)
def test_extraction_is_tolerant(mutate, expected):
    event = recorded_event("health_gate_pass.json")
    mutate(event["event_data"]["res"])
    gate = nd.events.summarize_events([event])["ct129"].gate
    assert gate is not None
    assert gate.decode_tps == (pytest.approx(expected) if expected is not None else None)


def test_a_result_without_any_gate_data_gives_no_figure():
    event = ok_event("ct129", "Run the health gate on the host", "health_gate", {"changed": False, "msg": "skipped"})
    assert nd.events.summarize_events([event])["ct129"].gate is None


def test_a_failed_gate_task_still_reports_its_figure():
    event = recorded_event("health_gate_fail.json")
    event["event"] = "runner_on_failed"
    hosts = nd.events.summarize_events([event, stats_event(failures={"ct129": 1}, processed={"ct129": 1})])
    assert hosts["ct129"].gate.decode_tps == pytest.approx(22.296)
    assert hosts["ct129"].failed == 1
    assert hosts["ct129"].failed_tasks[0]["task"] == "health_gate : Run the health gate on the host"


# --- Changed tasks and restarts --------------------------------------------------------


def test_restarts_changed_tasks_and_stats():
    events: list[dict[str, Any]] = [
        ok_event("ct129", "Render the unit", "ansible.builtin.template", {"changed": True}, role="inference_server"),
        # The role's fact says this run restarts the server; its handler's result shows the same restart.
        fact_event("ct129", True),
        ok_event(
            "ct129",
            "Restart inference server",
            "ansible.builtin.systemd_service",
            {"changed": True, "invocation": {"module_args": {"state": "restarted"}}},
            role="inference_server",
        ),
        # Rollback: a restart by a service module with state=restarted, under another name.
        ok_event(
            "ct129",
            "Restart the server on its last-known-good state",
            "ansible.builtin.systemd_service",
            {"changed": True, "invocation": {"module_args": {"state": "restarted", "name": "x"}}},
        ),
        # A start is not a restart.
        ok_event(
            "ct129",
            "Enable the unit and make sure it runs",
            "ansible.builtin.systemd_service",
            {"changed": True, "invocation": {"module_args": {"state": "started"}}},
        ),
        # Unchanged results count for nothing, even under the handler's name; nor does a false fact.
        fact_event("ct130", "False"),
        ok_event("ct130", "Restart inference server", "ansible.builtin.systemd_service", {"changed": False}),
        ok_event("ct130", "Render the unit", "ansible.builtin.template", {"changed": False}),
        # no_log hides the handler's arguments; the role's fact still counts the restart.
        fact_event("ct131", True),
        ok_event(
            "ct131",
            "Restart inference server",
            "ansible.builtin.systemd_service",
            {"changed": True, "censored": "the output has been hidden"},
        ),
        stats_event(
            ok={"ct129": 9, "ct130": 9, "ct131": 9},
            changed={"ct129": 4, "ct130": 0, "ct131": 1},
            processed={"ct129": 1, "ct130": 1, "ct131": 1},
        ),
    ]
    hosts = nd.events.summarize_events(events)
    assert hosts["ct129"].restarts == 2
    assert hosts["ct129"].restart_tasks == [
        "inference_server : Restart inference server",
        "Restart the server on its last-known-good state",
    ]
    assert hosts["ct129"].start_tasks == ["Enable the unit and make sure it runs"]
    assert hosts["ct129"].changed_tasks[0] == "inference_server : Render the unit"
    assert len(hosts["ct129"].changed_tasks) == 4
    assert hosts["ct129"].changed == 4 and hosts["ct129"].ok == 9
    assert hosts["ct130"].restarts == 0 and hosts["ct130"].changed_tasks == []
    assert hosts["ct131"].restarts == 1
    assert hosts["ct131"].restart_tasks == ["inference_server : Note whether this run restarts the server"]


def test_restarts_come_from_the_roles_fact_not_task_names():
    """A task's name marks nothing; the role's fact inference_server_restarted does."""
    named = [ok_event("h", "Restart inference server", "ansible.builtin.command", {"changed": True})]
    assert nd.events.summarize_events(named)["h"].restarts == 0
    for value, restarts in ((True, 1), ("True", 1), ("yes", 1), (False, 0), ("False", 0)):
        assert nd.events.summarize_events([fact_event("h", value)])["h"].restarts == restarts, value


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
    assert hosts["a"].changed == 1 and hosts["a"].failed == 1


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
    task = "Keep a copy of the unit and its inputs that passed the gate"

    def run(plain_changed: bool) -> list[dict[str, Any]]:
        item = {"changed": plain_changed, "dest": "/var/lib/x/unit.service"}
        return [
            ok_event("h", task, "ansible.builtin.copy", item, role="inference_server", kind="runner_item_on_ok"),
            ok_event("h", task, "ansible.builtin.copy", censored, role="inference_server", kind="runner_item_on_ok"),
            ok_event("h", task, "ansible.builtin.copy", censored, role="inference_server"),
        ]

    assert nd.events.summarize_events(run(True))["h"].changed_tasks == [f"inference_server : {task}"]
    assert nd.events.summarize_events(run(False))["h"].changed_tasks == []
    other = ok_event("h", "Another task", "ansible.builtin.copy", censored, uuid="uuid-other")
    assert nd.events.summarize_events([*run(True)[:2], other])["h"].changed_tasks == []


def test_recorded_noop_deploy_has_no_change_and_no_restart():
    hosts = nd.events.summarize_events(recorded_run("sim_noop_run.json"))
    sim = hosts["nr-sim"]
    assert sim.changed == 0 and sim.changed_tasks == []
    assert sim.restarts == 0 and sim.start_tasks == []
    assert sim.ok > 20 and sim.healthy
    # The handler is in the stream of the drift run only: the no-op run never ran it.
    assert not any(e["event_data"].get("task") == "Restart inference server" for e in recorded_run("sim_noop_run.json"))


def test_recorded_drift_deploy_reports_the_repair_and_one_restart():
    events = recorded_run("sim_drift_run.json")
    sim = nd.events.summarize_events(events)["nr-sim"]
    assert sim.changed_tasks == [
        "inference_server : Render the systemd unit",
        "inference_server : Restart inference server",
    ]
    assert sim.restart_tasks == ["inference_server : Restart inference server"]
    stats = [e for e in events if e["event"] == "playbook_on_stats"][0]["event_data"]
    assert sim.changed == stats["changed"]["nr-sim"] == 2
    # The real handler is a systemd_service call with state=restarted (this recording predates
    # the role's fact inference_server_restarted; with it, the fact and the handler are one restart).
    handler = [e for e in events if e["event_data"].get("task") == "Restart inference server"][0]["event_data"]
    assert nd.events.action_name(handler) in nd.events.SERVICE_ACTIONS
    assert handler["res"]["invocation"]["module_args"]["state"] == "restarted"
    assert sim.restarts == 1
    assert nd.events.summarize_events([*events, fact_event("nr-sim", True)])["nr-sim"].restarts == 1
