"""The converged fast path on a real host (side_effect.yml): a no-op deploy skips the roles
and changes nothing; each kind of drift alone is found, named, and put back by the role that
manages it (and inference_server, which runs after the other two), the others skipped."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODEL = Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache")) / "models/tiny-qwen3.5"
SHARD = "model-00004-of-00004.safetensors"
# A task of each skippable role that every run of that role reaches.
ROLE_TASKS = {
    "ml_env": "ml_env : Compare the installed packages with the lock",
    "model_sync": "model_sync : Push the model from the controller into the incoming snapshot",
    "inference_server": "inference_server : Write the unit and its inputs (the secret ones without log or diff)",
}


def deploy_run(step: str) -> dict:
    """rc, output, the changed tasks and the converged check's verdict of one step's deploy."""
    run = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / f"converged-{step}.json").read_text())
    blocks = run["output"].split("\nTASK [")
    run["changed"] = [b.split("]", 1)[0] for b in blocks[1:] if "\nchanged: [" in b]
    verdict = [b for b in blocks if b.startswith("converged : Say which roles run")]
    # The yaml callback quotes the message: '' stands for one quote.
    run["verdict"] = " ".join(verdict[0].split()).replace("''", "'") if verdict else ""
    run["recap_changed"] = re.findall(r"molecule-sim-default\s+: ok=\d+\s+changed=(\d+)", run["output"])
    return run


def test_every_role_runs_and_changes_nothing_with_the_fast_path_off():
    run = deploy_run("full_noop")
    assert run["rc"] == 0, run["output"][-3000:]
    assert run["recap_changed"] == ["0"] and run["changed"] == []
    assert run["verdict"] == "", "converged_enabled=false must not check"
    for task in ROLE_TASKS.values():
        assert f"TASK [{task}]" in run["output"]


def test_a_no_op_deploy_skips_the_roles_changes_nothing_and_still_gates():
    run = deploy_run("fast_noop")
    assert run["rc"] == 0, run["output"][-3000:]
    assert "Converged: inputs, files, links, model, venv and service are as the last" in run["verdict"]
    assert run["recap_changed"] == ["0"] and run["changed"] == []
    for task in ROLE_TASKS.values():
        assert f"TASK [{task}]" not in run["output"]
    assert "gate PASS" in run["output"]


@pytest.mark.parametrize(
    "step, reason, repair, running",
    [
        (
            "venv_drift",
            r"The venv /opt/ml-env\.d/\w+ changed: removed \['mdurl-[\d.]+\.dist-info'\], added nothing\.",
            "ml_env : Install exactly the locked packages",
            ["ml_env", "inference_server"],
        ),
        (
            "model_drift",
            rf"/srv/models/tiny-qwen3\.5/revisions/\w+: {SHARD} changed \(size, mtime, mode or owner\)\.",
            "model_sync : Push the model from the controller into the incoming snapshot",
            ["model_sync", "inference_server"],
        ),
        (
            "service_stopped",
            r"The unit inference-server is inactive, not active\.",
            "inference_server : Start the server if it is stopped and nothing asked for a restart",
            ["inference_server"],
        ),
    ],
)
def test_drift_alone_is_named_and_put_back_by_its_role_the_others_skipped(step, reason, repair, running):
    run = deploy_run(step)
    assert run["rc"] == 0, run["output"][-3000:]
    assert run["verdict"].startswith("converged : Say which roles run, and why]"), run["verdict"]
    skipped = [role for role in ROLE_TASKS if role not in running]
    assert f"Skipping {' and '.join(skipped)}, as the last converged deploy left them;" in run["verdict"]
    assert f"running {' and '.join(running)}:" in run["verdict"]
    assert re.search(reason, run["verdict"]), run["verdict"]
    # Only this drift: the inputs and the other managed paths were as recorded.
    assert "inputs changed" not in run["verdict"]
    assert repair in run["changed"], run["changed"]
    for role, task in ROLE_TASKS.items():
        assert (f"TASK [{task}]" in run["output"]) == (role in running), (role, running)


def test_the_drifted_package_and_shard_are_back(host):
    assert host.run("/opt/ml-env/bin/python -c 'import mdurl'").rc == 0
    served = host.run(f"sha256sum /srv/models/tiny-qwen3.5/current/{SHARD}").stdout.split()[0]
    assert served == hashlib.sha256((MODEL / SHARD).read_bytes()).hexdigest()
    assert host.service("inference-server").is_running


def test_the_record_is_private_to_root(host):
    record = host.file("/var/lib/inference-server-deploy/converged.json")
    assert record.user == "root" and record.mode == 0o600
