"""The converged fast path (roles/converged): the host-side record and check, and the
controller-side fingerprint of a deploy's inputs. The molecule scenario ``default`` runs
both for real (a no-op deploy skips the roles; each kind of drift falls through to them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import durability
import pytest
import test_role_boundaries as boundaries
import yaml
from role_files import import_file, run_module_file

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/converged"
BIN = Path(sys.executable).parent
SECRET = "not-a-real-secret-0f6c2a9e"  # a value that must never be printed

cs = import_file(ROLE / "library" / "converged_state.py")
IMPORTS = ("import_role", "ansible.builtin.import_role")
# The roles whose inputs a deploy fingerprints (converged_roles).
CONVERGED_ROLES = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["converged_roles"]


@pytest.fixture
def host(tmp_path: Path) -> dict:
    """A host's managed paths in a temporary directory, and the module parameters naming them."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    (tmp_path / "etc/secrets.env").write_text(f"TOKEN={SECRET}\n")
    (tmp_path / "etc/secrets.env").chmod(0o600)
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    (tmp_path / "model/w.safetensors").write_bytes(b"\0" * 4096)
    site = tmp_path / "venv/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for dist in ("mdurl-0.1.2.dist-info", "torch-2.9.0.dist-info"):
        (site / dist).mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "model")
    params = {
        "path": str(tmp_path / "deploy/converged.json"),
        "fingerprint": {
            "variables of role ml": "1",
            "files of role model": "2",
            "variables of role server": "3",
            "host facts": "4",
        },
        "part_roles": {
            "variables of role ml": "ml",
            "files of role model": "model",
            "variables of role server": "server",
        },
        # Three roles as deploy.yml has them: a venv, a model, and a server that runs after both.
        "roles": {
            "ml": {"venvs": [str(tmp_path / "venv")], "facts": ["ml_fact"]},
            "model": {
                "trees": [str(tmp_path / "model")],
                "files": [str(tmp_path / "current")],
                "facts": ["model_sync_revision"],
            },
            "server": {
                "files": [str(tmp_path / p) for p in ("etc/unit.service", "etc/secrets.env", "etc", "absent.yaml")],
                "users": ["root"],
                "groups": ["root"],
                "unit": "",
                "needs": ["ml", "model"],
            },
        },
        "facts": {"model_sync_revision": "abc", "ml_fact": "v"},
    }
    return {"root": tmp_path, "params": params, "site": site}


def compare(params: dict) -> tuple[list[str], list[str], list[str]]:
    """(skipped, running, reasons) for the record at params['path'] and the host now."""
    record, missing = cs.read_record(params["path"])
    return ([], list(params["roles"]), [missing]) if missing else cs.compare(record, params)


def check(params: dict) -> list[str]:
    """The differences between the record at params['path'] and the host now."""
    return compare(params)[2]


def recorded(params: dict) -> dict:
    """Write the record of the host as it is now."""
    cs.write_record(params["path"], cs.take_record(params))
    return params


def test_an_unchanged_host_is_converged_and_the_record_is_private(host):
    params = recorded(host["params"])
    assert check(params) == []
    assert os.stat(params["path"]).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(params["path"])).st_mode & 0o777 == 0o700, "made root's only"
    assert SECRET not in Path(params["path"]).read_text()


