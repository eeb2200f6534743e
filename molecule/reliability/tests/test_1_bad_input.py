"""Bad input: each case is a real deploy.yml run that must stop with its exact sentence and
leave the running server exactly as it was (same MainPID and start time, same unit and
secrets, same venv and model links, the deploy lock given back).

``rel-gpu`` is the same container in the sglang_servers group: its launch plan uses the
SGLang 0.5.11 lock's version, Qwen3.6-27B's real config.json (copied to the host path of
the profile, without weights) and the GPUs of a stand-in ``nvidia-smi`` that prints N RTX
A6000 lines (the test machines have no GPU). Every GPU case is refused by the plan before
ml_env could try to build the SGLang venv.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import CACHE, REPO, Deployer, dexec, full_match, put, record, same_server, server_state, sh

# The role lists its locks by name, sorted (roles/ml_env/tasks/lock.yml).
LOCK_DIR = REPO / "roles/ml_env/files/locks"

TINY = CACHE / "models" / "tiny-qwen3.5"
QWEN = REPO / "files" / "models" / "qwen3.6-27b.config.json"
HUB_PORT = 8098
SQUAT_PORT = 8001
REVISION = "0123456789abcdef0123456789abcdef01234567"


def fake_gpus(count: int) -> Callable[[], None]:
    """Setup: an nvidia-smi that lists ``count`` RTX A6000 (48 GB)."""

    def setup() -> None:
        lines = "".join(f"echo '{i}, NVIDIA RTX A6000, 49140'\n" for i in range(count))
        put("/usr/local/bin/nvidia-smi", "#!/bin/sh\n# reliability scenario: stand-in GPUs\n" + lines, "0755")

    return setup


def no_gpus() -> None:
    """Teardown: remove the stand-in nvidia-smi."""
    sh("rm -f /usr/local/bin/nvidia-smi")


@dataclass
class Case:
    """One bad input, how it is given, and the sentence it must end in (a regex, whitespace-normalised)."""

    id: str
    title: str
    how: str
    expected: str
    extra: dict[str, Any] = field(default_factory=dict)
    limit: str = "rel-molecule"
    setup: Callable[[], None] | None = None
    teardown: Callable[[], None] | None = None
    # Only the late case syncs a new model revision before it is refused (and puts the link back).
    allow_changes: bool = False


def cases(work: Path) -> list[Case]:
    """The cases of issue 6, with this session's controller-side fixtures under ``work``."""
    gpu_vars = {"ml_env_wheelhouse": str(work / "empty-wheelhouse")}  # a case that got through fails fast
    # fmt: off
    return [
        Case("no-profile", "an inventory host with no profile",
             "the container as `rel-noprofile`, in no inventory group",
             r"Host rel-noprofile has no profile \(deploy_profile is ''\): add it to the inventory group "
             r"sglang_servers or rehearsal, or set deploy_profile to one of sglang, cpu-rehearsal\.",
             limit="rel-noprofile"),
        Case("port-taken", "port already taken by another process",
             f"`python3 -m http.server {SQUAT_PORT}` runs as unit rel-squatter; "
             f"`-e inference_server_port={SQUAT_PORT}`",
             rf"Port {SQUAT_PORT} on rel-molecule is already taken by \S*python3 -m http\.server {SQUAT_PORT} "
             rf"--bind 127\.0\.0\.1 \(pid \d+, unit rel-squatter\.service\); stop that process or set "
             r"inference_server_port to a free port, or take that server over without a gap with deploy_adopt=true "
             r"\(README: Adopting a host that runs by hand\)\.",
             extra={"inference_server_port": SQUAT_PORT}),
        Case("glibc", "glibc older than the engine's wheels need",
             "the CPU lock with its header saying `# platform: manylinux_2_99_x86_64` (`-e ml_env_lock_dir=...`); "
             "the host has glibc 2.36",
             r"Host rel-molecule has glibc 2\.36, but the wheels of ml_env_lock 'transformers-cpu' are "
             r"manylinux_2_99 and need glibc 2\.99 or newer: upgrade the host's OS \(Ubuntu 22\.04\+, Debian 12\+\) "
             r"or set ml_env_lock to a lock built for glibc 2\.36\.",
             extra={"ml_env_lock_dir": str(work / "locks-glibc")}),
        Case("engine-version", "an engine version the lock does not know",
             "`rel-gpu` (SGLang profile, lock sglang-0.5.11) with `-e ml_env_expected_engine_version=0.5.12`",
             r"ml_env_expected_engine_version is 0\.5\.12, but ml_env_lock 'sglang-0\.5\.11' pins sglang 0\.5\.11: "
             r"set ml_env_lock to a lock that pins sglang 0\.5\.12 \(no lock in \S+/roles/ml_env/files/locks does: "
             r"make one with tools/lock-profile\), or set ml_env_expected_engine_version to 0\.5\.11\.",
             extra={**gpu_vars, "ml_env_expected_engine_version": "0.5.12"}, limit="rel-gpu"),
        Case("known-bad-engine", "an engine version known to crash on this model",
             "`rel-gpu` with 2 stand-in GPUs and a lock pinning sglang 0.5.13 (`-e ml_env_lock_dir=...`, "
             "`ml_env_lock=sglang-0.5.13`, `ml_env_expected_engine_version=0.5.13`): NEXTN with extra_buffer on the "
             "hybrid model",
             r"ml_env_lock gives sglang 0\.5\.13, which is known to crash with a TypeError in "
             r"set_mamba_track_indices_from_reqs on hybrid models \(Qwen3\.5/3\.6\) with speculative decoding and the "
             r"mamba extra_buffer \(sgl-project/sglang#27325, sgl-project/sglang#28312, sgl-project/sglang#28431, "
             r"sgl-project/sglang#28484, sgl-project/sglang#31249, fixed by sgl-project/sglang#27998 in 0\.5\.15\): "
             r"use a supported version \(0\.5\.11, 0\.5\.17, 0\.5\.23\)\.",
             extra={**gpu_vars, "ml_env_lock_dir": str(work / "locks-known-bad"), "ml_env_lock": "sglang-0.5.13",
                    "ml_env_expected_engine_version": "0.5.13"},
             limit="rel-gpu", setup=fake_gpus(2), teardown=no_gpus),
        Case("lock-unknown", "a lock name with no lock file",
             "`-e ml_env_lock=sglang-0.6.0`",
             r"ml_env_lock 'sglang-0\.6\.0' has no lock file at \S+/roles/ml_env/files/locks/sglang-0\.6\.0\.txt; "
             # Every lock the role has, the gateway's included (roles/gateway installs smg through ml_env).
             r"set ml_env_lock to one of: "
             + ", ".join(re.escape(name) for name in sorted(p.stem for p in LOCK_DIR.glob("*.txt")))
             + r"\.",
             extra={"ml_env_lock": "sglang-0.6.0"}),
        Case("venv-path-file", "a venv path that is a file",
             "`/opt/ml-env-file` is a plain file; `-e ml_env_path=/opt/ml-env-file`",
             r"ml_env_path /opt/ml-env-file is a file that this role did not create; move it aside "
             r"\(mv /opt/ml-env-file /opt/ml-env-file\.manual\) or set ml_env_path to another path, since the role "
             r"manages it as a symlink to one venv per lock\.",
             extra={"ml_env_path": "/opt/ml-env-file"},
             setup=lambda: sh("echo not-a-venv > /opt/ml-env-file"), teardown=lambda: sh("rm -f /opt/ml-env-file")),
        Case("network-without-key", "a network bind whose engine enforces no API key",
             "`-e inference_server_host=0.0.0.0` on the rehearsal host, whose vaulted inference_server_api_key "
             "transformers serve does not enforce",
             r'inference_server_host is "0\.0\.0\.0", a network address, but inference_server_api_key is not enforced '
             r"by transformers serve: anyone who reaches rel-molecule:\d+ could use the server; set "
             r"inference_server_api_key \(in Ansible Vault\) for an SGLang server, set inference_server_host to "
             r"127\.0\.0\.1, or set inference_server_allow_unauthenticated_network to true to accept it "
             r"unauthenticated behind its IP allow-list \([^)]*\)\.",
             extra={"inference_server_host": "0.0.0.0"}),
        Case("thresholds", "thresholds that make no sense",
             "`-e health_gate_requests=0 -e health_gate_min_decode_tps=-5`",
             r"health_gate_requests is 0, but it must be at least 1 measured request: correct it in the group_vars "
             r"or host_vars that set it\. health_gate_min_decode_tps is -5, but it must be 0 \(no check\) or "
             r"positive \(tokens/s\): correct it in the group_vars or host_vars that set it\.",
             extra={"health_gate_requests": 0, "health_gate_min_decode_tps": -5}),
        Case("unknown-flag", "unknown override flag",
             "`rel-gpu`, `inference_server_overrides: {--mem-frac: 0.8}`",
             r"inference_server_overrides\['--mem-frac'\]: sglang 0\.5\.11 has no flag --mem-frac \(did you mean "
             r"--mem-fraction-static\? write flags in full\): fix or remove it\.",
             extra={**gpu_vars, "inference_server_overrides": {"--mem-frac": 0.8}}, limit="rel-gpu"),
        Case("tp-heads", "tensor-parallel size not dividing the heads",
             "`rel-gpu` with 4 stand-in GPUs, `inference_server_tensor_parallel_size: 3`",
             r"inference_server_tensor_parallel_size is 3, which does not divide the model's 16 "
             r"linear-attention key heads \(linear_num_key_heads\): set it to 1, 2 or 4\.",
             extra={**gpu_vars, "inference_server_tensor_parallel_size": 3},
             limit="rel-gpu", setup=fake_gpus(4), teardown=no_gpus),
        Case("too-many-gpus", "more GPUs asked than present",
             "`rel-gpu` with 2 stand-in GPUs (as ct129), `inference_server_tensor_parallel_size: 4`",
             r"inference_server_tensor_parallel_size is 4, but the host has 2 GPU\(s\): set it to 1 or 2\.",
             extra={**gpu_vars, "inference_server_tensor_parallel_size": 4},
             limit="rel-gpu", setup=fake_gpus(2), teardown=no_gpus),
        Case("nextn-no-mtp", "NEXTN on a model without an MTP head",
             "`rel-gpu` with 2 stand-in GPUs; Qwen3.6-27B's config.json with `mtp_num_hidden_layers: 0`",
             r"inference_server_speculative_algorithm is NEXTN, which drafts with the model's own MTP "
             r"head, but Qwen3_5ForConditionalGeneration has mtp_num_hidden_layers 0 in config\.json: set "
             r"inference_server_speculative_algorithm to null, or to EAGLE or DFLASH with a drafter in "
             r"model_sync_draft_source\.",
             extra={**gpu_vars, "model_sync_source": {"type": "host_path", "path": "/srv/models/no-mtp"}},
             limit="rel-gpu", setup=fake_gpus(2), teardown=no_gpus),
        Case("radix-extra-buffer", "`--disable-radix-cache` with extra_buffer",
             "`rel-gpu` with 2 stand-in GPUs, `inference_server_overrides: {--disable-radix-cache: true}` "
             "(the plan derives extra_buffer for NEXTN on the hybrid model)",
             r"inference_server_overrides\['--disable-radix-cache'\] disables the radix cache, which SGLang refuses "
             r"together with --mamba-scheduler-strategy extra_buffer, set by the plan \(derived from "
             r"inference_server_speculative_algorithm\): set inference_server_disable_radix_cache to true "
             r"instead, so the plan keeps no_buffer\.",
             extra={**gpu_vars, "inference_server_overrides": {"--disable-radix-cache": True}},
             limit="rel-gpu", setup=fake_gpus(2), teardown=no_gpus),
        Case("missing-shard", "a shard missing from the model",
             "a copy of the tiny model without `model-00003-of-00004.safetensors` as `controller_dir` source",
             r"model_sync_source\.path \S+/tiny-missing-shard on the controller lacks 1 weight file\(s\) named in "
             r"model\.safetensors\.index\.json \(model-00003-of-00004\.safetensors\): copy them into that directory "
             r"or point model_sync_source\.path at a complete model\.",
             extra={"model_sync_source": {"type": "controller_dir", "path": str(work / "tiny-missing-shard")}}),
        Case("no-config", "a model directory with no config.json",
             "a copy of the tiny model without `config.json` as `controller_dir` source",
             r"model_sync_source\.path \S+/tiny-no-config on the controller has no config\.json, so it is not a "
             r"model directory: point model_sync_source\.path at the directory that holds config\.json\.",
             extra={"model_sync_source": {"type": "controller_dir", "path": str(work / "tiny-no-config")}}),
        Case("disk", "not enough disk for the model",
             "a new revision of the tiny model (plus a 16 MiB file) with `model_sync_disk_reserve_mib` = 1 PiB, "
             "more than any disk",
             r"not enough disk space for tiny-qwen3\.5 under /srv/models: the transfer needs [0-9.]+ GiB "
             r"\(16777216 bytes\) plus the 1048576\.00 GiB reserve \(model_sync_disk_reserve_mib\), but only "
             r"[0-9.]+ GiB \(\d+ bytes\) are free; nothing was copied\.",
             extra={"model_sync_source": {"type": "controller_dir", "path": str(work / "tiny-bigger")},
                    "model_sync_disk_reserve_mib": 1024 ** 3}),
        Case("late-engine-check", "a value only the engine's own check can refuse, after a new model revision",
             "`inference_server_device: cuda` on a CPU host, in the same run as a new revision of the "
             "tiny model (plus a 16 MiB file): ml_env and model_sync run, then the check in the venv refuses",
             r"Deploy step 'Stop the play with the engine's own message when it refuses the plan' failed on "
             r"rel-molecule: The transformers launch plan was refused by the engine's own check \(exit 1\): "
             r"ValueError: --device cuda but torch sees no CUDA device\. Nothing to roll back: the unit and its "
             r"secrets are the last-known-good ones \(venv /opt/ml-env\.d/[0-9a-f]{12}, model revision "
             r"[0-9a-f]{12}\), so the server was left running as it was\.",
             extra={"model_sync_source": {"type": "controller_dir", "path": str(work / "tiny-bigger")},
                    "inference_server_device": "cuda"},
             allow_changes=True),
        Case("gated-hub", "a gated Hub repo without a token",
             f"hub source Qwen/Qwen3.6-27B at a pinned commit, `model_sync_hub_endpoint` = a stand-in on "
             f"127.0.0.1:{HUB_PORT} that answers 401 `X-Error-Code: GatedRepo` as huggingface.co does; no token",
             rf"the Hub refused Qwen/Qwen3\.6-27B@{REVISION} \(HTTP 401, a gated repo\) and model_sync_hf_token is "
             r"empty: put a token whose account has been granted access to Qwen/Qwen3\.6-27B in "
             r"model_sync_hf_token \(vaulted\); nothing was downloaded\.",
             extra={"model_sync_source": {"type": "hub", "repo_id": "Qwen/Qwen3.6-27B", "revision": REVISION},
                    "model_sync_name": "gated-test", "model_sync_hub_endpoint": f"http://127.0.0.1:{HUB_PORT}",
                    "model_sync_hf_token": ""}),
    ]
    # fmt: on


