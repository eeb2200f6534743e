"""roles/monitoring's checks and scrape config, through Ansible on this machine (no host changes).

A playbook includes the role's preflight (public, so its vars stay) on a local host of a test
inventory, renders templates/prometheus.yml.j2 into a temporary directory and runs Prometheus's
own ``promtool check config`` on it. The refusals are the role's own messages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from monitoring_support import REPO, ROLE, RULES, promtool
from tls_certs import CA

KEY = "sk-serving-key-0123456789abcdef"


def run_role(
    tmp_path: Path, extra: dict | None = None, sources: list[str] | None = None
) -> subprocess.CompletedProcess:
    """Preflight and the scrape config for a fleet of one GPU host, one rehearsal host and a gateway."""
    inventory = {
        "all": {
            "children": {
                "sglang_servers": {
                    "hosts": {
                        "gpu-a01": {
                            "ansible_host": "10.0.4.11",
                            "inference_server_host": "0.0.0.0",
                            "inference_server_allowed_sources": sources if sources is not None else ["any"],
                            "inference_server_api_key": KEY,
                            "inference_server_enable_metrics": True,
                        }
                    }
                },
                "rehearsal": {
                    "hosts": {
                        "sim-a01": {
                            "ansible_host": "10.0.4.12",
                            "inference_server_host": "10.0.4.12",
                            "inference_server_engine": "transformers",
                            "inference_server_allowed_sources": ["any"],
                        }
                    }
                },
                "gateways": {
                    "hosts": {
                        "gw-a01": {
                            "ansible_host": "10.0.4.2",
                            "gateway_prometheus_host": "0.0.0.0",
                            "gateway_allowed_sources": ["any"],
                        }
                    }
                },
                "monitoring": {
                    "hosts": {"mon-a01": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
                },
            }
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playbook = [
        {
            "name": "Render the monitoring role's scrape config",
            "hosts": "mon-a01",
            "gather_facts": False,
            "tasks": [
                {"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "preflight", "public": True}},
                {
                    "ansible.builtin.template": {
                        "src": str(ROLE / "templates" / "prometheus.yml.j2"),
                        "dest": str(tmp_path / "prometheus.yml"),
                        "mode": "0644",
                    }
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    cmd = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(tmp_path / "inventory.yml"),
        str(tmp_path / "play.yml"),
    ]
    cmd += ["-e", json.dumps(extra or {})]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_scrape_config_has_every_target_and_passes_promtool(tmp_path):
    # promtool checks that a scrape's CA file exists: the one the role writes, here in the test's folder.
    (tmp_path / "servers-ca.pem").write_text(CA().pem)
    proc = run_role(tmp_path, {"_monitoring_servers_ca_file": str(tmp_path / "servers-ca.pem")})
    assert proc.returncode == 0, proc.stdout[-3000:]
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"sglang-gpu-a01", "node-gpu-a01", "node-sim-a01", "smg-gw-a01"}  # transformers: no /metrics
    assert jobs["sglang-gpu-a01"]["static_configs"] == [
        {"targets": ["10.0.4.11:30000"], "labels": {"job": "sglang", "host": "gpu-a01"}}
    ]
    assert jobs["smg-gw-a01"]["static_configs"][0]["targets"] == ["10.0.4.2:29000"]
    assert jobs["sglang-gpu-a01"]["metric_relabel_configs"][0]["replacement"] == "sglang:$1"
    assert "authorization" not in jobs["sglang-gpu-a01"]
    # TLS on gpu-a01's API front (a network bind): verified with the CA, for its server name.
    assert jobs["sglang-gpu-a01"]["scheme"] == "https"
    tls = {"ca_file": str(tmp_path / "servers-ca.pem"), "server_name": "gpu-a01"}
    assert jobs["sglang-gpu-a01"]["tls_config"] == tls
    # node_exporter with TLS (monitoring_node_exporter_tls): verified with the CA, for each host's inventory name.
    for host in ("gpu-a01", "sim-a01"):
        assert (jobs[f"node-{host}"]["scheme"], jobs[f"node-{host}"]["tls_config"]["server_name"]) == ("https", host)
    check = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_node_exporter_without_tls_is_scraped_over_plain_http(tmp_path):
    proc = run_role(tmp_path, {"monitoring_node_exporter_tls": False})
    assert proc.returncode == 0, proc.stdout[-3000:]
    jobs = {job["job_name"]: job for job in yaml.safe_load((tmp_path / "prometheus.yml").read_text())["scrape_configs"]}
    assert "scheme" not in jobs["node-gpu-a01"] and "tls_config" not in jobs["node-sim-a01"]


def test_api_key_goes_to_a_credentials_file_never_into_the_config_or_the_log(tmp_path):
    proc = run_role(tmp_path, {"monitoring_scrape_with_api_key": True})
    assert proc.returncode == 0, proc.stdout[-3000:]
    text = (tmp_path / "prometheus.yml").read_text()
    job = next(j for j in yaml.safe_load(text)["scrape_configs"] if j["job_name"] == "sglang-gpu-a01")
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/llm-deploy/gpu-a01.token"}
    assert KEY not in text and KEY not in proc.stdout + proc.stderr


def test_a_target_whose_allow_list_keeps_prometheus_out_is_refused(tmp_path):
    proc = run_role(tmp_path, sources=["198.51.100.0/24"])  # TEST-NET-2: none of this machine's addresses
    assert proc.returncode != 0
    assert "gpu-a01's inference_server_allowed_sources do(es) not let mon-a01 in" in proc.stdout
    assert not (tmp_path / "prometheus.yml").exists()


def test_an_sglang_server_without_metrics_is_refused(tmp_path):
    proc = run_role(tmp_path, {"inference_server_enable_metrics": False})
    assert proc.returncode != 0
    assert "gpu-a01 run(s) SGLang without /metrics: set inference_server_enable_metrics" in proc.stdout


def test_a_server_on_loopback_and_a_gateway_metrics_on_loopback_are_refused(tmp_path):
    proc = run_role(tmp_path, {"inference_server_host": "127.0.0.1", "gateway_prometheus_host": "127.0.0.1"})
    assert proc.returncode != 0
    assert "gpu-a01, sim-a01 listen(s) on loopback only (inference_server_host)" in proc.stdout


def test_the_allow_list_filter_reads_addresses_prefixes_and_systemd_words():
    spec = importlib.util.spec_from_file_location("sources", ROLE / "filter_plugins" / "monitoring_sources.py")
    sources = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sources)
    allowed = sources.monitoring_address_allowed
    assert allowed("10.0.4.17", ["10.0.4.0/24"]) and allowed("10.0.4.17", ["10.0.4.17"])
    assert not allowed("10.0.5.1", ["10.0.4.0/24", "localhost"])
    assert allowed("127.0.0.1", ["localhost"]) and allowed("fd00::2", ["any"]) and allowed("10.9.9.9", ["any"])
    assert not allowed("mon-a01", ["any"])  # a name: systemd filters addresses
    assert not allowed("10.0.4.17", ["not-a-prefix"]) and not allowed("10.0.4.17", [])


def test_an_alerts_for_duration_is_replaced_and_the_rest_of_the_rules_kept(tmp_path):
    spec = importlib.util.spec_from_file_location("rules", ROLE / "filter_plugins" / "monitoring_rules.py")
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    text = RULES.read_text()
    assert rules.monitoring_alert_for(text, {}) == text  # no override: the file as written, comments kept
    changed = rules.monitoring_alert_for(text, {"LLMGatewayWorkerUnhealthy": "5s"})
    before, after = (
        {r["alert"]: r for g in yaml.safe_load(t)["groups"] for r in g["rules"] if "alert" in r}
        for t in (text, changed)
    )
    assert after["LLMGatewayWorkerUnhealthy"]["for"] == "5s" and before["LLMGatewayWorkerUnhealthy"]["for"] != "5s"
    assert {k: v for k, v in after.items() if k != "LLMGatewayWorkerUnhealthy"} == {
        k: v for k, v in before.items() if k != "LLMGatewayWorkerUnhealthy"
    }
    assert after["LLMGatewayWorkerUnhealthy"]["expr"] == before["LLMGatewayWorkerUnhealthy"]["expr"]
    assert rules.monitoring_alert_names(text) == list(before)
    (tmp_path / "rules.yml").write_text(changed)
    check = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_for_duration_of_an_unknown_alert_or_no_duration_is_refused(tmp_path):
    proc = run_role(tmp_path, {"monitoring_alert_for": {"LLMNoSuchAlert": "5m", "LLMServerDown": "soon"}})
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "monitoring_alert_for names LLMNoSuchAlert, LLMServerDown (not a duration): each key must be an alert" in out
    assert not (tmp_path / "prometheus.yml").exists()
    assert run_role(tmp_path, {"monitoring_alert_for": {"LLMServerDown": "90s"}}).returncode == 0