@pytest.mark.parametrize(
    "owner, drift, reason",
    [
        (
            "server",
            lambda r: (r / "etc/unit.service").write_text("[Service]\nExecStart=/bin/false\n"),
            "etc/unit.service was edited (its sha256 changed).",
        ),
        ("server", lambda r: os.chmod(r / "etc/secrets.env", 0o640), "etc/secrets.env changed mode or owner."),
        ("server", lambda r: (r / "etc/unit.service").unlink(), "etc/unit.service is gone."),
        (
            "server",
            lambda r: (r / "absent.yaml").write_text("x"),
            "absent.yaml exists, but the converged deploy had removed it.",
        ),
        ("model", lambda r: ((r / "current").unlink(), (r / "current").symlink_to(r / "etc")), "current points at"),
        (
            "model",
            lambda r: os.utime(r / "model/w.safetensors", ns=(1, 1)),
            "model: w.safetensors changed (size, mtime, mode or owner).",
        ),
        ("model", lambda r: (r / "model/extra.bin").write_text("x"), "model: extra.bin changed"),
        (
            "ml",
            lambda r: (r / "venv/lib/python3.11/site-packages/mdurl-0.1.2.dist-info").rmdir(),
            "changed: removed ['mdurl-0.1.2.dist-info'], added nothing.",
        ),
        (
            "ml",
            lambda r: (r / "venv/lib/python3.11/site-packages/torch-2.9.0.dist-info").rename(
                r / "venv/lib/python3.11/site-packages/torch-2.9.1.dist-info"
            ),
            "changed: removed ['torch-2.9.0.dist-info'], added ['torch-2.9.1.dist-info'].",
        ),
    ],
)
def test_each_kind_of_drift_is_named_and_runs_its_role_and_those_after_it(host, owner, drift, reason):
    params = recorded(host["params"])
    drift(host["root"])
    skipped, running, reasons = compare(params)
    assert reason in reasons[0], reasons
    # The role that manages the drifted path runs, and the server too, which runs after the other two.
    assert running == sorted({owner, "server"}, key=list(params["roles"]).index)
    assert skipped == [role for role in params["roles"] if role not in running]
    assert reasons[1:] == ([] if owner == "server" else [f"server runs after {owner}."])


def test_a_directory_on_the_way_replaced_by_a_link_is_drift_the_roles_then_refuse(host):
    """The service account can replace a directory of its own by a link to a file: the paths under it
    are gone (the roles then run and refuse the link by name), not an error of the check (molecule/attacker
    found it failing with "[Errno 20] Not a directory")."""
    params = recorded(host["params"])
    (host["root"] / "etc").rename(host["root"] / "etc.aside")
    (host["root"] / "etc").symlink_to(host["root"] / "model/config.json")
    skipped, running, reasons = compare(params)
    assert running == ["server"] and skipped == ["ml", "model"]
    assert any(reason.endswith("etc/unit.service is gone.") for reason in reasons), reasons


def test_changed_inputs_name_their_part_and_run_their_role_a_missing_record_runs_all(host):
    params = recorded(host["params"])
    fp = params["fingerprint"]
    # The server's own input: only the server runs.
    assert compare({**params, "fingerprint": {**fp, "variables of role server": "9"}}) == (
        ["ml", "model"],
        ["server"],
        ["The deploy's inputs changed: variables of role server."],
    )
    # The venv's input: the venv and the server, which runs after it.
    assert compare({**params, "fingerprint": {**fp, "variables of role ml": "9"}}) == (
        ["model"],
        ["ml", "server"],
        ["The deploy's inputs changed: variables of role ml.", "server runs after ml."],
    )
    # A part that no role owns (here the host's facts; a part that went away too) is shared: all run.
    for changed in ({**fp, "host facts": "9"}, {k: v for k, v in fp.items() if k != "host facts"}):
        assert compare({**params, "fingerprint": changed}) == (
            [],
            ["ml", "model", "server"],
            ["The deploy's inputs changed: host facts."],
        )
    # A role the record does not know runs (and what runs after it).
    assert compare({**params, "roles": {"gpu": {}, **params["roles"], "server": {"needs": ["gpu"]}}})[:2] == (
        ["ml", "model"],
        ["gpu", "server"],
    )
    os.unlink(params["path"])
    assert check(params) == [f"No converged deploy is on record ({params['path']} does not exist)."]
    Path(params["path"]).write_text("{not json")
    assert check(params)[0].startswith(f"The record {params['path']} cannot be read:")


@pytest.fixture
def systemctl(tmp_path: Path, monkeypatch) -> Path:
    """A systemctl on PATH that prints the properties written to its file (states a test cannot make here)."""
    props = tmp_path / "props"
    tool = tmp_path / "bin/systemctl"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat {props}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    return props


@pytest.mark.parametrize(
    "props, problem",
    [
        ("ActiveState=active\nUnitFileState=enabled\nNeedDaemonReload=no\n", None),
        (
            "ActiveState=activating\nUnitFileState=enabled\nNeedDaemonReload=no\n",
            "The unit llm is activating, not active.",
        ),
        (
            "ActiveState=active\nUnitFileState=disabled\nNeedDaemonReload=no\n",
            "The unit llm is disabled at boot, not enabled.",
        ),
        (
            "ActiveState=active\nUnitFileState=enabled\nNeedDaemonReload=yes\n",
            "The unit file of llm changed on disk since systemd loaded it.",
        ),
    ],
)
def test_the_unit_must_be_active_enabled_and_loaded(systemctl, props, problem):
    systemctl.write_text(props)
    assert cs.unit_problem("llm") == problem


