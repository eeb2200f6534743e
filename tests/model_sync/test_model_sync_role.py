"""Role-level tests of model_sync run with ansible-playbook on this machine (connection local).

* defaults/main.yml and meta/argument_specs.yml name the same variables;
* a local mirror directory: first sync, no-op (changed=0), check mode with --diff;
* a host_path source: verify only, facts point at the path;
* a hub source against a local HTTP stand-in for the Hub (the real Hub is unreachable
  here): the failure is one sentence and the token never appears, even at -vvvv.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from test_model_sync_engine import make_model

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/model_sync"
BIN = Path(sys.executable).parent
TOKEN = "hf_FAKE-test-token-DO-NOT-PRINT-1234"  # not a credential: the hyphens keep it out of token scanners
CACHE = Path(os.environ.get("DEPLOY_CACHE_DIR") or ROOT / ".cache")
HUB_PYTHON_CANDIDATES = [CACHE / "venvs/transformers-cpu/bin/python"]


def test_defaults_and_argument_specs_name_the_same_variables():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(specs)
    for name, spec in specs.items():
        assert spec.get("description"), f"{name} has no description"
        assert spec.get("type"), f"{name} has no type"
        assert str(spec.get("default")) == str(defaults[name]), name


def playbook(tmp_path: Path, extra: dict, *args: str, name: str = "m") -> subprocess.CompletedProcess:
    """Run the role against localhost with ``extra`` variables; returns the process."""
    # fmt: off
    play = [{"name": "Run model_sync", "hosts": "localhost", "gather_facts": False,
             "roles": [{"role": "model_sync"}],
             "post_tasks": [{"name": "Show the facts", "ansible.builtin.debug": {"msg": {
                 "dir": "{{ model_sync_model_dir }}", "rev": "{{ model_sync_revision }}",
                 "bytes": "{{ model_sync_weights_bytes }}",
                 "type": "{{ model_sync_config.model_type | default('') }}"}}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    variables = {"model_sync_root": str(tmp_path / "models"), "model_sync_name": name,
                 "model_sync_state_dir": str(tmp_path / "state"), "model_sync_cli_path": "",
                 "model_sync_disk_reserve_mib": 0, **extra}
    # fmt: on
    # fmt: off
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", PATH=f"{BIN}:{os.environ['PATH']}")
    # fmt: on
    # fmt: off
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}",
                           "-e", f"@{tmp_path / 'vars.json'}", *args, str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    # fmt: on


def stats(proc: subprocess.CompletedProcess) -> dict:
    """Per-host stats of the json callback."""
    return json.loads(proc.stdout)["stats"]["localhost"]


def facts(proc: subprocess.CompletedProcess) -> dict:
    """The debug message of the post task."""
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    return tasks[-1]["hosts"]["localhost"]["msg"]


def task_result(proc: subprocess.CompletedProcess, name: str) -> dict:
    """Result of the first task whose name ends with ``name``."""
    for task in json.loads(proc.stdout)["plays"][0]["tasks"]:
        if task["task"]["name"].endswith(name):
            return task["hosts"]["localhost"]
    raise KeyError(name)


@pytest.fixture(scope="module")
def ansible_ok():
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not in this venv")


def test_local_mirror_first_sync_noop_and_check_mode(tmp_path, ansible_ok):
    src = make_model(tmp_path / "src")
    source = {"model_sync_source": {"type": "mirror", "path": str(src)}}
    first = playbook(tmp_path, source)
    assert first.returncode == 0, first.stdout[-3000:]
    f = facts(first)
    assert f["dir"] == str(tmp_path / f"models/m/revisions/{f['rev']}")
    assert f["type"] == "tiny" and int(f["bytes"]) > 0
    second = playbook(tmp_path, source)
    assert second.returncode == 0 and stats(second)["changed"] == 0
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 16}))
    check = playbook(tmp_path, source, "--check", "--diff")
    assert check.returncode == 0, check.stdout[-3000:]
    staged = task_result(check, "Fetch, verify and stage the model revision")
    assert staged["changed"] and [x["path"] for x in staged["plan"]["fetch"]] == ["config.json"]
    assert "+ config.json" in staged["diff"]["after"]
    assert os.readlink(tmp_path / "models/m/current") == f"revisions/{f['rev']}"


def test_host_path_is_verified_in_place(tmp_path, ansible_ok):
    src = make_model(tmp_path / "model")
    proc = playbook(tmp_path, {"model_sync_source": {"type": "host_path", "path": str(src)}})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert facts(proc)["dir"] == str(src)
    assert not (tmp_path / "models").exists()
    (src / "config.json").unlink()
    proc = playbook(tmp_path, {"model_sync_source": {"type": "host_path", "path": str(src)}})
    assert proc.returncode != 0 and "has no config.json" in proc.stdout


def test_preflight_names_the_variable(tmp_path, ansible_ok):
    proc = playbook(tmp_path, {"model_sync_source": {"type": "hub", "repo_id": "Qwen/Qwen3.6-27B", "revision": "main"}})
    assert proc.returncode != 0
    assert "pinned to a full 40-character commit sha" in proc.stdout


class _Deny(http.server.BaseHTTPRequestHandler):
    """A Hub stand-in that refuses every request (401), as for a wrong token."""

    seen_auth: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        _Deny.seen_auth.append(self.headers.get("authorization", ""))
        body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("x-error-code", "RepoNotFound")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args) -> None:
        pass


def test_hub_failure_is_one_sentence_and_never_shows_the_token(tmp_path, ansible_ok):
    hub_python = next((p for p in HUB_PYTHON_CANDIDATES if p.exists()), None)
    if hub_python is None:
        pytest.skip("no venv with huggingface_hub (make tools-venv)")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Deny)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = playbook(
            tmp_path,
            {
                "model_sync_source": {"type": "hub", "repo_id": "Qwen/Qwen3.6-27B", "revision": "a" * 40},
                "model_sync_hub_python": str(hub_python),
                "model_sync_hf_token": TOKEN,
                "model_sync_hub_endpoint": f"http://127.0.0.1:{server.server_port}",
            },
            "-vvvv",
        )
    finally:
        server.shutdown()
    assert proc.returncode != 0
    assert (
        "the Hub refused Qwen/Qwen3.6-27B@" + "a" * 40 + " (HTTP 401, not found, private or gated) with the "
        "token in model_sync_hf_token: grant that token's account access to Qwen/Qwen3.6-27B on the Hub, or use "
        "another token; nothing was downloaded."
    ) in " ".join(proc.stdout.split())
    assert _Deny.seen_auth and _Deny.seen_auth[0] == f"Bearer {TOKEN}", "the token reached the endpoint"
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    # vars.json is this test's stand-in for the vault; nothing else may hold the token.
    leftovers = [
        p for p in tmp_path.rglob("*") if p.is_file() and p.name != "vars.json" and TOKEN.encode() in p.read_bytes()
    ]
    assert leftovers == [], "the token was written to a file"
    shutil.rmtree(tmp_path / "models", ignore_errors=True)


def deploy_task(name: str) -> dict:
    """A task of deploy.yml's checks or roles, by name (its vars are what a deploy passes)."""
    tasks = [
        task
        for part in ("deploy-checks.yml", "deploy-roles.yml")
        for task in yaml.safe_load((ROOT / "playbooks/tasks" / part).read_text())
    ]
    return next(t for t in tasks if t.get("name") == name)


