"""Shared helpers for the health gate tests: a scriptable OpenAI/SGLang-like HTTP server,
fake ``systemctl``/``journalctl`` executables, and paths. The ``test_gate_*`` modules of
tests/health_gate import it, and so do launch_plan/test_api_key.py and roles/test_drain.py
(pytest puts tests/shared on the path: pyproject.toml); the fake server's sanity check is
health_gate/test_gate_support.py.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The gate's package (the repository collection's, installed by make setup).
from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate  # noqa: F401
from fake_http import BackgroundServer, JSONHandler

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "health_gate"

CLI = REPO / "tools" / "health-gate"
# The environment of tools/health-gate under a host's python3, which has no venv: the collection that
# holds the gate's package on PYTHONPATH, as on a GPU host (docs/gpu.md).
HOST_PYTHON_ENV = {**os.environ, "PYTHONPATH": str(REPO / "collections")}
CONTROLLER_BIN = Path(os.environ.get("CONTROLLER_VENV_BIN", str(Path(sys.executable).parent)))


def free_port() -> int:
    """A TCP port nothing listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chunk(obj: Any) -> bytes:
    """One SSE event."""
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return (f"data: {data}\n\n").encode()


def content_chunk(text: str, finish: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A chat.completion.chunk carrying ``text``."""
    delta = {"content": text} if text else {}
    out: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


class FakeLLMServer(BackgroundServer):
    """A threaded HTTP server whose answers are set per test through ``scenario``.

    scenario keys: ``api_key`` (refuse all but /health and /metrics without this Bearer token,
    as SGLang does), ``health`` (status int or callable), ``models`` (ids), ``server_info``
    (dict or None for 404), ``generate_meta`` (dict), and ``chat`` with ``mode`` in
    ok/stall/drop/no_usage/http_error/stream_error, ``chunks``, ``tokens_per_chunk``,
    ``ttft``, ``gap``, ``done`` (send [DONE]), ``status``/``body`` for http_error,
    ``stall_after`` chunks for stall, ``eos_after`` chunks (a random model's early EOS: the stream
    stops there with finish_reason ``stop`` unless the request asks for a fixed length, as SGLang's
    ``ignore_eos`` or transformers serve's ``generation_config`` ``min_new_tokens`` do),
    ``silent_tokens`` and ``silent_s`` (tokens generated after the last content chunk that carry no text,
    as a small trained model's tokens past its answer under ``ignore_eos``: counted in usage, the finish
    chunk ``silent_s`` later).
    """

    def __init__(self, port: int = 0, **scenario: Any) -> None:
        self.scenario: dict[str, Any] = {
            "health": 200,
            "models": ["fake-model"],
            "server_info": None,
            "generate_meta": None,
            "chat": {"mode": "ok", "chunks": 11, "tokens_per_chunk": 1, "ttft": 0.05, "gap": 0.01, "done": True},
        }
        self.scenario.update(scenario)
        self.requests: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        server = self

        class Handler(JSONHandler):
            def _record(self, body: dict[str, Any] | None = None) -> None:
                server.requests.append(
                    {"path": self.path, "method": self.command, "headers": dict(self.headers), "body": body}
                )

            def _refused(self) -> bool:
                """With scenario ``api_key``, refuse (401) what SGLang protects: all but /health*, /metrics."""
                key = server.scenario.get("api_key")
                if not key or self.path.startswith(("/health", "/metrics")):
                    return False
                if self.headers.get("Authorization") == f"Bearer {key}":
                    return False
                self._json(401, {"error": "Unauthorized"})
                return True

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                self._record()
                sc = server.scenario
                if self._refused():
                    return
                if self.path == "/health":
                    status = sc["health"]() if callable(sc["health"]) else sc["health"]
                    self._json(status, {"status": "ok" if status == 200 else "warming"})
                elif self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": m} for m in sc["models"]]})
                elif self.path in ("/server_info", "/get_server_info") and sc["server_info"] is not None:
                    info = sc["server_info"]() if callable(sc["server_info"]) else sc["server_info"]
                    self._json(200, info)
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._record(body)
                sc = server.scenario
                if self._refused():
                    return
                if self.path == "/generate":
                    if sc["generate_meta"] is None:
                        self._json(404, {"detail": "Not Found"})
                    else:
                        self._json(200, {"text": "x", "meta_info": sc["generate_meta"]})
                    return
                if self.path != "/v1/chat/completions":
                    self._json(404, {"detail": "Not Found"})
                    return
                self._chat(sc["chat"], body)

            def _write_chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _chat(self, c: dict[str, Any], body: dict[str, Any]) -> None:
                mode = c.get("mode", "ok")
                if mode == "http_error":
                    self._answer(c.get("status", 500), (c.get("body") or "boom").encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._write_chunk(chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
                n, per = int(c.get("chunks", 11)), int(c.get("tokens_per_chunk", 1))
                fixed = body.get("ignore_eos") is True or "min_new_tokens" in str(body.get("generation_config"))
                finish = "length"
                if c.get("eos_after") and not fixed:
                    n, finish = min(n, int(c["eos_after"])), "stop"
                if server.stop_event.wait(c.get("ttft", 0.05)):
                    return
                for i in range(n):
                    if i:
                        if server.stop_event.wait(c.get("gap", 0.01)):
                            return
                    if mode == "stall" and i == c.get("stall_after", 2):
                        server.stop_event.wait(c.get("stall_s", 30))
                        return
                    if mode == "drop" and i == c.get("drop_after", 3):
                        self.wfile.write(b'40\r\ndata: {"choi')  # half a chunk, then hang up
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    if mode == "stream_error" and i == 2:
                        self._write_chunk(chunk({"error": {"message": "scheduler died", "code": 500}}))
                        break
                    self._write_chunk(chunk(content_chunk("tok " * per)))
                total = n * per + int(c.get("silent_tokens", 0))
                if c.get("silent_s") and server.stop_event.wait(c["silent_s"]):
                    return
                usage = {"prompt_tokens": 17, "completion_tokens": total, "total_tokens": 17 + total}
                self._write_chunk(chunk(content_chunk("", finish=finish)))
                if mode != "no_usage":
                    self._write_chunk(chunk({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
                if c.get("done", True):
                    self._write_chunk(chunk("[DONE]"))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        super().__init__(Handler, port)

    def close(self) -> None:
        """Stop serving and wake up sleeping handlers."""
        self.stop_event.set()
        super().close()

    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies and headers of the chat completions received."""
        return [r for r in self.requests if r["path"] == "/v1/chat/completions"]


FAKE_SYSTEMCTL = r'''#!%(python)s
"""Fake systemctl: `show` prints state.json of $FAKE_SYSTEMD as KEY=VALUE; `restart` and `start` make
next.json, when there is one, the state (the unit's new start)."""
import json, os, sys
root = os.environ["FAKE_SYSTEMD"]
with open(os.path.join(root, "calls.log"), "a") as log:
    log.write("systemctl " + " ".join(sys.argv[1:]) + "\n")
if sys.argv[1:2] in (["restart"], ["start"]) and os.path.exists(os.path.join(root, "next.json")):
    os.replace(os.path.join(root, "next.json"), os.path.join(root, "state.json"))
    sys.exit(0)
if sys.argv[1:2] != ["show"]:
    sys.exit(1)
with open(os.path.join(root, "state.json")) as f:
    state = json.load(f)
for key, value in state.items():
    print("%%s=%%s" %% (key, value))
'''

FAKE_JOURNALCTL = r'''#!%(python)s
"""Fake journalctl: prints journal-<invocation>.txt of $FAKE_SYSTEMD, honouring -n."""
import os, sys
root = os.environ["FAKE_SYSTEMD"]
args = sys.argv[1:]
with open(os.path.join(root, "calls.log"), "a") as log:
    log.write("journalctl " + " ".join(args) + "\n")
inv = [a.split("=", 1)[1] for a in args if a.startswith("_SYSTEMD_INVOCATION_ID=")]
path = os.path.join(root, "journal-%%s.txt" %% (inv[0] if inv else "unit"))
lines = open(path).read().splitlines() if os.path.exists(path) else []
if "-n" in args:
    n = int(args[args.index("-n") + 1])
    lines = lines[-n:]
sys.stdout.write("".join(line + "\n" for line in lines))
'''


class FakeSystemd:
    """Fake ``systemctl``/``journalctl`` on PATH, driven by files the test rewrites."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
            path = self.bin / name
            path.write_text(text % {"python": sys.executable})
            path.chmod(0o755)
        self.set_state()

    def set_state(self, **props: Any) -> None:
        """Replace the unit's properties (atomically, the watcher may be reading)."""
        self.write_state("state.json", **props)

    def set_next_state(self, **props: Any) -> None:
        """The unit's properties after the next ``systemctl restart`` or ``start`` (its new start)."""
        self.write_state("next.json", **props)

    def write_state(self, name: str, **props: Any) -> None:
        """Write the unit's properties (the defaults below, then ``props``) to ``name`` atomically."""
        state = {
            "LoadState": "loaded",
            "ActiveState": "active",
            "SubState": "running",
            "Result": "success",
            "NRestarts": 0,
            "InvocationID": "inv-one",
            "MainPID": 4242,
            "ExecMainPID": 4242,
            "ExecMainCode": 0,
            "ExecMainStatus": 0,
        }
        state.update(props)
        tmp = self.root / f"{name}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.root / name)

    def set_journal(self, invocation: str, lines: list[str]) -> None:
        """The journal of one invocation."""
        (self.root / (f"journal-{invocation}.txt")).write_text("".join(line + "\n" for line in lines))

    def calls(self) -> list[str]:
        """Command lines the fakes were called with."""
        path = self.root / "calls.log"
        return path.read_text().splitlines() if path.exists() else []


def later(seconds: float, fn, *args: Any, **kwargs: Any) -> threading.Timer:
    """Run ``fn(*args, **kwargs)`` in ``seconds`` (to change the world while the gate waits)."""
    timer = threading.Timer(seconds, fn, args, kwargs)
    timer.daemon = True
    timer.start()
    return timer


def base_options(url: str, **extra: Any) -> dict[str, Any]:
    """Small, fast gate options for tests."""
    opts: dict[str, Any] = {
        "url": url,
        "ready_timeout_s": 10,
        "poll_interval_s": 0.2,
        "health_timeout_s": 2,
        "request_timeout_s": 5,
        "warmup_requests": 1,
        "requests": 3,
        "concurrency": 1,
        "max_tokens": 16,
    }
    opts.update(extra)
    return opts


def timed(fn, *args: Any, **kwargs: Any):
    """(result, seconds)."""
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start