def test_every_unit_of_a_role_must_serve_the_engines_and_its_fronts(systemctl):
    """inference_server names its engine's unit and, on a network bind, its API front's: a front that stopped
    between deploys sends the next deploy through the role (its start), not past it."""
    systemctl.write_text("ActiveState=failed\nUnitFileState=enabled\nNeedDaemonReload=no\n")
    entry = cs.take_role({"unit": ["llm", "llm-front"]}, {})
    assert entry["unit"] == ["llm", "llm-front"]
    failed = ["The unit llm is failed, not active.", "The unit llm-front is failed, not active."]
    assert cs.host_differences(entry) == failed
    # A record of one unit (as versions before the front wrote it), and none.
    assert cs.host_differences({"unit": "llm"}) == ["The unit llm is failed, not active."]
    assert cs.host_differences({"unit": ""}) == cs.host_differences({"unit": []}) == []


def run_module(params: dict, check_mode: bool = False) -> dict:
    """Run the module as Ansible does (arguments in a file) and return its JSON result."""
    args = Path(params["path"]).parent.parent / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**params, "_ansible_check_mode": check_mode}}))
    proc = run_module_file(ROLE / "library/converged_state.py", args)
    return json.loads(proc.stdout)


def test_the_module_removes_a_stale_record_but_not_in_check_mode(host):
    params = host["params"]
    result = run_module({**params, "state": "recorded"})
    assert result["changed"] is False and result["paths"]["tree_files"] == 2
    same = run_module({**params, "state": "checked"})
    assert same["converged"] is True and same["skip_roles"] == ["ml", "model", "server"] and same["run_roles"] == []
    assert same["facts"] == {"model_sync_revision": "abc", "ml_fact": "v"}
    (host["root"] / "etc/unit.service").write_text("edited")
    dry = run_module({**params, "state": "checked"}, check_mode=True)
    assert dry["converged"] is False and dry["removed"] is False and Path(params["path"]).exists()
    real = run_module({**params, "state": "checked"})
    assert real["converged"] is False and real["removed"] is True
    # Only the skipped roles' facts come back: the server runs and exports its own.
    assert real["skip_roles"] == ["ml", "model"] and real["facts"] == {"model_sync_revision": "abc", "ml_fact": "v"}
    assert not Path(params["path"]).exists()
    missing = run_module({**params, "state": "checked"})
    assert missing["run_roles"] == ["ml", "model", "server"] and missing["facts"] == {}
    assert run_module({**params, "state": "absent"})["removed"] is False


def test_the_last_known_good_record_is_kept_and_put_back_after_a_failed_deploy(host):
    params = host["params"]
    path, good = Path(params["path"]), Path(params["path"] + ".good")
    run_module({**params, "state": "recorded"})
    assert run_module({**params, "state": "kept"}, check_mode=True)["kept"] is True and not good.exists()
    assert run_module({**params, "state": "kept"})["kept"] is True
    assert good.read_bytes() == path.read_bytes() and good.stat().st_mode & 0o777 == 0o600
    kept = good.read_bytes()
    # The next deploy (another setting of the server) records its state, then fails: the kept record is back.
    changed = {**params["fingerprint"], "variables of role server": "9"}
    run_module({**params, "state": "recorded", "fingerprint": changed})
    assert path.read_bytes() != kept
    dry = run_module({**params, "state": "reverted"}, check_mode=True)
    assert dry["restored"] is True and path.read_bytes() != kept
    reverted = run_module({**params, "state": "reverted"})
    assert reverted["restored"] is True and reverted["removed"] is False and path.read_bytes() == kept
    # Checked like any record: the host as the last-known-good state left it skips every role.
    assert run_module({**params, "state": "checked"})["converged"] is True
    # Without a record nothing is kept and the older copy goes; a revert then leaves no record.
    path.unlink()
    assert run_module({**params, "state": "kept"})["kept"] is False and not good.exists()
    run_module({**params, "state": "recorded"})
    reverted = run_module({**params, "state": "reverted"})
    assert reverted["restored"] is False and reverted["removed"] is True and not path.exists()


