"""The gateway role's logic: smg's launcher, the worker module and the drain wait.

Unit tests need nothing; the integration tests run the real programs on 127.0.0.1: smg
1.13.0 from the gateway's lock (``make gateway-venv``: ``.cache/venvs/smg``) started through
the role's launcher with its key in the environment, in front of the real rehearsal engine
(``transformers serve`` of ``make tools-venv`` on the tiny model of ``make model``). They
prove that smg registers ``transformers serve`` (runtime ``generic``, model id and alias
given), routes the alias to it, stops routing to a removed worker while its streams run to
their end, and that the drain wait sees those streams through their connections; with TLS
(``gateway_tls``), that the worker module verifies the gateway before it sends the key.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils import smg_api
from role_files import import_file
from tls_certs import CA

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "gateway"
CACHE = Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))
SMG_PYTHON = CACHE / "venvs" / "smg" / "bin" / "python"
TRANSFORMERS = CACHE / "venvs" / "transformers-cpu" / "bin" / "transformers"
MODEL = CACHE / "models" / "tiny-qwen3.5"
KEY = "test-control-plane-key-0123456789"


smg_worker = import_file(ROLE / "library" / "smg_worker.py")
inflight_wait = import_file(ROLE / "library" / "inflight_wait.py")
launcher = import_file(ROLE / "files" / "smg-launch.py", "smg_launch")


def free_port() -> int:
    """A TCP port nothing listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------
# Unit tests
# --------------------------------------------------------------------------------------


def test_launcher_moves_the_key_from_the_environment_into_smg_argv_only_in_process():
    environ = {"SMG_CONTROL_PLANE_API_KEY": KEY, "PATH": "/bin"}
    argv = launcher.router_argv(["--port", "30000"], environ)
    assert argv == ["--port", "30000", "--control-plane-api-keys", f"llm-deploy:llm-deploy:admin:{KEY}"]
    assert "SMG_CONTROL_PLANE_API_KEY" not in environ


def test_launcher_refuses_no_key_and_a_key_on_the_command_line():
    with pytest.raises(SystemExit, match="SMG_CONTROL_PLANE_API_KEY is empty"):
        launcher.router_argv([], {})
    with pytest.raises(SystemExit, match="not argv"):
        launcher.router_argv(["--control-plane-api-keys", "a:b:admin:c"], {"SMG_CONTROL_PLANE_API_KEY": KEY})


def test_key_file_is_read_and_its_absence_named(tmp_path):
    path = tmp_path / "control-plane.env"
    path.write_text(f"# comment\nSMG_CONTROL_PLANE_API_KEY={KEY}\n")
    assert smg_api.read_key(str(path)) == KEY
    path.write_text("OTHER=1\n")
    with pytest.raises(smg_api.GatewayError, match="has no SMG_CONTROL_PLANE_API_KEY= line"):
        smg_api.read_key(str(path))


def test_worker_spec_names_runtime_model_and_alias():
    spec = smg_api.worker_spec("http://h:8000/", "generic", "/srv/models/m/revisions/r1", ["m", ""])
    assert spec == {
        "url": "http://h:8000/",
        "runtime_type": "generic",
        "models": [{"id": "/srv/models/m/revisions/r1", "aliases": ["m"]}],
    }
    listed = {"runtime_type": "generic", "models": [{"id": "/srv/models/m/revisions/r1", "aliases": ["m"]}]}
    assert smg_api.matches(listed, spec)
    assert not smg_api.matches(dict(listed, models=[{"id": "/srv/models/m/revisions/r0", "aliases": ["m"]}]), spec)


def test_metrics_count_sums_sglang_running_and_queued_requests():
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 3.0',
            'sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1"} 1.0',
            'sglang:num_queue_reqs{model_name="m"} 2.0',
            'sglang:num_used_tokens{model_name="m"} 900.0',
        ]
    )
    assert inflight_wait.metrics_count(text, ["sglang:num_running_reqs", "sglang:num_queue_reqs"]) == 6
    assert inflight_wait.metrics_count("", ["sglang:num_running_reqs"]) == 0


def test_connections_count_sees_an_established_connection_until_it_closes():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert inflight_wait.connections_count(port) == 0
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    assert inflight_wait.connections_count(port) == 1
    client.close()
    accepted.close()
    server.close()
    assert inflight_wait.connections_count(port) == 0


# --------------------------------------------------------------------------------------
# Integration: real smg in front of the real rehearsal engine, on 127.0.0.1
# --------------------------------------------------------------------------------------

