"""The watchdog between deploys (files/watchdog.py), the unit's restart and boot directives.

The watchdog probes a REAL HTTP server here (a thread of this test: healthy, hung, or
refusing a wrong key); systemd is a small stand-in ``systemctl`` on PATH that keeps the unit's
state in a file and logs each call. The molecule scenario ``reliability`` runs the same program
against the real unit (tests/test_5_between_deploys.py: a SIGSTOPped server, a crash loop).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_drain import directives, render_unit

REPO = Path(__file__).resolve().parents[2]
WATCHDOG = REPO / "roles" / "inference_server" / "files" / "watchdog.py"
KEY = "sk-watchdog-test-not-a-secret"
# systemctl as the watchdog uses it: show (the unit's properties), reset-failed, restart, start.
FAKE_SYSTEMCTL = r"""#!/usr/bin/env python3
import json, os, sys, time
path = os.environ["FAKE_UNIT_STATE"]
state = json.load(open(path))
with open(path + ".calls", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
if sys.argv[1] == "show":
    for key in ("ActiveState", "InvocationID", "InactiveEnterTimestampMonotonic", "Result", "NRestarts"):
        print(f"{key}={state.get(key, '')}")
elif sys.argv[1] in ("restart", "start"):
    state.update(ActiveState=state.get("after_start", "active"), InvocationID=state["InvocationID"] + "x")
    json.dump(state, open(path, "w"))
"""


class Handler(BaseHTTPRequestHandler):
    """/health and a streamed /v1/chat/completions; ``server.mode`` is ok, hang or key."""

    def log_message(self, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """/health: 200 unless hung."""
        if self.server.mode == "hang":  # type: ignore[attr-defined]
            time.sleep(2)
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        """One streamed chunk and [DONE]; 401 without the right key in key mode."""
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.auth.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        if self.server.mode == "key" and self.headers.get("Authorization") != f"Bearer {KEY}":  # type: ignore[attr-defined]
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"delta": {"content": "OK"}}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def server():
    """A local HTTP server in a thread; set ``.mode``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.mode, httpd.auth = "ok", []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


@pytest.fixture
def host(tmp_path, server):
    """The watchdog's configuration, its stand-in systemd and a runner: ``host.run(*args, **env)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    (tmp_path / "api-key.yaml").write_text(f"# key\napi-key: {json.dumps(KEY)}\n")
    port = server.server_address[1]
    config = {
        "unit": "llm",
        "health_url": f"http://127.0.0.1:{port}/health",
        "chat_url": f"http://127.0.0.1:{port}/v1/chat/completions",
        "model": "/srv/models/m",
        "api_key_file": str(tmp_path / "api-key.yaml"),
        "deadline_s": 1,
        "failures": 2,
        "retry_failed_s": 120,
        "retry_failed_max_s": 1800,
        "stop_timeout_s": 1,
        "start_timeout_s": 1,
        "lock_path": str(tmp_path / "deploy.lock"),
        "lock_stale_after_s": 3600,
        "state_file": str(tmp_path / "deploy" / "watchdog.json"),
        "textfile": str(tmp_path / "textfile" / "llm_watchdog.prom"),
        "watchdog": True,
    }
    (tmp_path / "watchdog.json").write_text(json.dumps(config))
    unit = tmp_path / "unit.json"
    unit.write_text(json.dumps({"ActiveState": "active", "InvocationID": "a1", "InactiveEnterTimestampMonotonic": 0}))

    class Host:
        paths = config

        def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
            environ = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_UNIT_STATE=str(unit), **env)
            cmd = [sys.executable, str(WATCHDOG), *(args or ("probe",)), str(tmp_path / "watchdog.json")]
            return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=60)

        def metric(self, name: str) -> float:
            text = Path(config["textfile"]).read_text()
            return float(re.search(rf'^{name}{{unit="llm"}} (\S+)$', text, re.M).group(1))

        def calls(self) -> list[str]:
            log = Path(f"{unit}.calls")
            return [c for c in log.read_text().splitlines() if not c.startswith("show")] if log.exists() else []

        def set_unit(self, **values: Any) -> None:
            unit.write_text(json.dumps({**json.loads(unit.read_text()), **values}))

    return Host()


def test_a_healthy_server_is_probed_with_the_key_and_left_alone(host, server):
    run = host.run()
    assert run.returncode == 0 and "healthy" in run.stdout, run.stdout + run.stderr
    assert server.auth == [f"Bearer {KEY}"]
    assert KEY not in run.stdout + run.stderr
    assert host.calls() == []
    assert host.metric("llm_watchdog_probe_success") == 1
    assert 0 < host.metric("llm_watchdog_probe_latency_seconds") < 1
    assert abs(host.metric("llm_watchdog_last_probe_timestamp_seconds") - time.time()) < 30
    assert host.metric("llm_watchdog_restarts_total") == 0


def test_a_wrong_key_is_a_failed_probe_named_without_the_key(host, server):
    server.mode = "key"
    Path(host.paths["api_key_file"]).write_text('api-key: "sk-other"\n')
    run = host.run()
    assert "probe failed (1 of 2 in a row): HTTP 401 from /v1/chat/completions" in run.stdout, run.stdout
    assert "sk-other" not in run.stdout + run.stderr and host.metric("llm_watchdog_probe_success") == 0


def test_a_hung_server_is_restarted_after_the_failures_in_a_row(host, server):
    server.mode = "hang"
    first = host.run()
    assert "probe failed (1 of 2 in a row): no answer within 1 s" in first.stdout, first.stdout
    assert host.calls() == [] and host.metric("llm_watchdog_consecutive_failures") == 1
    second = host.run()
    assert "does not answer: restarting it" in second.stdout and "is active after" in second.stdout, second.stdout
    # The deploy's way: the start limit cleared, then a restart that does not block (the drain).
    assert host.calls() == ["reset-failed llm.service", "restart --no-block llm.service"]
    assert host.metric("llm_watchdog_restarts_total") == 1
    assert host.metric("llm_watchdog_consecutive_failures") == 0


def test_nothing_is_probed_while_a_deploy_holds_the_lock_or_the_unit_is_starting(host, server):
    server.mode = "hang"
    lock = Path(host.paths["lock_path"])
    host.run()
    before = host.metric("llm_watchdog_consecutive_failures")
    lock.write_text("{}")
    assert "skipped: a deploy holds" in host.run().stdout
    os.utime(lock, (time.time() - 7200, time.time() - 7200))  # older than lock_stale_after_s
    assert "probe failed (2 of 2 in a row)" in host.run().stdout
    assert before == 1 and host.calls() == ["reset-failed llm.service", "restart --no-block llm.service"]
    lock.unlink()
    host.set_unit(ActiveState="activating")
    assert "skipped: llm.service is activating" in host.run().stdout
    assert host.metric("llm_watchdog_consecutive_failures") == 0 and len(host.calls()) == 2


def test_a_unit_systemd_gave_up_on_is_started_again_with_a_back_off(host):
    now = time.monotonic()
    host.set_unit(ActiveState="failed", Result="start-limit-hit", InactiveEnterTimestampMonotonic=int(now * 1e6))
    run = host.run("gave-up")
    assert "systemd gave up (time 1)" in run.stdout and host.metric("llm_server_gave_up_total") == 1
    assert re.search(r"gave up \d+ s ago \(Result=start-limit-hit\); retry in 1\d\d s", host.run().stdout)
    assert host.calls() == []
    # Failed for longer than the first wait: started; it fails again (after_start), so the next wait doubles.
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 150) * 1e6), after_start="failed")
    assert "is failed after the retry" in host.run().stdout
    assert host.calls() == ["reset-failed llm.service", "start --no-block llm.service"]
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 150) * 1e6))
    assert re.search(r"retry in (8\d|9\d) s", host.run().stdout)  # 240 s wait, 150 s gone
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 250) * 1e6), after_start="active")
    assert "is active after the retry" in host.run().stdout
    assert host.metric("llm_watchdog_restarts_total") == 2


@pytest.mark.parametrize("engine, after", [("sglang", ["nvidia-persistenced.service"]), ("transformers", [])])
def test_the_unit_waits_for_its_mounts_and_the_gpu_daemon_and_records_a_give_up(tmp_path, engine, after):
    unit = render_unit(
        tmp_path,
        inference_server_engine=engine,
        ml_env_path="/opt/ml-env",
        ml_env_venv_dir="/opt/ml-env.d/0123456789ab",
    )
    assert directives(unit, "After") == [" ".join(["network-online.target", *after])]
    assert directives(unit, "Wants") == [" ".join(["network-online.target", *after])]
    assert directives(unit, "RequiresMountsFor") == [
        "/opt/ml-env /opt/ml-env.d/0123456789ab /srv/models/m/revisions/r1"
    ]
    assert directives(unit, "OnFailure") == ["inference-server-gave-up.service"]
    assert (directives(unit, "Restart"), directives(unit, "StartLimitBurst")) == (["on-failure"], ["3"])
    assert directives(unit, "StartLimitIntervalSec") == ["600"]
