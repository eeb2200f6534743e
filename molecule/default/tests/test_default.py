"""testinfra checks of a rehearsal host after `deploy.yml`: venv, model, unit, service, gate."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LOCK = REPO / "roles/ml_env/files/locks/transformers-cpu.txt"
UNIT = "inference-server"
PORT = 8000
# What `python -m venv` puts in every venv; not part of the lock.
SEED_PACKAGES = {"pip", "setuptools", "wheel"}


def locked_versions() -> dict[str, str]:
    """Pins of the CPU lock, by canonical name."""
    pins = {}
    # pip's reading: continued lines joined, the --hash options are not part of the pin.
    text = re.sub(r"\\\n", " ", LOCK.read_text())
    for line in text.splitlines():
        line = re.sub(r"\s--hash=\S+", "", " " + line.split("#", 1)[0]).strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_venv_is_a_link_to_the_locked_venv(host):
    link = host.file("/opt/ml-env")
    assert link.is_symlink
    assert re.fullmatch(r"/opt/ml-env\.d/[0-9a-f]{12}", link.linked_to)


def test_venv_holds_exactly_the_locked_versions(host):
    record = json.loads(host.file("/opt/ml-env/ml-env-installed.json").content_string)
    packages = {name: version for name, version in record["packages"].items() if name not in SEED_PACKAGES}
    assert packages == locked_versions()
    assert record["engine_import_version"] == locked_versions()["transformers"]


def test_model_current_link_points_at_a_complete_revision(host):
    current = host.file("/srv/models/tiny-qwen3.5/current")
    assert current.is_symlink
    index = json.loads(host.file(current.linked_to + "/model.safetensors.index.json").content_string)
    for shard in set(index["weight_map"].values()):
        assert host.file(f"{current.linked_to}/{shard}").size > 0
    assert host.file(f"{current.linked_to}/config.json").is_file


def test_unit_renders_one_flag_per_line_and_the_resolved_paths(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    venv = host.file("/opt/ml-env").linked_to
    model = host.file("/srv/models/tiny-qwen3.5/current").linked_to
    assert f"ExecStart={venv}/bin/transformers serve {model} \\" in unit
    assert "\n    --port 8000 \\\n" in unit
    assert "KillMode=mixed" in unit
    assert "Restart=on-failure" in unit
    assert "EnvironmentFile=/etc/inference-server/secrets.env" in unit


def test_secrets_file_is_private_to_root(host):
    secrets = host.file(f"/etc/{UNIT}/secrets.env")
    assert (secrets.user, secrets.group, secrets.mode) == ("root", "root", 0o600)


def test_service_runs_as_the_dedicated_user_and_is_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled
    main_pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert host.run(f"ps -o user= -p {main_pid}").stdout.strip() == "inference"


def test_port_listens_on_loopback_only(host):
    assert host.socket(f"tcp://127.0.0.1:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening


def test_gate_report_is_on_record_and_passed(host):
    report = json.loads(host.file(f"/var/lib/{UNIT}-deploy/gate/latest.json").content_string)
    assert report["passed"] is True, report.get("reasons")
    aggregate = report["aggregate"]
    assert aggregate["requests"] >= 1
    assert aggregate["decode_tps_mean"] > 0
    assert aggregate["ttft_p95_s"] > 0
    # Tokens come from the server's usage, and every measured request produced some.
    assert all(r["completion_tokens"] > 0 for r in report["requests"])
    assert report["metadata"]["venv_dir"] == host.file("/opt/ml-env").linked_to


def test_last_known_good_matches_the_running_unit(host):
    state = json.loads(host.file(f"/var/lib/{UNIT}-deploy/last-known-good/state.json").content_string)
    unit = host.file(f"/etc/systemd/system/{UNIT}.service")
    kept = host.file(f"/var/lib/{UNIT}-deploy/last-known-good/unit.service")
    assert kept.sha256sum == unit.sha256sum
    assert state["model_dir"] == host.file("/srv/models/tiny-qwen3.5/current").linked_to
    assert (kept.user, kept.mode) == ("root", 0o600)


def test_the_first_deploy_recorded_what_the_server_says_and_the_no_op_asked_nothing_more(host):
    """The correctness probe (docs/health-gate.md, "Correctness"): the first deploy's gate asked it and the
    last-known-good keeps its outputs and score; the idempotence run's gate (a no-op) did not ask it."""
    state = json.loads(host.file(f"/var/lib/{UNIT}-deploy/last-known-good/state.json").content_string)
    record = state["gate_baseline"]["correctness"]
    assert record["probe"]["name"] == "tiny-rehearsal" and record["model_revision"] == state["model_revision"]
    assert set(record["golden"]) == {"code", "doc/1", "doc/2", "talk/1", "talk/2"}
    assert all(len(g["text"]) > 0 for g in record["golden"].values())
    assert record["eval"]["count"] == 20 and record["eval"]["score"] >= state["gate_thresholds"]["min_eval_score"] > 0
    latest = json.loads(host.file(f"/var/lib/{UNIT}-deploy/gate/latest.json").content_string)
    assert latest["correctness"] is None, "the no-op deploy asked the probe"
    assert latest["correctness_why"].startswith("the unit is the last-known-good one")
    reports = host.run(f"grep -l 'right: consistency' /var/lib/{UNIT}-deploy/gate/2*.json").stdout.split()
    assert reports, "no gate report of this scenario asked the probe"


def test_gate_figures_are_published_for_node_exporter(host):
    prom = host.file("/var/lib/node_exporter/textfile_collector/llm_gate.prom").content_string
    assert re.search(r'^llm_gate_passed\{host="molecule-sim-default"\} 1$', prom, re.M)
    assert re.search(r"^llm_gate_decode_tokens_per_second\{[^}]*\} [0-9.]+$", prom, re.M)
