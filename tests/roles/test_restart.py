"""The server's restart sequence, one program (issue 45, item 3): role llm_host's llm_host_lib/restart.py,
which inference_server's tasks/restart.yml runs through the llm_host module and the watchdog imports.

systemd is a stand-in ``systemctl`` on PATH that logs each call and, after a restart or start, shows the
states a real unit goes through: the old invocation deactivating (the drain), then the new one activating.
The role's restart runs through ansible-playbook on localhost; the watchdog's through the program as
tests/roles/test_serving_watch.py runs it (and, there, as installed beside the module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import restart
from role_files import run_role_tasks, task_results
from systemd_container import systemd_container

# `show` prints the current state; restart/start queue the states the unit then goes through (one per
# `show`, the last one stays); reset-failed clears a failed state; every call but `show` is logged.
FAKE_SYSTEMCTL = r"""#!%(python)s
import json, os, sys
path = os.environ["FAKE_UNIT_STATE"]
state = json.load(open(path))
if sys.argv[1] != "show":
    with open(path + ".calls", "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\n")
if sys.argv[1] == "show":
    if len(state["queue"]) > 1 and state["queue_started"]:
        state["queue"].pop(0)
    for key, value in state["queue"][0].items():
        print(f"{key}={value}")
elif sys.argv[1] in ("restart", "start"):
    state["queue"] = state["queue"][:1] + state["after_restart"]
    state["queue_started"] = True
elif sys.argv[1] == "stop":
    state["queue"][0] = dict(state["queue"][0], ActiveState="inactive", SubState="dead")
elif sys.argv[1] == "reset-failed" and state["queue"][0]["ActiveState"] == "failed":
    state["queue"][0] = dict(state["queue"][0], ActiveState="inactive")
json.dump(state, open(path, "w"))
"""
RUNNING = {"ActiveState": "active", "InvocationID": "old1"}
DRAINING = {"ActiveState": "deactivating", "InvocationID": "old1"}
STARTING = {"ActiveState": "activating", "InvocationID": "new2"}
SERVING = {"ActiveState": "active", "InvocationID": "new2"}


@pytest.fixture
def unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in systemd on PATH; ``unit(now, after_restart)`` sets the unit's states, ``.calls()`` reads the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL % {"python": sys.executable})
    (bin_dir / "systemctl").chmod(0o755)
    state = tmp_path / "unit.json"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_UNIT_STATE", str(state))

    class Unit:
        def __call__(self, now: dict[str, str], after_restart: list[dict[str, str]]) -> None:
            state.write_text(json.dumps({"queue": [now], "after_restart": after_restart, "queue_started": False}))

        def calls(self) -> list[str]:
            log = Path(f"{state}.calls")
            return log.read_text().splitlines() if log.exists() else []

    return Unit()


def test_the_deploys_restart_clears_the_start_limit_reloads_and_waits_out_the_drain(unit):
    unit(RUNNING, [DRAINING, DRAINING, STARTING, SERVING])
    done = restart.restart("llm", 5, clear_start_limit=True, daemon_reload=True, interval=0.01)
    assert unit.calls() == ["daemon-reload", "reset-failed llm.service", "restart --no-block llm.service"]
    # It returned at the first state of the new invocation, not before (the drain), not later (readiness is
    # the gate's to wait for).
    assert done == {
        "changed": True,
        "unit": "llm",
        "before": "old1",
        "after": "new2",
        "active_state": "activating",
        "started": True,
    }


def test_the_watchdogs_restart_of_a_hung_server_keeps_the_start_limit_and_waits_until_ready(unit):
    unit(RUNNING, [DRAINING, STARTING, STARTING, SERVING])
    done = restart.restart("llm", 5, ready_timeout_s=5, interval=0.01)
    assert unit.calls() == ["restart --no-block llm.service"]
    assert (done["after"], done["active_state"]) == ("new2", "active")


def test_a_start_the_start_limit_refuses_ends_the_wait(unit):
    failed = {"ActiveState": "failed", "InvocationID": "old1", "Result": "start-limit-hit"}
    unit({"ActiveState": "failed", "InvocationID": "old1"}, [failed])
    done = restart.restart("llm", 5, start=True, ready_timeout_s=5, interval=0.01)
    assert unit.calls() == ["start --no-block llm.service"]
    assert (done["started"], done["active_state"]) == (True, "failed")


def test_a_unit_that_waits_out_restartsec_is_stopped_before_the_deliberate_restart(unit):
    """A crash's pending restart and the deliberate one must not meet (systemd 252 merges them: NRestarts=1)."""
    crashed = {"ActiveState": "activating", "SubState": "auto-restart", "InvocationID": "old1"}
    unit(crashed, [STARTING, SERVING])
    done = restart.restart("llm", 5, clear_start_limit=True, daemon_reload=True, interval=0.01)
    assert unit.calls() == [
        "stop llm.service",
        "daemon-reload",
        "reset-failed llm.service",
        "restart --no-block llm.service",
    ]
    assert (done["before"], done["after"], done["started"]) == ("old1", "new2", True)