# ------------------------------------------------------------------ the controller's fingerprint


def fingerprint(tmp_path: Path, variables: dict, *args: str, roles_dir: Path | None = None) -> tuple[dict, str]:
    """Run the converged_fingerprint action on a role of tmp_path; returns its parts and the output."""
    result, output = fingerprint_result(tmp_path, variables, *args, roles_dir=roles_dir)
    return result["fingerprint"], output


def fingerprint_result(tmp_path: Path, variables: dict, *args: str, roles_dir: Path | None = None) -> tuple[dict, str]:
    """Run the converged_fingerprint action on role r of tmp_path, or on the roles of ``roles_dir``
    that converged_roles names; returns its result and the output."""
    roles = CONVERGED_ROLES if roles_dir else ["r"]
    roles_dir = roles_dir or tmp_path / "roles"
    role = tmp_path / "roles/r"
    if roles == ["r"] and not role.exists():
        (role / "meta").mkdir(parents=True)
        (role / "tasks").mkdir()
        (role / "tasks/main.yml").write_text("---\n- ansible.builtin.debug: {msg: hi}\n")
        (role / "meta/argument_specs.yml").write_text(
            yaml.safe_dump(
                {
                    "argument_specs": {
                        "main": {
                            "options": {
                                "r_port": {"type": "int"},
                                "r_token": {"type": "str"},
                                "r_derived": {"type": "str"},
                                "r_keep": {"type": "list"},
                            }
                        },
                        "other": {"options": {"r_other": {"type": "str"}}},
                    }
                }
            )
        )
        (tmp_path / "big.bin").write_bytes(b"\0" * (2 << 20))
    # fmt: off
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Fingerprint", "converged_fingerprint": {
            "roles_dir": str(roles_dir), "roles": roles, "ignore_vars": ["r_keep"],
            "paths": [str(tmp_path / "big.bin"), str(tmp_path / "no-such-path")], "facts": {"gpus": []}},
         "register": "fp"},
        {"name": "Show", "ansible.builtin.debug": {"var": "fp"}}]}]
    # fmt: on
    # fmt: off
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_ACTION_PLUGINS=str(ROLE / "action_plugins"),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}",
                           *args, str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # fmt: on
    tasks = json.loads(proc.stdout[proc.stdout.index("{") :])["plays"][0]["tasks"]
    return tasks[-1]["hosts"]["localhost"]["fp"], proc.stdout + proc.stderr


BASE = {"r_port": 8000, "r_token": SECRET, "r_derived": "{{ r_port + 1 }}", "r_keep": ["/a"]}


def changed_parts(before: dict, after: dict) -> list[str]:
    """The parts whose digest differs."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def test_the_fingerprint_follows_documented_variables_role_files_and_controller_paths(tmp_path):
    result, out = fingerprint_result(tmp_path, BASE, "-vvvv")
    first = result["fingerprint"]
    assert SECRET not in out, "a secret value was printed"
    # The role's own parts are its; the controller paths and the host's facts are shared.
    assert result["part_roles"] == {"files of role r": "r", "variables of role r": "r"}
    assert sorted(first) == [
        "controller path " + str(tmp_path / "big.bin"),
        "controller path " + str(tmp_path / "no-such-path"),
        "files of role r",
        "host facts",
        "variables of role r",
    ]
    again, _ = fingerprint(tmp_path, BASE)
    assert again == first, "the same inputs must give the same fingerprint"
    # An ignored variable, or one no role documents, is not an input.
    assert fingerprint(tmp_path, {**BASE, "r_keep": ["/b"], "unrelated": 1})[0] == first
    # A documented variable of any entry point, also through another variable's template.
    for changed in ({"r_token": SECRET + "x"}, {"r_other": "set"}, {"r_port": 8001}):
        assert changed_parts(first, fingerprint(tmp_path, {**BASE, **changed})[0]) == ["variables of role r"], changed
    (tmp_path / "roles/r/tasks/main.yml").write_text("---\n- ansible.builtin.debug: {msg: changed}\n")
    after_edit, _ = fingerprint(tmp_path, BASE)
    assert changed_parts(first, after_edit) == ["files of role r"]
    os.utime(tmp_path / "big.bin", ns=(1, 1))
    assert changed_parts(after_edit, fingerprint(tmp_path, BASE)[0]) == ["controller path " + str(tmp_path / "big.bin")]


def test_a_launch_setting_turned_alone_changes_the_servers_inputs(tmp_path):
    """Each launch setting is a documented variable of inference_server (issue 45): one turned alone
    (-e, host_vars) changes that role's variables part, so the deploy leaves the fast path for it."""
    before, _ = fingerprint(tmp_path, {"inference_server_target_concurrency": 4}, roles_dir=ROOT / "roles")
    after, _ = fingerprint(tmp_path, {"inference_server_target_concurrency": 8}, roles_dir=ROOT / "roles")
    assert changed_parts(before, after) == ["variables of role inference_server"]


