"""The host's own probes follow the configured bind (issue 44, item 4): the unit's readiness probe
(ExecStartPost), the watchdog's configuration and the gate's default URL ask a server bound to a specific
address there, one bound to a wildcard on its own family's loopback, IPv6 in brackets. Before, all three
asked 127.0.0.1 whatever inference_server_host said: a server bound to another address never became
ready, and root's probe (with the API key) went to whoever held 127.0.0.1 on that port. The roles' real
templates and defaults, rendered by ansible-playbook; the one derivation, deploytools.probe_url, directly.

Behind the API front (issue 51, item 1: a network bind is the front's, the engine listens on loopback at
inference_server_engine_port), the same probes ask the engine where it listens; the tests of the bind above
turn the front off (inference_server_front: false), those of FRONTED keep its default.
"""

from __future__ import annotations

import json

import pytest
from deploytools.probe_url import engine_url, probe_host, probe_url
from test_drain import REPO, directives, localhost_play, render_unit, template_run

# (inference_server_host, the base URL the host's probes must use)
BINDS = [
    ("127.0.0.1", "http://127.0.0.1:30000"),
    ("0.0.0.0", "http://127.0.0.1:30000"),
    ("::", "http://[::1]:30000"),
    ("::1", "http://[::1]:30000"),
    ("10.0.4.17", "http://10.0.4.17:30000"),
    ("fd00::5", "http://[fd00::5]:30000"),
    ("localhost", "http://localhost:30000"),
]
# (inference_server_host, the engine's URL behind the front, port 30000 and its default engine port)
FRONTED = [
    ("127.0.0.1", "http://127.0.0.1:30000"),  # loopback: no front
    ("0.0.0.0", "http://127.0.0.1:30001"),
    ("::", "http://[::1]:30001"),
    ("10.0.4.17", "http://127.0.0.1:30001"),
    ("fd00::5", "http://[::1]:30001"),
]
NO_FRONT = {"inference_server_front": False}


@pytest.mark.parametrize("bind, url", FRONTED)
def test_behind_the_front_the_engine_listens_on_loopback_at_its_own_port(bind, url):
    assert engine_url(bind, 30000) == url
    assert engine_url(bind, 30000, "false") == probe_url(bind, 30000)
    assert engine_url(bind, 30000, True, 31000) == url.replace("30001", "31000")


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_derivation_follows_the_bind(bind, url):
    assert probe_url(bind, 30000) == url
    # An IPv6 bind written in brackets is the same address.
    assert probe_url(f"[{bind}]" if ":" in bind else bind, "30000") == url


def test_the_host_is_given_without_brackets_and_in_one_spelling():
    assert [probe_host(b) for b in ("0.0.0.0", "::", "::0", "[fd00::5]", "", None)] == [
        "127.0.0.1",
        "::1",
        "::1",
        "fd00::5",
        "127.0.0.1",
        "127.0.0.1",
    ]


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_units_readiness_probe_asks_where_the_server_listens(tmp_path, bind, url):
    unit = render_unit(tmp_path, inference_server_host=bind, inference_server_port=30000, **NO_FRONT)
    probe = directives(unit, "ExecStartPost")
    quoted = f'"{url}/health"' if "[" in url else f"{url}/health"
    assert probe == [f"/usr/local/lib/inference-server/wait-ready {quoted}"], probe


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_watchdog_asks_where_the_server_listens(tmp_path, bind, url):
    proc = template_run(
        tmp_path, template="watchdog.json.j2", inference_server_host=bind, inference_server_port=30000, **NO_FRONT
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    config = json.loads((tmp_path / "unit").read_text())
    assert (config["health_url"], config["chat_url"]) == (f"{url}/health", f"{url}/v1/chat/completions")


@pytest.mark.parametrize("bind, url", FRONTED[1:3])
def test_behind_the_front_the_unit_the_watchdog_and_the_gate_ask_the_engine(tmp_path, bind, url):
    unit = render_unit(tmp_path, inference_server_host=bind, inference_server_port=30000)
    quoted = f'"{url}/health"' if "[" in url else f"{url}/health"
    assert directives(unit, "ExecStartPost") == [f"/usr/local/lib/inference-server/wait-ready {quoted}"]
    # The port guard frees and guards the engine's port; the front's unit has the public one.
    assert directives(unit, "ExecStartPre") == ["+/usr/local/lib/inference-server/port-guard 30001 inference-server"]
    proc = template_run(tmp_path, template="watchdog.json.j2", inference_server_host=bind, inference_server_port=30000)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert json.loads((tmp_path / "unit").read_text())["health_url"] == f"{url}/health"
    assert gate_url(tmp_path, inference_server_host=bind, inference_server_port=30000) == url


def gate_url(tmp_path, name: str = "health_gate_url", **variables) -> str:
    """``name`` (health_gate_url) as the gate's defaults derive it from the inventory's variables."""
    task = {"name": "Show", "ansible.builtin.debug": {"msg": f"{{{{ {name} }}}}"}}
    defaults = REPO / "roles" / "health_gate" / "defaults" / "main.yml"
    proc = localhost_play(tmp_path, task, variables, [defaults], json_out=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout[proc.stdout.index("{") :])["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result["msg"].strip()


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_gates_default_url_asks_where_the_server_listens(tmp_path, bind, url):
    assert gate_url(tmp_path, inference_server_host=bind, inference_server_port=30000, **NO_FRONT) == url


def test_the_gate_without_the_servers_variables_asks_the_default_port_on_loopback(tmp_path):
    """playbooks/gate.yml on a host whose inventory sets neither: the role's own defaults."""
    assert gate_url(tmp_path) == "http://127.0.0.1:30000"


@pytest.mark.parametrize("bind, url", FRONTED)
def test_the_gate_asks_the_front_where_one_stands_and_names_its_account(tmp_path, bind, url):
    """health_gate_public_url: the front's bind seen from the host (filter front_url), '' without a front,
    and the listener that may hold it, the CA and the server name of its certificate only then."""
    variables = {"inference_server_host": bind, "inference_server_port": 30000}
    fronted = not url.endswith(":30000")
    # TLS on the front by default (inference_server_tls): https, verified with the CA the role installed.
    public = probe_url(bind, 30000, "https") if fronted else ""
    assert gate_url(tmp_path, "health_gate_public_url", **variables) == public
    assert gate_url(tmp_path, "health_gate_public_url", **variables, **NO_FRONT) == ""
    plain = gate_url(tmp_path, "health_gate_public_url", **variables, inference_server_tls=False)
    assert plain == (probe_url(bind, 30000) if fronted else "")
    expected_user = "inference-front" if public else ""
    assert gate_url(tmp_path, "health_gate_public_listener_user", **variables) == expected_user
    ca_file = "/etc/inference-server-front/tls/ca.pem" if fronted else ""
    assert gate_url(tmp_path, "health_gate_ca_file", **variables) == ca_file
    assert gate_url(tmp_path, "health_gate_tls_server_name", **variables) == ("localhost" if fronted else "")
