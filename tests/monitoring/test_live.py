"""A real Prometheus scrapes a real gateway and node_exporter; an alert fires and resolves.

On 127.0.0.1: ``transformers serve`` of the tiny rehearsal model (``make tools-venv model``) as
the worker of smg 1.13.0 (``make gateway-venv``, started through roles/gateway's launcher),
Debian's node_exporter 1.5 reading a textfile directory where the real filter wrote a gate
report and a rollback, serving TLS as roles/monitoring configures it (``--web.config.file``, a test
CA's certificate), and Debian's Prometheus 2.42 (both from tools/fetch-prometheus) with
roles/monitoring's rules, scraping both every second, node_exporter over verified TLS. The
worker is stopped: the measured time until LLMGatewayWorkerUnhealthy is pending, then firing,
is printed; it is started again: the time until it resolves. The rules are the role's own, with
that alert's ``for:`` shortened from 2m to 5s so the test takes seconds (the expression is
untouched). About 40-60 s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible_collections.llm_deploy.inference.plugins.module_utils import smg_api
from monitoring_support import CACHE, REPO, RULES
from role_files import import_file
from tls_certs import CA

GATEWAY_ROLE = REPO / "roles" / "gateway"

textfile = import_file(REPO / "filter_plugins" / "prometheus_textfile.py")
SMG_PYTHON = CACHE / "venvs" / "smg" / "bin" / "python"
TRANSFORMERS = CACHE / "venvs" / "transformers-cpu" / "bin" / "transformers"
MODEL = CACHE / "models" / "tiny-qwen3.5"
KEY = "live-test-control-plane-key-0123456789"
ALERT = "LLMGatewayWorkerUnhealthy"

needs_programs = pytest.mark.skipif(
    not (SMG_PYTHON.exists() and TRANSFORMERS.exists() and MODEL.exists()),
    reason="needs make gateway-venv tools-venv model",
)


def free_port() -> int:
    """A TCP port nothing listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binary(name: str) -> str:
    """A program of Debian's packages, fetched by tools/fetch-prometheus."""
    proc = subprocess.run(
        [str(REPO / "tools" / "fetch-prometheus"), "--bin", name],
        capture_output=True,
        text=True,
        env=dict(os.environ, DEPLOY_CACHE_DIR=str(CACHE)),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def wait_until(what: str, check: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> object:
    """Poll ``check`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def http_ok(url: str) -> bool:
    """True when ``url`` answers 200."""
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def start_engine(port: int, home: Path) -> subprocess.Popen:
    """``transformers serve`` of the tiny model on 127.0.0.1:``port``, answering /health."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(home), HF_HUB_OFFLINE="1")
    argv = [str(TRANSFORMERS), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(MODEL)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until("transformers serve answering /health", lambda: http_ok(f"http://127.0.0.1:{port}/health"), 180)
    return proc


def write_textfiles(directory: Path) -> None:
    """The gate's figures and a rollback, as the health gate and the rollback write them."""
    report = {"decode_tps": 6.7, "ttft_p50_s": 0.2, "ttft_p95_s": 0.3, "passed": True, "timestamp": time.time()}
    (directory / "llm_gate.prom").write_text(
        textfile.prometheus_textfile(report | {"min_decode_tps": 1}, {"host": "sim"})
    )
    (directory / "llm_rollback.prom").write_text(textfile.prometheus_rollback_textfile(time.time(), {"host": "sim"}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """Engine, smg, node_exporter and Prometheus, all on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("live")
    procs: list[subprocess.Popen] = []
    ns = SimpleNamespace(engine_port=free_port(), home=tmp / "hf", procs=procs)
    ns.home.mkdir()
    gw, gw_metrics, node, prom = free_port(), free_port(), free_port(), free_port()
    textfiles = tmp / "textfile"
    textfiles.mkdir()
    write_textfiles(textfiles)
    # node_exporter's TLS as the role writes it: a certificate for the host's name, its web configuration.
    tls = CA("monitoring test CA").issue("sim", "127.0.0.1").write(tmp / "tls")
    web = {"tls_server_config": {"cert_file": str(tls["cert"]), "key_file": str(tls["key"]), "min_version": "TLS12"}}
    (tmp / "web.yml").write_text(yaml.safe_dump(web))
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == ALERT:
                rule["for"] = "5s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "smg-gw",
                "static_configs": [{"targets": [f"127.0.0.1:{gw_metrics}"], "labels": {"job": "smg", "host": "gw"}}],
            },
            {
                "job_name": "node-sim",
                "honor_labels": True,
                "scheme": "https",
                "tls_config": {"ca_file": str(tls["ca"]), "server_name": "sim"},
                "static_configs": [{"targets": [f"127.0.0.1:{node}"], "labels": {"job": "node", "host": "sim"}}],
            },
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    try:
        ns.engine = start_engine(ns.engine_port, ns.home)
        smg_argv = [str(SMG_PYTHON), str(GATEWAY_ROLE / "files" / "smg-launch.py"), "--host", "127.0.0.1"]
        smg_argv += ["--port", str(gw), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(gw_metrics)]
        smg_argv += ["--policy", "round_robin", "--health-check-interval-secs", "1"]
        smg_env = dict(os.environ, SMG_CONTROL_PLANE_API_KEY=KEY)
        procs.append(subprocess.Popen(smg_argv, env=smg_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        node_argv = [binary("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{node}"]
        node_argv += [f"--web.config.file={tmp / 'web.yml'}"]
        node_argv += [
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
        ]
        procs.append(subprocess.Popen(node_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        prom_argv = [
            binary("prometheus"),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
        ]
        prom_argv += [f"--web.listen-address=127.0.0.1:{prom}"]
        procs.append(subprocess.Popen(prom_argv, stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w")))
        wait_until("smg answering /liveness", lambda: http_ok(f"http://127.0.0.1:{gw}/liveness"), 60)
        smg_api.Gateway(f"http://127.0.0.1:{gw}", KEY).add(
            smg_api.worker_spec(f"http://127.0.0.1:{ns.engine_port}", "generic", str(MODEL), ["tiny-qwen3.5"])
        )
        ns.prom, ns.node = f"http://127.0.0.1:{prom}", node
        wait_until("Prometheus ready", lambda: http_ok(ns.prom + "/-/ready"), 60)
        yield ns
    finally:
        for proc in [ns.__dict__.get("engine"), *procs]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)


def query(prom: str, expr: str) -> list[dict]:
    """The result of an instant query."""
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


def alert_state(prom: str) -> str | None:
    """pending, firing or None for the alert under test."""
    with urllib.request.urlopen(prom + "/api/v1/alerts", timeout=5) as response:
        alerts = json.load(response)["data"]["alerts"]
    states = [a["state"] for a in alerts if a["labels"]["alertname"] == ALERT]
    return "firing" if "firing" in states else (states[0] if states else None)


@needs_programs
def test_gate_and_rollback_series_arrive_through_node_exporter(stack):
    passed = wait_until("llm_gate_passed scraped", lambda: query(stack.prom, 'llm_gate_passed{job="node"}'), 30)
    assert passed[0]["metric"]["host"] == "sim" and passed[0]["value"][1] == "1"
    assert query(stack.prom, "llm_gate_min_decode_tokens_per_second")[0]["value"][1] == "1"
    firing = wait_until(
        "LLMRollback firing", lambda: query(stack.prom, 'ALERTS{alertname="LLMRollback",alertstate="firing"}'), 30
    )
    assert firing[0]["metric"]["host"] == "sim"


@needs_programs
def test_node_exporter_answers_tls_only(stack):
    """The node target is up over TLS that Prometheus verified for the host's name; plain HTTP gets no metrics."""
    up = wait_until("the node target up", lambda: query(stack.prom, 'up{job="node"} == 1'), 30)
    assert up[0]["metric"]["host"] == "sim"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{stack.node}/metrics", timeout=5).read()


@needs_programs
def test_worker_stopped_alert_pends_fires_and_resolves(stack):
    wait_until("the worker healthy in Prometheus", lambda: query(stack.prom, "smg_worker_health == 1"), 60)
    assert alert_state(stack.prom) is None
    stack.engine.terminate()
    stack.engine.wait(30)
    stopped = time.monotonic()
    wait_until(f"{ALERT} pending", lambda: alert_state(stack.prom) in ("pending", "firing"), 60)
    pending = time.monotonic() - stopped
    wait_until(f"{ALERT} firing", lambda: alert_state(stack.prom) == "firing", 60)
    fired = time.monotonic() - stopped
    stack.engine = start_engine(stack.engine_port, stack.home)
    back = time.monotonic()
    wait_until(f"{ALERT} resolved", lambda: alert_state(stack.prom) is None, 90)
    resolved = time.monotonic() - back
    print(
        f"\n{ALERT} (for: 5s): pending {pending:.1f} s and firing {fired:.1f} s after the worker stopped; "
        f"resolved {resolved:.1f} s after it answered again"
    )
    # Pending to firing is the rule's for: 5s (evaluated every second).
    assert 4 <= fired - pending <= 15 and fired < 60 and resolved < 90