def test_a_variable_that_cannot_be_resolved_yet_is_an_input_that_is_stable(tmp_path):
    pending = {**BASE, "r_derived": "{{ fact_set_later.path }}"}
    first, _ = fingerprint(tmp_path, pending)
    assert fingerprint(tmp_path, pending)[0] == first
    assert changed_parts(first, fingerprint(tmp_path, BASE)[0]) == ["variables of role r"]


@pytest.mark.parametrize("drop", ["", "file", "directory"], ids=["as-written", "no-file-fsync", "no-directory-fsync"])
def test_the_record_survives_a_power_cut_once_written(host, monkeypatch, drop):
    """The record, the copy kept as last-known-good's and the one put back: fsync, rename, fsync of the directory."""
    params, good = host["params"], host["params"]["path"] + cs.GOOD_SUFFIX
    with durability.recorded(monkeypatch, drop=drop) as events:
        cs.write_record(params["path"], cs.take_record(params))
    with durability.recorded(monkeypatch, drop=drop) as kept:
        cs.copy_record(params["path"], good)
    lost = durability.lost_on_power_cut(events, params["path"]) + durability.lost_on_power_cut(kept, good)
    assert bool(lost) == bool(drop), lost


def test_the_deploy_imports_each_role_whose_record_the_check_reads():
    """The check reads each role's ``<role>_converged`` from the role's vars, which reach the play only through a
    static ``import_role`` (an ``include_role`` keeps them to itself): deploy.yml and its phase files must import
    every such role somewhere, or the check finds no parts for it and the role runs on every deploy (molecule/default
    found model_sync running on the fast path when its preflight became an include)."""
    phases = [ROOT / "deploy.yml", *sorted((ROOT / "playbooks/tasks").glob("deploy-*.yml"))]
    imported = {
        task[key]["name"] for path in phases for task in boundaries.tasks(path) for key in IMPORTS if key in task
    }
    role_vars = {role: ROOT / f"roles/{role}/vars/main.yml" for role in CONVERGED_ROLES}
    with_parts = [r for r, path in role_vars.items() if path.exists() and f"{r}_converged:" in path.read_text()]
    assert with_parts == ["ml_env", "model_sync", "inference_server"]
    assert [role for role in with_parts if role not in imported] == []


def test_the_collection_code_that_the_deploy_roles_ship_is_an_input():
    """The roles' modules import their code from the collection llm_deploy.inference, outside every role's folder:
    each package that the converged roles' modules (and their dependency llm_host's) import is a controller path of
    the fingerprint, so a deploy whose host code changed leaves the fast path (a package under roles/ was a role
    file before it moved to the collection)."""
    defaults = (ROLE / "defaults/main.yml").read_text()
    paths = [ROOT / rel.lstrip("/") for rel in re.findall(r"_converged_repo ~ '([^']+)'", defaults)]
    imported = {
        (ROOT / "collections/ansible_collections/llm_deploy/inference/plugins/module_utils" / package)
        for role in [*CONVERGED_ROLES, "llm_host"]
        for module in (ROOT / "roles" / role / "library").glob("*.py")
        for package in re.findall(r"llm_deploy\.inference\.plugins\.module_utils\.(\w+)", module.read_text())
    }
    assert len(imported) >= 2, imported  # llm_host_lib (llm_host, last_known_good), model_sync_lib (model_sync)
    assert [str(p) for p in sorted(imported) if not any(p == path or path in p.parents for path in paths)] == []
