"""A fleet of three rehearsal hosts behind SGLang's gateway smg: a good change rolls through
all under load without a failed or cut request, a bad change stops at the first host (rolled
back, out of the gateway) and never touches the others, and the next deploy, a nightly run,
puts the first host back into the gateway, puts the second host's drift back and reports it,
and changes and restarts nothing on the third."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

# molecule/shared: the helpers of the scenarios' verifiers (verify_steps.py), and the writer of the
# rows the fleet adds to docs/reliability.md (result_rows.py, the reliability scenario's too).
from result_rows import check_rows, write_results
from verify_steps import failed_output, recorded

REPO = Path(__file__).resolve().parents[3]
HOSTS = ["molecule-fleet-1", "molecule-fleet-2", "molecule-fleet-3"]
GATEWAY = "molecule-fleet-gw"
KEY = "fleet-rehearsal-control-plane-key-0001"
# systemd-analyze security's overall exposure (0 best, 10 worst) of the monitoring units, running: node_exporter
# on the serving hosts with the role's sandbox (9.2 UNSAFE without it, tests/monitoring/test_sandbox.py), and
# Prometheus with Debian's own hardening (4.0 OK offline), which the role leaves as it is.
MAX_EXPOSURE_NODE_EXPORTER = 2.0
MAX_EXPOSURE_PROMETHEUS = 4.5


def step(name: str) -> dict:
    """What side_effect.yml recorded for one step: rc, output, per-host [unit sha, start]."""
    return recorded(f"fleet-{name}.json")


def routable(run: dict) -> set[str]:
    """Hosts the gateway listed ready and healthy after a step."""
    return {
        url.split("//")[1].split(":")[0]
        for url, status, healthy, _ in run["gateway_workers"]
        if status == "ready" and healthy
    }


def rolling() -> dict:
    """bench/rolling_deploy report's figures for the good and the bad change under load."""
    return recorded("rolling_deploy.json")


def unit_sha(record: dict, host: str) -> str:
    return record[host][0]


def started(record: dict, host: str) -> str:
    return record[host][1]


def test_good_change_rolls_through_every_host():
    run = step("good_change")
    assert run["rc"] == 0, run["output"][-3000:]
    for host in HOSTS:
        assert unit_sha(run["after"], host) != unit_sha(run["before"], host)
        assert started(run["after"], host) != started(run["before"], host)
    assert routable(run) == set(HOSTS)
    output = " ".join(run["output"].split())
    assert output.count("Take the host out of every gateway") >= 3
    assert output.count("Wait for the requests in flight on the host to finish") >= 3


def test_no_request_through_the_gateway_failed_or_was_cut_while_every_host_restarted():
    figures = rolling()
    assert figures["hosts"] == 3 and figures["restarted_hosts"] == 3
    assert figures["requests"] >= 300, figures
    assert figures["failed"] == 0, figures["not_ok_examples"]
    assert figures["cut"] == 0, figures["not_ok_examples"]
    assert figures["phases"]["good_change"]["requests"] > 0 and figures["phases"]["bad_change"]["requests"] > 0
    assert figures["gateway"] == "smg 1.13.0"


def test_bad_change_stops_at_the_first_host_which_is_back_on_its_previous_state():
    run = step("bad_change")
    output = failed_output(run)
    assert "Unsupported attention implementation: 'no_such_attention'" in output
    assert "The host is back on its last-known-good state" in output
    first, others = HOSTS[0], HOSTS[1:]
    assert unit_sha(run["after"], first) == unit_sha(run["before"], first)
    for host in others:
        assert run["after"][host] == run["before"][host], f"{host} was touched"
        assert f"{host} : ok=" not in output.split("PLAY RECAP")[-1]
    # The failed host stays out of the gateway; the two others keep serving through it.
    assert routable(run) == set(others)


def test_the_next_deploy_puts_the_failed_host_back_into_the_gateway():
    """The nightly run after the bad change: host 1, out of the gateway since its rollback, is routable again."""
    assert routable(step("bad_change")) == set(HOSTS[1:])
    run = step("nightly_drift")
    assert run["rc"] == 0, run["output"][-3000:]
    summary = json.loads(run["stdout"])
    assert summary["status"] == "OK"
    assert summary["hosts"][HOSTS[0]]["gate"]["decode_tps"] > 0
    assert routable(run) == set(HOSTS)


def lkg_sha(record: dict, host: str) -> str:
    """sha256 of the host's last-known-good unit ("none" without a record)."""
    return record[host][2]


# The rows this scenario adds to docs/reliability.md's faults (tools/reliability-report reads
# the committed copy, docs/reliability-results-fleet.json; copy this file there after a change).
FAULT_ROWS = REPO / "artifacts" / "fleet" / "faults.json"
COMMITTED_ROWS = REPO / "docs" / "reliability-results-fleet.json"