@pytest.fixture(scope="module")
def work(workdir: Path) -> Path:
    """Controller-side inputs (model copies, a lock copy) and host-side ones (config files, services)."""
    root = workdir / "bad-input"
    root.mkdir()
    (root / "empty-wheelhouse").mkdir()
    for name, drop in (
        ("tiny-missing-shard", "model-00003-of-00004.safetensors"),
        ("tiny-no-config", "config.json"),
        ("tiny-bigger", None),
    ):
        shutil.copytree(TINY, root / name)
        if drop:
            (root / name / drop).unlink()
    (root / "tiny-bigger" / "extra.bin").write_bytes(b"\0" * 16 * 1024 * 1024)
    (root / "locks-known-bad").mkdir()
    known_bad = (REPO / "roles/ml_env/files/locks/sglang-0.5.11.txt").read_text()
    (root / "locks-known-bad" / "sglang-0.5.13.txt").write_text(
        known_bad.replace("sglang==0.5.11", "sglang==0.5.13").replace("SGLang 0.5.11", "SGLang 0.5.13")
    )
    (root / "locks-glibc").mkdir()
    lock = (REPO / "roles/ml_env/files/locks/transformers-cpu.txt").read_text().splitlines(True)
    (root / "locks-glibc" / "transformers-cpu.txt").write_text(
        lock[0] + "# platform: manylinux_2_99_x86_64\n" + "".join(lock[1:])
    )
    config = json.loads(QWEN.read_text())
    put("/srv/models/Qwen3.6-27B/config.json", json.dumps(config))  # group_vars/sglang_servers.yml
    config["text_config"]["mtp_num_hidden_layers"] = 0
    put("/srv/models/no-mtp/config.json", json.dumps(config))
    put("/usr/local/lib/gated-hub.py", (Path(__file__).parent.parent / "files" / "gated-hub.py").read_text(), "0755")
    sh(
        f"systemd-run --unit rel-gated-hub python3 /usr/local/lib/gated-hub.py {HUB_PORT}; "
        f"systemd-run --unit rel-squatter python3 -m http.server {SQUAT_PORT} --bind 127.0.0.1; sleep 1"
    )
    yield root
    sh(
        "systemctl stop rel-gated-hub rel-squatter; "
        "rm -rf /srv/models/Qwen3.6-27B /srv/models/no-mtp /srv/models/gated-test /usr/local/bin/nvidia-smi",
        check=False,
    )


