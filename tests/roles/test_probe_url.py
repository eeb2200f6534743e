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
from test_drain import REPO, directives, localhost_values, rendered, template_run

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


# Everything the tests below read from the roles, rendered or evaluated in three ansible-playbook runs per
# module instead of one per value: the unit and the watchdog's configuration for each bind (without the front,
# and behind it for FRONTED), and the gate's derived URLs.
UNIT, WATCHDOG = "inference-server.service.j2", "watchdog.json.j2"
GATE_DEFAULTS = [REPO / "roles" / "health_gate" / "defaults" / "main.yml"]
GATE_QUERIES = ("health_gate_public_url", "health_gate_public_listener_user", "health_gate_ca_file",
                "health_gate_tls_server_name")  # fmt: skip


def bind_variables(bind: str, **more) -> dict:
    """The server's bind as the inventory gives it, on port 30000."""
    return {"inference_server_host": bind, "inference_server_port": 30000, **more}


def variants() -> list[tuple[str, dict]]:
    """(key, variables) of every render: each bind without the front, and each fronted bind."""
    return [(f"plain {bind}", bind_variables(bind, **NO_FRONT)) for bind, _ in BINDS] + [
        (f"fronted {bind}", bind_variables(bind)) for bind, _ in FRONTED
    ]


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[tuple[str, str], str]:
    """(template, key) -> the text the role's template renders for that variant."""
    keys, variables = zip(*variants(), strict=True)
    out = {}
    for template in (UNIT, WATCHDOG):
        texts = rendered(tmp_path_factory.mktemp("render"), list(variables), template=template)
        out.update({(template, key): text for key, text in zip(keys, texts, strict=True)})
    return out


@pytest.fixture(scope="module")
def gate_values(tmp_path_factory) -> dict[tuple[str, str], str]:
    """(variable, case) -> the gate's default of ``variable`` for that case's inventory variables."""
    cases = {"no server variables": {}, **dict(variants())}
    cases.update({f"plain-http {bind}": bind_variables(bind, inference_server_tls=False) for bind, _ in FRONTED})
    queries = [(name, case) for name in ("health_gate_url", *GATE_QUERIES) for case in cases]
    values = localhost_values(tmp_path_factory.mktemp("gate"), [(name, cases[case]) for name, case in queries],
                              GATE_DEFAULTS)  # fmt: skip
    return {query: value.strip() for query, value in zip(queries, values, strict=True)}


def test_the_batch_render_is_the_template_modules_render(tmp_path, renders):
    """What these tests read (the template lookup, many renders in one run) is what the role's template
    task writes: the unit and the watchdog's configuration of a fronted IPv6 bind and a plain IPv4 one."""
    compared = [
        (UNIT, "fronted ::", bind_variables("::")),
        (WATCHDOG, "plain 10.0.4.17", bind_variables("10.0.4.17", **NO_FRONT)),
    ]
    for template, key, variables in compared:
        proc = template_run(tmp_path, template=template, **variables)
        assert proc.returncode == 0, proc.stdout[-2000:]
        assert renders[(template, key)] == (tmp_path / "unit").read_text()


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_units_readiness_probe_asks_where_the_server_listens(renders, bind, url):
    probe = directives(renders[(UNIT, f"plain {bind}")], "ExecStartPost")
    quoted = f'"{url}/health"' if "[" in url else f"{url}/health"
    assert probe == [f"/usr/local/lib/inference-server/wait-ready {quoted}"], probe


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_watchdog_asks_where_the_server_listens(renders, bind, url):
    config = json.loads(renders[(WATCHDOG, f"plain {bind}")])
    assert (config["health_url"], config["chat_url"]) == (f"{url}/health", f"{url}/v1/chat/completions")


@pytest.mark.parametrize("bind, url", FRONTED[1:3])
def test_behind_the_front_the_unit_the_watchdog_and_the_gate_ask_the_engine(renders, gate_values, bind, url):
    unit = renders[(UNIT, f"fronted {bind}")]
    quoted = f'"{url}/health"' if "[" in url else f"{url}/health"
    assert directives(unit, "ExecStartPost") == [f"/usr/local/lib/inference-server/wait-ready {quoted}"]
    # The port guard frees and guards the engine's port; the front's unit has the public one.
    assert directives(unit, "ExecStartPre") == ["+/usr/local/lib/inference-server/port-guard 30001 inference-server"]
    assert json.loads(renders[(WATCHDOG, f"fronted {bind}")])["health_url"] == f"{url}/health"
    assert gate_values[("health_gate_url", f"fronted {bind}")] == url


@pytest.mark.parametrize("bind, url", BINDS)
def test_the_gates_default_url_asks_where_the_server_listens(gate_values, bind, url):
    assert gate_values[("health_gate_url", f"plain {bind}")] == url


def test_the_gate_without_the_servers_variables_asks_the_default_port_on_loopback(gate_values):
    """playbooks/gate.yml on a host whose inventory sets neither: the role's own defaults."""
    assert gate_values[("health_gate_url", "no server variables")] == "http://127.0.0.1:30000"


@pytest.mark.parametrize("bind, url", FRONTED)
def test_the_gate_asks_the_front_where_one_stands_and_names_its_account(gate_values, bind, url):
    """health_gate_public_url: the front's bind seen from the host (filter front_url), '' without a front,
    and the listener that may hold it, the CA and the server name of its certificate only then."""
    fronted = not url.endswith(":30000")
    # TLS on the front by default (inference_server_tls): https, verified with the CA the role installed.
    public = probe_url(bind, 30000, "https") if fronted else ""
    assert gate_values[("health_gate_public_url", f"fronted {bind}")] == public
    assert gate_values[("health_gate_public_url", f"plain {bind}")] == ""
    plain = gate_values[("health_gate_public_url", f"plain-http {bind}")]
    assert plain == (probe_url(bind, 30000) if fronted else "")
    expected_user = "inference-front" if public else ""
    assert gate_values[("health_gate_public_listener_user", f"fronted {bind}")] == expected_user
    ca_file = "/etc/inference-server-front/tls/ca.pem" if fronted else ""
    assert gate_values[("health_gate_ca_file", f"fronted {bind}")] == ca_file
    assert gate_values[("health_gate_tls_server_name", f"fronted {bind}")] == ("localhost" if fronted else "")