def test_a_restart_during_restartsec_is_deliberate_on_the_real_systemd(tmp_path):
    """systemd 252 (the base image): a unit killed and waiting out RestartSec, restarted as a rollback does
    (clear the start limit, reload): the new start is ours (a new invocation, NRestarts=0) and the crash's
    pending restart never comes (still that invocation, still 0, after RestartSec)."""
    lib = Path(restart.__file__).parent
    unit_text = "[Service]\nExecStart=/bin/sleep 1000\nExecStartPost=/bin/sleep 1\nRestart=on-failure\nRestartSec=3\n"
    with systemd_container("nr-restart", extra=("-v", f"{lib}:/opt/lib/llm_host_lib:ro")) as name:

        def sh(script: str) -> str:
            proc = subprocess.run(["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return proc.stdout

        def show() -> dict[str, str]:
            out = sh("systemctl show -p SubState,NRestarts,InvocationID crashy.service")
            return dict(line.split("=", 1) for line in out.splitlines())

        sh(f"printf '{unit_text}' > /etc/systemd/system/crashy.service && systemctl daemon-reload")
        sh("systemctl start crashy.service && kill -9 $(systemctl show -p MainPID --value crashy.service)")
        crashed = show()
        assert crashed["SubState"] == "auto-restart", crashed
        done = json.loads(
            sh(
                'python3 -c \'import json, sys; sys.path.insert(0, "/opt/lib"); from llm_host_lib import restart; '
                'print(json.dumps(restart.restart("crashy", 10, clear_start_limit=True, daemon_reload=True, '
                "ready_timeout_s=10, interval=0.2)))'"
            )
        )
        assert done["started"] and done["after"] not in ("", crashed["InvocationID"]), done
        time.sleep(4)
        assert show() == {"SubState": "running", "NRestarts": "0", "InvocationID": done["after"]}


def test_a_drain_that_never_ends_fails_with_one_sentence(unit, monkeypatch):
    unit(RUNNING, [DRAINING])
    monkeypatch.setattr(restart, "MARGIN_S", 0.0)
    done = restart.restart("llm", 0.2, interval=0.01)
    assert done["failed"] is True and done["started"] is False and done["active_state"] == "deactivating"
    assert done["msg"] == (
        "llm.service did not start again within 0 s of its restart (it is deactivating): the old server's drain "
        "outlasted TimeoutStopSec or the new start hangs before its first step; look at journalctl -u llm.service."
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["llm", "150"], {"unit": "llm", "stop_timeout_s": 150.0}),
        (
            ["llm", "150", "--start", "--clear-start-limit", "--ready", "1800"],
            {"unit": "llm", "stop_timeout_s": 150.0, "start": True, "clear_start_limit": True, "ready_timeout_s": 1800},
        ),
        (["llm"], None),
        (["llm", "soon"], None),
        (["llm", "150", "--now"], None),
        (["llm", "150", "--ready"], None),
    ],
)
def test_the_command_line(argv: list[str], expected: dict[str, Any] | None):
    assert restart.parse(argv) == expected


def role_restart(tmp_path: Path, task: str) -> list[tuple[str, dict[str, Any]]]:
    """inference_server's tasks/restart.yml on localhost, as service.yml and rollback.yml include it."""
    variables = {"inference_server_unit_name": "llm", "_inference_server_restart_task": task}
    run = run_role_tasks(tmp_path, variables, ["restart.yml"], check_mode=False, json_output=True)
    assert run.returncode in (0, 2), run.stdout[-3000:] + run.stderr[-3000:]
    return [(name.removeprefix("inference_server : "), result) for name, result in task_results(run)]


def test_the_roles_restart_is_the_program_and_reports_the_new_start_to_the_runs_stats(tmp_path, unit):
    unit(RUNNING, [DRAINING, STARTING])
    results = dict(role_restart(tmp_path, "Restart the server"))
    assert unit.calls() == ["daemon-reload", "reset-failed llm.service", "restart --no-block llm.service"]
    assert results["Restart the server"]["changed"] is True
    # The drain bound is the unit's TimeoutStopSec (the default drain, 120 s, plus 30 s).
    assert results["Restart the server"]["invocation"]["module_args"]["args"][:2] == ["llm", "150"]
    stats = results["Report the restart to the run's stats"]["ansible_stats"]
    assert stats["data"] == {"llm_deploy": {"localhost": {"restarts": {"new2": "old1"}}}}