def test_controller_killed_while_the_gateway_puts_a_host_back_then_the_rerun_puts_it_back(request):
    """Killed as the put-back starts (host 1 restarted, gated, recorded, out of the gateway): the same deploy again
    ends with host 1 routable, serving, and its last-known-good unit equal to the running one.

    Its row goes to the reliability page's faults, with this test's outcome."""
    killed, rerun = step("killed_at_put_back"), step("put_back_rerun")
    host = HOSTS[0]
    # The recorded output joins stdout and stderr with a literal backslash-n (fleet_step.yml).
    lines = killed["output"].replace("\\n", "\n").splitlines()
    kill_line = next((line for line in lines if line.startswith("kill-at-task: killed")), "")
    out_after_kill = host not in routable(killed)
    restarted = started(killed["after"], host) != started(killed["before"], host)
    recorded_good = lkg_sha(killed["after"], host) == unit_sha(killed["after"], host)
    good_after_rerun = lkg_sha(rerun["after"], host) == unit_sha(rerun["after"], host)
    row = {
        "table": "faults",
        "id": "controller-killed-put-back",
        "fault": "the controller's run is killed while the gateway puts a host back, and run again",
        "how": "molecule/fleet (3 hosts behind smg 1.13.0): a change that restarts host 1 alone (one more "
        "Environment= line); SIGKILL to ansible-playbook and its workers as deploy.yml entered 'Put the host back in "
        "the gateway' (gateway/tasks/worker_in.yml), after the gate passed and the last-known-good state was recorded; "
        "then the same deploy",
        "happened": f"{kill_line.removeprefix('kill-at-task: ')}; host 1 ran the new unit "
        f"({'restarted' if restarted else 'NOT restarted'}), its last-known-good unit "
        f"{'equal to' if recorded_good else 'NOT'} the running one, and it was "
        f"{'out of the gateway' if out_after_kill else 'already routable'}; "
        f"the gateway routed to {len(routable(killed))} of 3 hosts",
        "host_did": "the rerun took over the dead run's lock, restarted nothing on host 1, gated it and put it back: "
        f"the gateway routes to {len(routable(rerun))} of 3 hosts, host 1's last-known-good unit "
        f"{'equals' if good_after_rerun else 'DIFFERS FROM'} the running one",
        "recover_s": round(rerun["ended"] - killed["ended"], 1),
        "rc": rerun["rc"],
        "test": request.node.nodeid,
        "outcome": "failed",
    }
    try:
        assert kill_line and killed["rc"] == 137, killed["output"][-3000:]
        assert "Put the host back in the gateway" in kill_line
        assert restarted and recorded_good and out_after_kill, killed["gateway_workers"]
        for other in HOSTS[1:]:
            assert killed["after"][other] == killed["before"][other], f"{other} was touched"
        assert rerun["rc"] == 0, rerun["output"][-3000:]
        assert "Took over the deploy lock" in rerun["output"]
        assert "gate PASS" in rerun["output"] and routable(rerun) == set(HOSTS)
        # Nothing to restart: the killed run had already switched, gated and recorded host 1.
        assert started(rerun["after"], host) == started(rerun["before"], host)
        assert good_after_rerun and lkg_sha(rerun["after"], host) != "none"
        row["outcome"] = "passed"
    finally:
        write_results(FAULT_ROWS, [row], scenario="molecule/fleet")


def test_the_fleet_rows_and_their_outcomes_are_those_of_the_committed_page():
    """The rows just written must be those of docs/reliability-results-fleet.json (timings aside)."""
    same, said = check_rows(FAULT_ROWS, COMMITTED_ROWS)
    assert same, said


def test_noop_host_of_a_nightly_run_changes_and_restarts_nothing_and_still_measures():
    """Host 3 is unchanged since good_change (the bad change stopped before it): the nightly run is a no-op there."""
    run = step("nightly_drift")
    assert run["rc"] == 0, run["output"][-3000:]
    summary = json.loads(run["stdout"])
    assert summary["status"] == "OK"
    host = HOSTS[2]
    assert summary["hosts"][host]["changed_tasks"] == []
    assert summary["hosts"][host]["restarts"] == 0
    assert summary["hosts"][host]["gate"]["decode_tps"] > 0
    assert run["after"][host] == run["before"][host]


def test_nightly_run_puts_drift_back_and_reports_it():
    run = step("nightly_drift")
    assert run["rc"] == 0, run["output"][-3000:]
    summary = json.loads(run["stdout"])
    drifted = summary["hosts"]["molecule-fleet-2"]
    changed = " ".join(drifted["changed_tasks"])
    assert "Write the unit and its inputs (the secret ones without log or diff)" in changed
    assert "Install exactly the locked packages" in changed
    assert drifted["restarts"] == 1
    assert unit_sha(run["after"], "molecule-fleet-2") == unit_sha(run["before"], "molecule-fleet-2")
    assert started(run["after"], "molecule-fleet-2") != started(run["before"], "molecule-fleet-2")
    # Host 3 did not drift: nothing changed or restarted there.
    assert summary["hosts"][HOSTS[2]]["changed_tasks"] == [] and summary["hosts"][HOSTS[2]]["restarts"] == 0
    assert run["after"][HOSTS[2]] == run["before"][HOSTS[2]]