def test_the_drafter_is_a_second_artifact_of_the_same_tasks(tmp_path, ansible_ok):
    """deploy.yml's drafter run (its own vars), then the model's: two artifacts, each facts of its own."""
    drafter_run = deploy_task("Sync and verify the drafter")
    assert drafter_run["ansible.builtin.include_role"] == {"name": "model_sync"}
    target, drafter = make_model(tmp_path / "target"), make_model(tmp_path / "drafter", seed=7)
    (drafter / "config.json").write_text(json.dumps({"model_type": "tiny-drafter", "hidden_size": 8}))
    play = [
        {
            "name": "Sync the drafter and the model as deploy.yml does",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Check the drafter",
                    "ansible.builtin.include_role": {"name": "model_sync", "tasks_from": "preflight.yml"},
                    "vars": deploy_task("Check the drafter's inputs before anything changes")["vars"],
                },
                {
                    "name": "Check the model",
                    "ansible.builtin.include_role": {"name": "model_sync", "tasks_from": "preflight.yml"},
                },
                {
                    "name": "Sync the drafter",
                    "ansible.builtin.include_role": {"name": "model_sync"},
                    "vars": drafter_run["vars"],
                },
                {"name": "Sync the model", "ansible.builtin.include_role": {"name": "model_sync"}},
                {
                    "name": "Show the facts",
                    "ansible.builtin.debug": {
                        "msg": {
                            "dir": "{{ model_sync_model_dir }}",
                            "type": "{{ model_sync_config.model_type }}",
                            "draft_dir": "{{ model_sync_draft_model_dir }}",
                            "draft_rev": "{{ model_sync_draft_revision }}",
                            "draft_type": "{{ model_sync_draft_config.model_type }}",
                            "draft_bytes": "{{ model_sync_draft_weights_bytes }}",
                            "source_config": "{{ model_sync_source_config.model_type | default('') }}",
                            "draft_source_config": "{{ model_sync_draft_source_config.model_type | default('') }}",
                        }
                    },
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    variables = {
        "model_sync_root": str(tmp_path / "models"),
        "model_sync_name": "m",
        "model_sync_state_dir": str(tmp_path / "state"),
        "model_sync_cli_path": "",
        "model_sync_disk_reserve_mib": 0,
        "model_sync_source": {"type": "controller_dir", "path": str(target)},
        "model_sync_draft_source": {"type": "controller_dir", "path": str(drafter), "revision": "d1"},
        "model_sync_draft_name": "m-drafter",
    }
    # fmt: off
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}",
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path)
    # fmt: on
    assert proc.returncode == 0, proc.stdout[-4000:]
    f = json.loads(proc.stdout)["plays"][0]["tasks"][-1]["hosts"]["localhost"]["msg"]
    assert f["type"] == "tiny" and f["source_config"] == "tiny"
    assert f["draft_type"] == "tiny-drafter" and f["draft_source_config"] == "tiny-drafter"
    assert f["draft_dir"] == str(tmp_path / "models/m-drafter/revisions/d1") and f["draft_rev"] == "d1"
    assert f["dir"].startswith(str(tmp_path / "models/m/revisions/")) and int(f["draft_bytes"]) > 0
    assert os.readlink(tmp_path / "models/m-drafter/current") == "revisions/d1"
    assert os.readlink(tmp_path / "models/m/current") == "revisions/" + Path(f["dir"]).name
