"""From other containers: who reaches the gateway's ports, with and without its API key.

exposure-gw runs smg-gateway.service as the gateway role renders it (gateway_host and
gateway_prometheus_host 0.0.0.0, gateway_api_key set, gateway_allowed_sources the address of
exposure-allowed). exposure-outside is in no list; exposure-worker is the gateway's worker.
The clients are plain containers on the scenario's network; their requests run there with
``docker exec`` (curl). The 200 with the key is smg's own POST /v1/conversations: the worker
serves nothing, and the check is the key, not a model (a chat completion without the key gets
the same 401). The API is TLS (gateway_tls): the clients verify it with the CA the gateway role
wrote beside its certificate, copied into them (as an operator hands clients the deploy's CA).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

# molecule/shared/verify_steps.py: the helpers of the scenarios' verifiers.
from verify_steps import run_offline

REPO = Path(__file__).resolve().parents[3]
UNIT = "smg-gateway"
GW = "exposure-gw"
KEY = "exposure-client-key-not-a-secret-0001"  # converge.yml's gateway_api_key
CONTROL_KEY = "exposure-control-plane-key-0001"  # converge.yml's gateway_control_plane_api_key
API = f"https://{GW}:30000"
TLS = f"/etc/{UNIT}-tls"
CLIENT_CA = "/tmp/gateway-ca.pem"  # the gateway's CA in each client container (fixture clients_trust_the_ca)
METRICS = f"http://{GW}:29000/metrics"
# systemd-analyze security's overall exposure of the gateway's unit (0 best, 10 worst; 1.0-4.9 is "OK") must
# stay at or below this. Measured 1.2 (systemd 252, Debian 12 container, 2026-12-02); before the sandbox of
# issue 26 it measured 7.5 "EXPOSED".
MAX_EXPOSURE = 2.0
CHAT = {"model": "tiny-qwen3.5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def curl(container: str, url: str, *args: str) -> tuple[int, str]:
    """curl's exit status and the HTTP status it got (000 without an answer) from ``container``."""
    proc = subprocess.run(
        ["docker", "exec", container, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", CLIENT_CA,
         # HTTP/1.1 as OpenAI's clients (httpx) speak it: over HTTP/2, smg 1.13.0 resets the stream of a POST it
         # refuses before reading its body (curl exit 92 instead of the 401).
         "--http1.1",
         "--connect-timeout", "3", "--max-time", "10", *args, url],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return proc.returncode, proc.stdout.strip()


def post(container: str, url: str, body: dict, key: str | None = None) -> tuple[int, str]:
    """A JSON POST from ``container``, with the key as a Bearer token when given."""
    auth = ["-H", f"Authorization: Bearer {key}"] if key else []
    return curl(container, url, "-X", "POST", "-H", "Content-Type: application/json", "-d", json.dumps(body), *auth)


@pytest.fixture(scope="module", autouse=True)
def clients_trust_the_ca(tmp_path_factory) -> None:
    """The gateway's CA (public) in each client container, at CLIENT_CA."""
    local = tmp_path_factory.mktemp("ca") / "ca.pem"
    subprocess.run(["docker", "cp", f"{GW}:{TLS}/ca.pem", str(local)], check=True)
    for name in ("exposure-allowed", "exposure-outside"):
        subprocess.run(["docker", "cp", str(local), f"{name}:{CLIENT_CA}"], check=True)


@pytest.fixture(scope="module")
def address_of() -> dict[str, str]:
    """Each client's address on the scenario's network."""
    out = {}
    for name in ("exposure-allowed", "exposure-outside", "exposure-worker"):
        fmt = '{{(index .NetworkSettings.Networks "molecule-exposure").IPAddress}}'
        out[name] = subprocess.run(
            ["docker", "inspect", "-f", fmt, name], capture_output=True, text=True, check=True
        ).stdout.strip()
    return out


def test_the_unit_lets_only_loopback_the_worker_and_the_allowed_client_in(host, address_of):
    shown = host.run(f"systemctl show -p IPAddressDeny,IPAddressAllow {UNIT}").stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert sorted(props["IPAddressDeny"].split()) == ["0.0.0.0/0", "::/0"]
    expected = ["127.0.0.0/8", "::1/128", f"{address_of['exposure-worker']}/32", f"{address_of['exposure-allowed']}/32"]
    assert sorted(props["IPAddressAllow"].split()) == sorted(expected)


def test_a_source_outside_the_allow_list_cannot_connect(host):
    # The network path is open: a listener outside the unit on the same container answers it.
    host.run("systemd-run --unit exposure-control --collect python3 -m http.server 30999")
    try:
        assert curl("exposure-outside", f"http://{GW}:30999/", "--retry", "5", "--retry-connrefused") == (0, "200")
    finally:
        host.run("systemctl stop exposure-control")
    # The unit's filter drops it: no answer at all (curl exit 28, connect timeout), on both ports.
    assert curl("exposure-outside", f"{API}/liveness") == (28, "000")
    assert curl("exposure-outside", METRICS) == (28, "000")
    assert post("exposure-outside", f"{API}/v1/chat/completions", CHAT, KEY) == (28, "000")


def test_an_allowed_source_without_the_key_gets_401(host):
    assert curl("exposure-allowed", f"{API}/liveness") == (0, "200")
    assert post("exposure-allowed", f"{API}/v1/chat/completions", CHAT) == (0, "401")
    assert post("exposure-allowed", f"{API}/v1/conversations", {}) == (0, "401")
    assert post("exposure-allowed", f"{API}/v1/conversations", {}, "not-the-key") == (0, "401")
    # The control plane has its own key: the API key does not open it.
    assert curl("exposure-allowed", f"{API}/workers", "-H", f"Authorization: Bearer {KEY}") == (0, "401")


def test_an_allowed_source_with_the_key_gets_200(host):
    assert post("exposure-allowed", f"{API}/v1/conversations", {}, KEY) == (0, "200")
    assert curl("exposure-allowed", f"{API}/workers", "-H", f"Authorization: Bearer {CONTROL_KEY}") == (0, "200")
    # smg's /metrics takes no key: the allow-list is what keeps it from everyone else.
    assert curl("exposure-allowed", METRICS) == (0, "200")


def test_the_api_is_tls_that_clients_verify_and_plain_http_gets_no_answer(host):
    """The key crosses the network encrypted: the gateway's certificate names it and the clients verify it with
    its CA; the system's CAs refuse it (curl 60) and plain HTTP on the port gets no HTTP answer (000)."""
    assert post("exposure-allowed", f"{API}/v1/conversations", {}, KEY) == (0, "200")
    no_ca = subprocess.run(
        ["docker", "exec", "exposure-allowed", "curl", "-sS", "-o", "/dev/null", "--max-time", "10", f"{API}/liveness"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert no_ca.returncode == 60, no_ca.stderr
    rc, status = curl("exposure-allowed", f"http://{GW}:30000/liveness")
    assert rc != 0 and status == "000"
    names = host.check_output(f"openssl x509 -noout -ext subjectAltName -in {TLS}/cert.pem")
    assert f"DNS:{GW}" in names and "IP Address:127.0.0.1" in names, names
    key = host.file(f"{TLS}/key.pem")
    assert (key.user, key.group, key.mode) == ("root", "smg", 0o640)
    assert host.file(TLS).mode == 0o750


def test_the_api_key_is_only_in_the_root_only_file(host):
    env = host.file(f"/etc/{UNIT}/control-plane.env")
    assert (env.user, env.mode) == ("root", 0o600)
    assert f"SMG_API_KEY={KEY}" in env.content_string
    assert KEY not in host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert KEY not in host.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert KEY not in host.run(f"journalctl -u {UNIT} --no-pager").stdout


def test_systemd_rates_the_gateways_sandbox_below_the_threshold(host, systemd_exposure):
    score, table = systemd_exposure(host, UNIT)
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE} for {UNIT}.service:\n{table}"
    assert host.service(UNIT).is_running


@pytest.mark.parametrize(
    "extra, sentence",
    [
        (
            {},
            'gateway_host is "0.0.0.0", a network address, but gateway_api_key is empty: anyone who reaches '
            "localhost:30000 could send requests through the gateway; set gateway_api_key (in Ansible Vault), set "
            "gateway_host to 127.0.0.1, or set gateway_allow_unauthenticated_network to true to accept it "
            "unauthenticated behind its IP allow-list (localhost, 127.0.0.1).",
        ),
        (
            {"gateway_api_key": KEY, "gateway_prometheus_host": "0.0.0.0"},
            'gateway_prometheus_host is "0.0.0.0", a network address, but smg\'s /metrics takes no key and '
            "gateway_allowed_sources is empty: name the hosts that scrape it in gateway_allowed_sources, set "
            "gateway_prometheus_host to 127.0.0.1, or set gateway_allow_unauthenticated_network to true.",
        ),
        (
            {"gateway_api_key": CONTROL_KEY},
            "gateway_api_key equals gateway_control_plane_api_key, so every client could add and remove workers: "
            "give it a secret of its own.",
        ),
    ],
    ids=["api-without-key", "metrics-without-allow-list", "key-equals-control-key"],
)
def test_an_open_gateway_is_refused_before_anything_changes(extra, sentence):
    """The repository's inventory: its workers are ct129 (0.0.0.0) and sim (127.0.0.1)."""
    rc, message = run_offline("molecule/exposure/refusal.yml", extra)
    assert (rc, message) == (2, sentence)
