"""A local account that listens on the server's port gets no key and is not taken as the server (issue 51, item 5).

Between the unit's port guard and the engine's listen (minutes while SGLang loads), any local account can
bind the port. The squatter here is a real process of the account ``nobody`` (setpriv) that answers 200 to
everything and prints the Authorization header of every request it gets: the gate (llm_gate/listener.py,
``--listener-user``) must send it nothing and fail naming it, the unit's wait-ready must not call it ready,
and a listener of the expected account must still be talked to.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.errors import GateFailure
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.listener import ListenerGuard, make_guard
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.proc import accepting_uid, listening
from gate_fakes import CLI, free_port
from role_files import launcher_as_on_a_host

REPO = Path(__file__).resolve().parents[2]
WAIT_READY = REPO / "roles/inference_server/files/wait-ready.py"
# The system's python: the squatter runs as nobody, who may not reach the repository's venv.
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root, setpriv and /usr/bin/python3 to run the squatter as another account for real",
)

SQUATTER = """
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        print("request", self.path, "Authorization:", self.headers.get("Authorization"), flush=True)
        body = b'{"data": [{"id": "squatted"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@contextmanager
def squatter(port: int) -> Iterator[subprocess.Popen]:
    """A server of the account nobody on ``port`` that prints what it was sent (its stdout, once stopped)."""
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", SYSTEM_PYTHON, "-c", SQUATTER, str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    try:
        deadline = time.monotonic() + 20
        while not listening(port):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def received(proc: subprocess.Popen) -> str:
    """What the stopped squatter printed."""
    return proc.stdout.read() if proc.stdout else ""


def test_the_gate_sends_no_key_to_a_listener_of_another_account(tmp_path):
    port = free_port()
    key_file = tmp_path / "key"
    key_file.write_text("sk-the-api-key\n")
    with squatter(port) as proc:
        gate = subprocess.run(
            [sys.executable, str(CLI), "--url", f"http://127.0.0.1:{port}", "--listener-user", "root",
             "--api-key-file", str(key_file), "--correctness", "off", "--ready-timeout", "20",
             "--poll-interval", "0.2", "--requests", "1", "--warmup", "0", "--max-tokens", "4", "--json"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "HEALTH_GATE_API_KEY": ""},
        )  # fmt: skip
        # The squatter is still up: the gate refused at once, not after a timeout.
        assert proc.poll() is None
    got = received(proc)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    report = json.loads(gate.stdout)
    assert report["passed"] is False and report["listener_user"] == "root"
    assert f"port {port} of this host is held by nobody" in report["reasons"][0], report["reasons"]
    assert "sk-the-api-key" not in got and "Bearer" not in got, got


def test_the_gate_talks_to_a_listener_of_the_account_that_runs_the_server(fake_server, tmp_path):
    server = fake_server(api_key="sk-the-api-key")
    key_file = tmp_path / "key"
    key_file.write_text("sk-the-api-key\n")
    gate = subprocess.run(
        [sys.executable, str(CLI), "--url", server.url, "--listener-user", "root", "--api-key-file", str(key_file),
         "--correctness", "off", "--poll-interval", "0.2", "--requests", "2", "--warmup", "0", "--max-tokens", "8",
         "--min-decode-tps", "1", "--json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HEALTH_GATE_API_KEY": ""},
    )  # fmt: skip
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert json.loads(gate.stdout)["listener_user"] == "root"
    assert any(r["headers"].get("Authorization") == "Bearer sk-the-api-key" for r in server.requests)


def test_a_connection_accepted_by_another_account_is_refused_before_a_byte_is_sent():
    """The check after the connect: a squatter that binds between the listener check and the connect."""
    port = free_port()
    guard = ListenerGuard(port, "root", 0)
    with squatter(port) as proc:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            nobody = accepting_uid(port, conn.getsockname()[1])
            with pytest.raises(GateFailure, match=rf"accepted by nobody \(uid {nobody}\), not by root"):
                guard.verify(conn)
        with pytest.raises(GateFailure, match="held by nobody"):
            guard.check()
    assert nobody not in (None, 0)
    assert "request" not in received(proc)
    with socket.create_server(("127.0.0.1", port)) as own, socket.create_connection(("127.0.0.1", port)) as conn:
        assert accepting_uid(port, conn.getsockname()[1]) == 0  # before accept() too
        guard.check()
        guard.verify(conn)
        own.accept()[0].close()


def test_the_guard_is_for_this_host_only_and_for_an_account_that_exists():
    assert make_guard("127.0.0.1", 30000, "") is None
    assert make_guard("192.0.2.1", 30000, "root") is None  # TEST-NET-1: not this host
    assert isinstance(make_guard("localhost", 30000, "root"), ListenerGuard)
    with pytest.raises(ValueError, match="listener_user 'no-such-account' is not an account on this host"):
        make_guard("127.0.0.1", 30000, "no-such-account")


def test_wait_ready_takes_no_answer_of_another_account_as_ready():
    port = free_port()
    probe = launcher_as_on_a_host(WAIT_READY)
    with squatter(port):
        out = subprocess.run(
            [sys.executable, "-SE", str(probe), f"http://127.0.0.1:{port}/health", "0.1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"port {port} is held by nobody" in out.stderr and "ready after" not in out.stdout, out.stderr
