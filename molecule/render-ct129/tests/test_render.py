"""systemd's own reading of the rendered ct129 unit equals `tools/launch-plan ct129`; its keys and sandbox."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

# molecule/shared/verify_steps.py: the helpers of the scenarios' verifiers.
from verify_steps import run_offline

REPO = Path(__file__).resolve().parents[3]
UNIT = "inference-server"
KEY = "render-ct129-not-a-secret"  # converge.yml's inference_server_api_key
ADMIN_KEY = "render-ct129-admin-not-a-secret"  # converge.yml's inference_server_admin_api_key
ALLOWED = ["192.0.2.0/24", "2001:db8::/32"]  # converge.yml's inference_server_allowed_sources
# The NVIDIA nodes of the sglang profile (inference_server_gpu_devices' default).
GPU_DEVICES = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "char-nvidia",
    "char-nvidia-frontend",
    "char-nvidia-uvm",
    "char-nvidia-caps",
]
# systemd-analyze security's overall exposure of ct129's unit (0 best, 10 worst; 1.0-4.9 is "OK") must stay at
# or below this. Measured 1.7 (systemd 252, Debian 12 container, 2026-12-02) as the service account inference with
# the GPU nodes open and pidfd_getfd allowed; 2.1 as root, and 7.9 "EXPOSED" before the sandbox of issue 26.
MAX_EXPOSURE = 2.5
# The watchdog's and OnFailure='s units of ct129 (issue 44, item 6; 8.7 EXPOSED before): their sandbox is the
# same on every host, so are their thresholds (molecule/default/tests/test_sandbox.py says why); the
# watchdog's IP allow-list is ct129's (loopback, the allowed sources). To be measured here by the lead.
MAX_EXPOSURE_WATCHDOG = 2.0
MAX_EXPOSURE_GAVE_UP = 1.2


@pytest.fixture(scope="module")
def plan() -> dict:
    """The plan printed by tools/launch-plan for ct129 (offline, on the controller)."""
    # molecule's own Ansible settings (its inventory has no ct129) must not leak into the tool.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    out = subprocess.run(
        [str(REPO / "tools/launch-plan"), "ct129", "--json", "-e", json.dumps({"inference_server_api_key": KEY})],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    )
    assert KEY not in out.stdout
    return json.loads(out.stdout)["plan"]


def systemd_exec_argv(host) -> list[str]:
    """ExecStart as systemd parsed it: the argv[] field of `systemctl show -p ExecStart`."""
    shown = host.run(f"systemctl show -p ExecStart --value {UNIT}").stdout
    match = re.search(r"argv\[\]=(.*?) ;", shown)
    assert match, shown
    return match.group(1).split(" ")


def test_systemd_parses_exactly_the_plan_argv(host, plan):
    assert systemd_exec_argv(host) == plan["argv"]


def test_systemd_parses_exactly_the_plan_environment(host, plan):
    shown = host.run(f"systemctl show -p Environment --value {UNIT}").stdout.split()
    assert dict(item.split("=", 1) for item in shown) == plan["env"]


def test_unit_carries_the_origin_story_working_flags(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    for line in (
        "ExecStart=/opt/ml-env.d/",
        " serve \\",
        "--speculative-algorithm NEXTN \\",
        "--speculative-num-steps 3 \\",
        "--speculative-eagle-topk 1 \\",
        "--speculative-num-draft-tokens 4 \\",
        "--mamba-scheduler-strategy extra_buffer",
        "--tensor-parallel-size 2 \\",
        "--dtype bfloat16 \\",
        "--trust-remote-code \\",
        # Behind the API front (docs/security.md): the engine on loopback, the front on ct129's 0.0.0.0:30000.
        "--host 127.0.0.1 \\",
        "--port 30001 \\",
        "--model-path /srv/models/Qwen3.6-27B \\",
        'Environment="SGLANG_ENABLE_SPEC_V2=1"',
        "User=inference",
        "Group=inference",
        "KillMode=mixed",
        "TimeoutStartSec=1800",
        "TimeoutStopSec=150",
    ):
        assert line in unit, line


def test_the_api_front_holds_the_bind_and_passes_only_the_public_api(host):
    """ct129's 0.0.0.0:30000 is the front's (nginx as inference-front), with TLS (the deploy's CA issued the host a
    certificate for its inventory name), the engine behind it on loopback."""
    front = host.file(f"/etc/systemd/system/{UNIT}-front.service").content_string
    assert "User=inference-front" in front and "ExecStart=/usr/sbin/nginx " in front
    conf = host.file(f"/etc/{UNIT}-front/nginx.conf").content_string
    assert re.findall(r"^\s*listen (\S+ ssl);$", conf, re.M) == ["0.0.0.0:30000 ssl"]
    assert f"ssl_certificate /etc/{UNIT}-front/tls/cert.pem;" in conf
    key = host.file(f"/etc/{UNIT}-front/tls/key.pem")
    assert (key.user, key.group, key.mode) == ("root", "inference-front", 0o640)
    names = host.check_output(f"openssl x509 -noout -ext subjectAltName -in /etc/{UNIT}-front/tls/cert.pem")
    assert f"DNS:{host.backend.get_hostname()}" in names and "IP Address:127.0.0.1" in names, names
    assert re.findall(r"^\s*server (\S+);$", conf, re.M) == ["127.0.0.1:30001"]
    assert "location = /get_server_info {\n            return 403;" in conf
    assert host.run(f"nginx -t -q -e stderr -c /etc/{UNIT}-front/nginx.conf -p /tmp/").rc == 0
    shown = host.run(f"systemctl show -p LoadState,User,IPAddressAllow {UNIT}-front").stdout
    assert "LoadState=loaded" in shown and "User=inference-front" in shown
    assert sorted(re.search(r"IPAddressAllow=(.*)", shown).group(1).split()) == sorted(
        ["127.0.0.0/8", "::1/128", *ALLOWED]
    )


def test_unit_is_loaded_but_not_started(host):
    state = host.run(f"systemctl show -p LoadState,ActiveState,UnitFileState {UNIT}").stdout
    assert "LoadState=loaded" in state
    assert "ActiveState=inactive" in state
    assert "UnitFileState=disabled" in state


def test_the_keys_reach_sglang_through_files_only(host, plan):
    key_file = host.file(f"/etc/{UNIT}/api-key.yaml")
    assert key_file.mode == 0o640 and (key_file.user, key_file.group) == ("root", "inference")
    lines = [ln for ln in key_file.content_string.splitlines() if ln and not ln.startswith("#")]
    assert lines == [f'api-key: "{KEY}"', f'admin-api-key: "{ADMIN_KEY}"']
    assert plan["argv"][-2:] == ["--config", f"/etc/{UNIT}/api-key.yaml"]
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    assert KEY not in unit and ADMIN_KEY not in unit


def test_the_unit_lets_only_loopback_and_the_allowed_sources_in(host):
    shown = host.run(f"systemctl show -p IPAddressDeny,IPAddressAllow {UNIT}").stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert sorted(props["IPAddressDeny"].split()) == ["0.0.0.0/0", "::/0"]
    # localhost is 127.0.0.0/8 and ::1 in systemd's reading; a deploy adds ct129's own addresses.
    assert sorted(props["IPAddressAllow"].split()) == sorted(["127.0.0.0/8", "::1/128", *ALLOWED])


def test_the_sandbox_opens_the_gpus_and_closes_the_rest(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    assert "DevicePolicy=closed" in unit
    assert re.findall(r"^DeviceAllow=(\S+) rw$", unit, re.M) == GPU_DEVICES
    assert "PrivateDevices=" not in unit
    assert re.findall(r"^SystemCallFilter=(.*)$", unit, re.M) == ["@system-service", "~@privileged", "pidfd_getfd"]
    shown = host.run(f"systemctl show -p DevicePolicy,CapabilityBoundingSet,ProtectSystem,ProtectHome {UNIT}").stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert props == {
        "DevicePolicy": "closed",
        "CapabilityBoundingSet": "",
        "ProtectSystem": "strict",
        # The venv and the model are under /opt and /srv, which the service account reaches: /root is hidden.
        "ProtectHome": "yes",
    }


def test_systemd_rates_the_gpu_units_sandbox_below_the_threshold(host, systemd_exposure):
    score, table = systemd_exposure(host, UNIT, "ct129")
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE} for ct129's {UNIT}.service:\n{table}"


def test_systemd_rates_the_watchdogs_units_of_ct129_below_their_thresholds(host, systemd_exposure):
    for unit, threshold in ((f"{UNIT}-watchdog", MAX_EXPOSURE_WATCHDOG), (f"{UNIT}-gave-up", MAX_EXPOSURE_GAVE_UP)):
        score, table = systemd_exposure(host, unit, "ct129")
        assert score <= threshold, f"exposure {score} > {threshold} for ct129's {unit}.service:\n{table}"


def test_the_unit_writes_no_core_dump(host):
    shown = host.run(f"systemctl show -p LimitCORE,LimitNOFILE,PrivateIPC {UNIT}").stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert props == {"LimitCORE": "0", "LimitNOFILE": "65536", "PrivateIPC": "yes"}, props


def test_sglang_logs_through_the_plans_configuration_without_its_argument_dump(host, plan):
    config = host.file(f"/etc/{UNIT}/sglang-logging.json")
    assert config.mode == 0o644 and config.user == "root"
    assert json.loads(config.content_string) == plan["logging_config"]
    assert plan["logging_config"]["loggers"]["sglang.srt.entrypoints.engine"]["level"] == "WARNING"
    assert plan["env"]["SGLANG_LOGGING_CONFIG_PATH"] == config.path
    assert KEY not in config.content_string


@pytest.mark.parametrize(
    "keys, sentence",
    [
        (
            {},
            'inference_server_host is "0.0.0.0", a network address, but inference_server_api_key is empty: anyone '
            "who reaches ct129:30000 could use the server; set inference_server_api_key (in Ansible Vault) for an "
            "SGLang server, set inference_server_host to 127.0.0.1, or set "
            "inference_server_allow_unauthenticated_network to true to accept it unauthenticated behind its IP "
            "allow-list (localhost).",
        ),
        (
            {"inference_server_api_key": KEY},
            "inference_server_api_key is set but inference_server_admin_api_key is empty, so SGLang lets every holder "
            "of the API key use its admin endpoints (/update_weights_from_disk, /flush_cache, /pause_generation, ...): "
            "set inference_server_admin_api_key to another secret (in Ansible Vault).",
        ),
        ({"inference_server_api_key": KEY, "inference_server_admin_api_key": ADMIN_KEY}, ""),
        (
            {
                "inference_server_api_key": KEY,
                "inference_server_admin_api_key": ADMIN_KEY,
                "inference_server_user": "root",
            },
            "inference_server_user is root, so the engine (and the model's own code with trust_remote_code) would run "
            "with every right on ct129: leave inference_server_user at a dedicated account (the default, inference; "
            "docs/security.md says how to move a host off root), or set inference_server_allow_root to true to run it "
            "as root knowingly.",
        ),
        (
            {
                "inference_server_api_key": KEY,
                "inference_server_admin_api_key": ADMIN_KEY,
                "inference_server_user": "root",
                "inference_server_allow_root": True,
            },
            "",
        ),
    ],
    ids=["no-key", "no-admin-key", "both-keys", "root", "root-allowed"],
)
def test_a_network_bind_needs_both_keys_before_anything_changes(keys, sentence):
    """ct129 as the repository holds it (0.0.0.0, no key: the keys come from the operator's vault)."""
    rc, message = run_offline("molecule/render-ct129/refusal.yml", keys)
    assert message == sentence
    assert (rc == 0) == (not sentence), message