def test_every_host_serves_the_good_change(host):
    if host.backend.get_hostname() == GATEWAY:
        return
    unit = host.file("/etc/systemd/system/inference-server.service").content_string
    assert 'Environment="FLEET_CHANGE=good"' in unit
    assert "no_such_attention" not in unit
    assert host.service("inference-server").is_running


def test_every_host_serves_behind_its_api_front(host):
    """0.0.0.0:8000 is the front's (nginx as inference-front), the engine listens on 127.0.0.1:8001, and
    what passes the front is the public API (docs/security.md, "The API front"): from the gateway's host,
    /v1/models answers and the engine's other routes (/docs, which transformers serve has) do not."""
    if host.backend.get_hostname() == GATEWAY:
        # TLS on the front (docs/security.md, "TLS"): verified with the CAs the gateway's smg uses, for the
        # host's name; plain HTTP on that port reaches no route.
        ca = "/usr/local/lib/smg-gateway/workers-ca.pem"
        status = {}
        for path in ("/v1/models", "/docs", "/get_server_info"):
            status[path] = host.check_output(
                f"curl -s --cacert {ca} -o /dev/null -w %{{http_code}} https://{HOSTS[0]}:8000{path}"
            )
        assert status == {"/v1/models": "200", "/docs": "404", "/get_server_info": "403"}
        plain = host.check_output(f"curl -s -o /dev/null -w %{{http_code}} http://{HOSTS[0]}:8000/v1/models")
        assert plain == "400"
        return
    assert host.service("inference-server-front").is_running
    listening = host.check_output("ss -ltnpH")
    assert re.search(r"0\.0\.0\.0:8000 .*nginx", listening), listening
    assert re.search(r"127\.0\.0\.1:8001 .*transformers", listening), listening
    assert host.check_output("ps -o user:32= -C nginx | sort -u") == "inference-front"
    assert host.check_output("curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8001/docs") == "200"
    # Its key is the front's account's to read, nobody else's; the certificate names the host.
    key = host.file("/etc/inference-server-front/tls/key.pem")
    assert (key.user, key.group, key.mode) == ("root", "inference-front", 0o640)
    names = host.check_output("openssl x509 -noout -ext subjectAltName -in /etc/inference-server-front/tls/cert.pem")
    assert f"DNS:{host.backend.get_hostname()}" in names and "IP Address:127.0.0.1" in names, names


def test_the_gateway_runs_with_its_key_in_a_root_only_file_and_nowhere_else(host):
    if host.backend.get_hostname() != GATEWAY:
        return
    assert host.service("smg-gateway").is_running
    key_file = host.file("/etc/smg-gateway/control-plane.env")
    assert (key_file.user, key_file.group, key_file.mode) == ("root", "root", 0o600)
    assert host.file("/etc/smg-gateway").mode == 0o700
    assert KEY not in host.file("/etc/systemd/system/smg-gateway.service").content_string
    pid = host.check_output("systemctl show -p MainPID --value smg-gateway")
    assert KEY not in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert host.check_output(f"stat -c %U /proc/{pid}") == "smg"
    assert KEY not in host.run("journalctl -u smg-gateway --no-pager").stdout
    # Without the key the control plane refuses (401, over the gateway's TLS, verified with its CA).
    probe = (
        "import ssl, urllib.error as e, urllib.request as u\n"
        "ca = ssl.create_default_context(cafile='/etc/smg-gateway-tls/ca.pem')\n"
        "try:\n    u.urlopen('https://127.0.0.1:30000/workers', context=ca)\n"
        "except e.HTTPError as refused:\n    print(refused.code)\n"
    )
    assert host.check_output(f"python3 -c {shlex.quote(probe)}") == "401"