needs_programs = pytest.mark.skipif(
    not (SMG_PYTHON.exists() and TRANSFORMERS.exists() and (MODEL / "config.json").exists()),
    reason="needs make gateway-venv, make tools-venv and make model",
)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, context: ssl.SSLContext | None = None) -> None:
    """Wait until ``url`` answers 200 while ``proc`` lives (over TLS verified by ``context``, when given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args[:2]} exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[str]:
    """``transformers serve`` of the tiny model on 127.0.0.1, pinned to its path."""
    port = free_port()
    home = tmp_path_factory.mktemp("hf")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(home), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [str(TRANSFORMERS), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(MODEL)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 180, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def start_gateway(state: Path, *args: str, context: ssl.SSLContext | None = None) -> Iterator[SimpleNamespace]:
    """smg 1.13.0 started through the role's launcher with ``args``, its key only in the environment;
    over https (``--tls-cert-path``) when ``context`` is given, which verifies it."""
    port, metrics = free_port(), free_port()
    key_file = state / "control-plane.env"
    key_file.write_text(f"SMG_CONTROL_PLANE_API_KEY={KEY}\n")
    log = state / "smg.log"
    env = dict(os.environ, SMG_CONTROL_PLANE_API_KEY=KEY)
    launch = [str(SMG_PYTHON), str(ROLE / "files" / "smg-launch.py"), "--host", "127.0.0.1", "--port", str(port)]
    launch += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), "--policy", "round_robin"]
    launch += ["--health-check-interval-secs", "5", *args]
    with log.open("w") as out:
        proc = subprocess.Popen(launch, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/liveness", 60, proc, context)
        yield SimpleNamespace(url=url, key_file=str(key_file), log=log, proc=proc)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """smg on 127.0.0.1 over plain HTTP (a loopback gateway_host)."""
    yield from start_gateway(tmp_path_factory.mktemp("gw"))


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """smg with TLS as the role starts it on a network gateway_host (--tls-cert-path, --tls-key-path), its
    certificate for 127.0.0.1 from a test CA (``ca``: that CA's PEM file)."""
    state = tmp_path_factory.mktemp("gw-tls")
    files = CA("gateway test CA").issue("127.0.0.1", "localhost").write(state / "tls")
    context = ssl.create_default_context(cafile=str(files["ca"]))
    tls = ["--tls-cert-path", str(files["cert"]), "--tls-key-path", str(files["key"])]
    for gateway in start_gateway(state, *tls, context=context):
        yield SimpleNamespace(**vars(gateway), ca=str(files["ca"]))


def module_params(gateway: SimpleNamespace, url: str, **kw) -> SimpleNamespace:
    """A stand-in for AnsibleModule carrying smg_worker's parameters."""
    params = {
        "gateway_url": gateway.url,
        "ca_file": "",
        "key_file": gateway.key_file,
        "url": url,
        "state": "present",
        "runtime_type": "generic",
        "model_id": str(MODEL),
        "model_aliases": ["tiny-qwen3.5"],
        "timeout_s": 60.0,
        "interval_s": 0.5,
    }
    params.update(kw)
    return SimpleNamespace(params=params, check_mode=False)


def stream(url: str, max_tokens: int) -> dict:
    """One streaming chat completion of the alias through ``url``: chunks and whether it finished."""
    body = json.dumps(
        {
            "model": "tiny-qwen3.5",
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
        }
    ).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    chunks, finished = 0, False
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                finished = True
            elif line.startswith("data:"):
                event = json.loads(line[5:])
                chunks += 1
                finished = finished or any(c.get("finish_reason") for c in event.get("choices", []))
    return {"chunks": chunks, "finished": finished}


@needs_programs
def test_control_plane_refuses_a_caller_without_the_key(gateway):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(gateway.url + "/workers", timeout=5)
    assert refused.value.code == 401
    with pytest.raises(smg_api.GatewayError, match="refused the control-plane key"):
        smg_api.Gateway(gateway.url, "wrong-key").workers()


@needs_programs
def test_the_worker_module_reaches_a_tls_gateway_only_through_its_ca(tls_gateway, engine):
    """smg serves TLS with the role's flags; the module verifies it with the CA file (ca_file) and registers
    a worker; a gateway whose certificate another CA signed, or the system's CAs, never get the key."""
    result = smg_worker.run(module_params(tls_gateway, engine, ca_file=tls_gateway.ca))
    assert result["changed"] and smg_api.routable(result["worker"])
    other = tls_gateway.log.parent / "other-ca.pem"
    other.write_text(CA("another CA").pem)
    for ca_file in (str(other), ""):
        with pytest.raises(smg_api.GatewayError, match="CERTIFICATE_VERIFY_FAILED"):
            smg_api.Gateway(tls_gateway.url, KEY, ca_file=ca_file).workers()
    # Plain HTTP on the TLS port gets no HTTP answer from smg (a TLS alert).
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(tls_gateway.url.replace("https:", "http:") + "/liveness", timeout=5)
    assert KEY not in tls_gateway.log.read_text()


@needs_programs
def test_smg_registers_transformers_serve_and_routes_the_alias_to_it(gateway, engine):
    result = smg_worker.run(module_params(gateway, engine))
    assert result["changed"] and smg_api.routable(result["worker"])
    assert result["worker"]["runtime_type"] == "generic"
    assert stream(gateway.url, 8)["finished"]
    again = smg_worker.run(module_params(gateway, engine))
    assert not again["changed"]
    assert KEY not in gateway.log.read_text()


@needs_programs
def test_removed_worker_gets_no_new_request_and_its_streams_end_whole(gateway, engine):
    smg_worker.run(module_params(gateway, engine))
    results: list[dict] = []
    clients = [threading.Thread(target=lambda: results.append(stream(gateway.url, 400))) for _ in range(3)]
    for client in clients:
        client.start()
    port = int(engine.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while inflight_wait.connections_count(port) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    removed = smg_worker.run(module_params(gateway, engine, state="absent"))
    assert removed["changed"] and removed["worker"] is None
    # A new request finds no worker: the gateway no longer routes to the host.
    with pytest.raises(urllib.error.HTTPError):
        stream(gateway.url, 4)
    drained = inflight_wait.run(
        {
            "source": "connections",
            "port": port,
            "metrics_url": "",
            "metrics": [],
            "timeout_s": 120.0,
            "interval_s": 0.5,
            "settle": 2,
        }
    )
    for client in clients:
        client.join(120)
    assert not drained["timed_out"], drained
    assert len(results) == 3 and all(r["finished"] for r in results), results
    back = smg_worker.run(module_params(gateway, engine))
    assert back["changed"] and smg_api.routable(back["worker"])
    assert stream(gateway.url, 4)["finished"]