CASES = cases(Path("/nonexistent"))


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_bad_input_is_refused_with_one_sentence_and_the_server_untouched(
    case_id: str, work: Path, deployer: Deployer, good_state: dict[str, Any]
) -> None:
    refuse(next(c for c in cases(work) if c.id == case_id), deployer)


def refuse(case: Case, deployer: Deployer) -> None:
    """Run deploy.yml with the case's bad input, record its row, assert its refusal and an untouched server
    (test_6_security.py's cases too)."""
    if case.setup:
        case.setup()
    try:
        before = server_state()
        run = deployer.run(case.extra, limit=case.limit)
        after = server_state()
    finally:
        if case.teardown:
            case.teardown()
    untouched = same_server(before, after) and after["files"][-1] == "no-lock"
    matched = full_match(case.expected, run.message)
    record(
        "bad_input",
        id=case.id,
        case=case.title,
        how=case.how,
        message=run.message,
        refused_by=run.failed_task,
        changed=run.stats().get("changed"),
        untouched=untouched,
        seconds=run.duration_s,
        matched=matched,
        rc=run.rc,
    )
    assert run.rc != 0, f"the deploy did not refuse {case.title}:\n{run.tail()}"
    assert matched, f"unexpected message for {case.title}:\n{run.message}\n--- expected ---\n{case.expected}"
    if not case.allow_changes:
        assert run.stats().get("changed") == 0, f"the refused run changed {run.changed_tasks()}"
    assert untouched, f"the server or its files changed:\nbefore {before}\nafter  {after}"


def test_the_hub_stand_in_saw_no_token() -> None:
    """The gated case really reached the (stand-in) Hub, without a token."""
    log = dexec("journalctl", "-u", "rel-gated-hub", "--no-pager", "-o", "cat")
    assert "/api/models/Qwen/Qwen3.6-27B/revision/" + REVISION in log
    assert "auth=no" in log and "auth=yes" not in log