def test_the_gateway_serves_tls_that_clients_verify_and_no_plain_http(host):
    """gateway_tls on a network gateway_host: smg serves its API over TLS with a certificate the deploy's CA
    issued for the gateway's name and loopback; the key is the gateway's account's alone; plain HTTP gets no
    HTTP answer; a client with the system's CAs refuses it (the fleet's clients verify it: side_effect.yml)."""
    if host.backend.get_hostname() != GATEWAY:
        return
    tls = "/etc/smg-gateway-tls"
    key = host.file(f"{tls}/key.pem")
    assert (key.user, key.group, key.mode) == ("root", "smg", 0o640)
    names = host.check_output(f"openssl x509 -noout -ext subjectAltName -in {tls}/cert.pem")
    assert f"DNS:{GATEWAY}" in names and "IP Address:127.0.0.1" in names, names
    unit = host.file("/etc/systemd/system/smg-gateway.service").content_string
    assert f"--tls-cert-path {tls}/cert.pem" in unit and f"--tls-key-path {tls}/key.pem" in unit
    curl = "curl -s -o /dev/null -w %{http_code} --max-time 10"
    # By its name, through loopback (the unit's IP allow-list lets the gateway's own network address no more
    # than any other host outside it): the certificate verifies for the name.
    by_name = f"--resolve {GATEWAY}:30000:127.0.0.1 https://{GATEWAY}:30000/liveness"
    assert host.check_output(f"{curl} --cacert {tls}/ca.pem {by_name}") == "200"
    assert host.run(f"{curl} https://127.0.0.1:30000/liveness").rc == 60  # the system's CAs: not verified
    assert host.run(f"{curl} http://127.0.0.1:30000/liveness").stdout.strip() != "200"


# --------------------------------------------------------------------------------------
# Monitoring: playbooks/monitoring.yml with the gateway's host as the Prometheus host
# --------------------------------------------------------------------------------------


def monitoring() -> dict:
    """The monitoring play's runs and the alert's times (side_effect.yml, files/watch-alert.py)."""
    return recorded("fleet-monitoring.json")


def test_the_monitoring_play_installs_and_a_second_run_changes_nothing():
    run = monitoring()
    assert run["rc"] == 0, failed_output(run)[-3000:]
    assert run["again_rc"] == 0, run["again_output"][-3000:]
    recap = run["again_output"][run["again_output"].rindex("PLAY RECAP") :]
    assert "changed=" in recap and all("changed=0" in line for line in recap.splitlines()[1:] if "changed=" in line)


def test_prometheus_scrapes_every_host_and_the_gateway():
    alert = recorded("fleet-alert.json")
    up = {(t["job"], t["host"]) for t in alert["targets"] if t["health"] == "up"}
    assert up == {("node", h) for h in HOSTS} | {("smg", GATEWAY)}, alert["targets"]


def test_every_hosts_last_gate_and_the_rollback_arrive_as_series(host):
    if host.backend.get_hostname() == GATEWAY:
        return
    name = host.backend.get_hostname()
    series = recorded("fleet-alert.json")["gate_series"]
    # The figure the host's own last gate report holds, through node_exporter and the scrape.
    report = json.loads(host.file("/var/lib/inference-server-deploy/gate/latest.json").content_string)
    assert series["llm_gate_passed"][name] == (1.0 if report["passed"] else 0.0)
    assert abs(series["llm_gate_decode_tokens_per_second"][name] - report["aggregate"]["decode_tps_mean"]) < 0.01
    # Host 1 was rolled back by the bad change: its rollback is a series (and LLMRollback fires).
    rollbacks = recorded("fleet-alert.json")["rollback_series"]
    assert (name in rollbacks) == (name == HOSTS[0]), rollbacks


def test_a_stopped_server_fires_its_alert_and_the_alert_resolves_when_it_is_back():
    run = monitoring()
    assert run["alert_rc"] == 0, run["alert_output"][-3000:]
    alert = recorded("fleet-alert.json")
    assert alert["rule_for"] == 5  # monitoring_alert_for reached the installed rule
    # Pending once the gateway found the worker unhealthy; firing after the rule's for: 5s more.
    assert 0 < alert["pending_after_stop_s"] < alert["firing_after_stop_s"]
    assert alert["firing_after_stop_s"] - alert["pending_after_stop_s"] >= 4
    assert alert["resolved_after_start_s"] > 0
    assert f"LLMRollback {HOSTS[0]}" in alert["firing_before"], alert["firing_before"]
    print(run["alert_output"].strip())


def test_systemd_rates_the_monitoring_units_sandboxes_below_their_thresholds(host, systemd_exposure):
    name = host.backend.get_hostname()
    unit, limit = (
        ("prometheus", MAX_EXPOSURE_PROMETHEUS)
        if name == GATEWAY
        else ("prometheus-node-exporter", MAX_EXPOSURE_NODE_EXPORTER)
    )
    score, table = systemd_exposure(host, unit)
    assert score <= limit, f"exposure {score} > {limit} for {unit}.service on {name}:\n{table}"
    # What the kernel applies to node_exporter: no capabilities, no new privileges, a seccomp filter.
    if unit == "prometheus-node-exporter":
        pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
        status = host.file(f"/proc/{pid}/status").content_string
        assert re.search(r"^CapEff:\s+0+$", status, re.M), status
        assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
        assert re.search(r"^Seccomp:\s+2$", status, re.M), status
