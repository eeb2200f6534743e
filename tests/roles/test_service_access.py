"""inference_server's files/service-access.py: can the service account reach the venv, the model
and its own directories? Its verdicts are compared with the kernel's own answer for the same
account (setpriv as nobody, on real directories), so the permission arithmetic cannot drift."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from role_files import run_role_tasks, task_results

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles/inference_server/files/service-access.py"
NOBODY = ("nobody", "nogroup")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to try the account for real"
)


def access(*args: str, user: tuple[str, str] = NOBODY) -> dict:
    """Run the script as the precheck does; its JSON."""
    out = subprocess.run([sys.executable, str(SCRIPT), *user, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def kernel_allows(path: Path, test: str) -> bool:
    """Whether nobody (no supplementary group) passes ``test -<test> path`` for real."""
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "test", f"-{test}", str(path)]
    return subprocess.run(argv, check=False).returncode == 0


@pytest.fixture
def base(searchable_tmp: Path) -> Path:
    """The tree's root: a directory every account can search."""
    return searchable_tmp


def tree(base: Path, home_mode: int) -> tuple[Path, Path]:
    """``<base>/root`` (mode ``home_mode``, as /root) holding a venv-like directory and a model."""
    home = base / "root"
    (home / "ml-env" / "bin").mkdir(parents=True)
    (home / "models" / "Qwen").mkdir(parents=True)
    (home / "models" / "Qwen" / "config.json").write_text("{}")
    home.chmod(home_mode)
    return home / "ml-env", home / "models" / "Qwen"


def test_a_venv_and_model_under_a_0700_home_are_refused_where_the_kernel_refuses(base):
    venv, model = tree(base, 0o700)
    found = access(f"--read=ml_env_path={venv}", f"--read=model_sync_source.path={model}")
    assert [(p["variable"], p["blocked_at"], p["mode"], p["owner"], p["need"]) for p in found["problems"]] == [
        ("ml_env_path", str(base / "root"), "0700", "root", "search (x)"),
        ("model_sync_source.path", str(base / "root"), "0700", "root", "search (x)"),
    ]
    assert not kernel_allows(venv, "x") and not kernel_allows(model / "config.json", "r")


def test_the_same_tree_opened_to_others_passes_as_it_does_for_the_kernel(base):
    venv, model = tree(base, 0o755)
    found = access(f"--read=ml_env_path={venv}", f"--read=model_sync_source.path={model}")
    assert found["problems"] == []
    assert kernel_allows(venv, "x") and kernel_allows(model / "config.json", "r")


def test_a_link_into_a_closed_directory_is_followed(base):
    venv, _ = tree(base, 0o700)
    link = base / "ml-env"
    link.symlink_to(venv)
    found = access(f"--read=ml_env_path={link}")
    assert [p["blocked_at"] for p in found["problems"]] == [str(base / "root")]
    assert not kernel_allows(link / "bin", "x")


def test_the_group_of_the_account_opens_a_0750_directory(base):
    venv, _ = tree(base, 0o750)
    os.chown(base / "root", 0, 65534)
    assert access(f"--read=ml_env_path={venv}")["problems"] == []
    # An account in another group (a new one, not created yet) is still refused there.
    other = access(f"--read=ml_env_path={venv}", user=("svc-not-created", "svc-not-created"))
    assert [p["blocked_at"] for p in other["problems"]] == [str(base / "root")]


def test_own_directories_need_only_their_parents_and_may_not_exist_yet(base):
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    (base / "state").mkdir(mode=0o700)  # the role hands it to the account (owner, 0750)
    found = access(
        f"--own=inference_server_state_dir={base / 'state'}",
        f"--own=inference_server_cache_dir={base / 'cache' / 'deep'}",
        f"--own=inference_server_cache_dir={closed / 'cache'}",
    )
    assert [(p["variable"], p["blocked_at"]) for p in found["problems"]] == [
        ("inference_server_cache_dir", str(closed))
    ]


def test_root_reaches_everything(base):
    venv, _ = tree(base, 0o700)
    assert access(f"--read=ml_env_path={venv}", user=("root", "root"))["problems"] == []


def test_device_nodes_name_their_group_when_not_world_read_write(base):
    """Real character devices (mknod, as the NVIDIA driver's nodes): 0666 needs nothing, 0660 video
    needs video, 0600 root needs what no account can be given."""
    nodes = {"nvidia0": (0o666, 0), "nvidia1": (0o660, 44), "nvidiactl": (0o600, 0)}
    try:
        for name, (mode, gid) in nodes.items():
            os.mknod(base / name, 0o020000 | mode, os.makedev(1, 3))
            os.chown(base / name, 0, gid)
            os.chmod(base / name, mode)
    except PermissionError:
        pytest.skip("no CAP_MKNOD here")
    found = access(f"--devices={base}/nvidia*")
    assert found["device_groups"] == [
        subprocess.run(["getent", "group", "44"], capture_output=True, text=True).stdout.split(":")[0] or "44"
    ]
    assert [(p["path"], p["mode"]) for p in found["device_problems"]] == [(str(base / "nvidiactl"), "0600")]


def venv_under(base: Path, umask: int) -> Path:
    """A real venv (no pip) made under ``umask``, at ``<base>/opt/ml-env.d/<hash>`` as ml_env makes it."""
    venv = base / "opt" / "ml-env.d" / "0123456789ab"
    venv.parent.mkdir(parents=True)
    for path in (base / "opt", venv.parent):
        path.chmod(0o755)
    make = f"umask {umask:03o} && exec /usr/bin/python3 -m venv --without-pip {venv}"
    subprocess.run(["sh", "-c", make], check=True)
    return venv


def kernel_runs(venv: Path) -> bool:
    """Whether nobody runs the venv's python as that venv and lists its site-packages, for real."""
    # Debian's site.getsitepackages() also names dist-packages directories that need not exist.
    code = "import os, site, sys; assert sys.prefix == sys.argv[1]"
    code += "; [os.listdir(p) for p in site.getsitepackages() if os.path.exists(p)]"
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(venv / "bin" / "python")]
    return subprocess.run([*argv, "-c", code, str(venv)], capture_output=True).returncode == 0


@pytest.mark.parametrize("closed", ["umask 077", "pyvenv.cfg", "site-packages"])
def test_a_venv_the_account_cannot_run_is_refused_where_the_kernel_refuses(base, closed):
    """Issue 44: built under root's umask 077 (or closed in part), the venv fails the start with 203/EXEC."""
    venv = venv_under(base, 0o077 if closed == "umask 077" else 0o022)
    site_packages = next(venv.glob("lib/python3*/site-packages"))
    blocked = {"umask 077": (venv, "search (x)"), "pyvenv.cfg": (venv / "pyvenv.cfg", "read")}
    blocked["site-packages"] = (site_packages, "read")
    (venv / "pyvenv.cfg").chmod(0o600 if closed == "pyvenv.cfg" else 0o644)
    site_packages.chmod(0o700 if closed != "pyvenv.cfg" else 0o755)
    found = access(f"--venv=ml_env_path={venv}")
    assert not kernel_runs(venv)
    assert [(p["variable"], p["path"], p["blocked_at"], p["need"]) for p in found["venv_problems"]] == [
        ("ml_env_path", str(venv), str(blocked[closed][0]), blocked[closed][1])
    ]
    assert found["problems"] == []


def test_a_venv_built_under_umask_022_passes_as_it_does_for_the_kernel_and_one_not_built_yet_too(base):
    venv = venv_under(base, 0o022)
    found = access(f"--venv=ml_env_path={venv}", f"--venv=ml_env_path={venv.parent / 'not-built-yet'}")
    assert found["venv_problems"] == [] and found["problems"] == []
    assert kernel_runs(venv)


def test_a_venv_beyond_a_closed_directory_is_a_problem_of_reach(base):
    venv = venv_under(base, 0o022)
    (base / "opt").chmod(0o700)
    found = access(f"--venv=ml_env_path={venv}")
    assert [(p["variable"], p["blocked_at"]) for p in found["problems"]] == [("ml_env_path", str(base / "opt"))]
    assert found["venv_problems"] == []


def access_check_refusal(base: Path, model: Path, venv: Path, link: Path | None = None) -> str:
    """tasks/access.yml as deploy.yml runs it (ansible-playbook on localhost), nobody as the account, with the
    host_path ``model``, the lock's ``venv`` and the venv link ``link``: the sentence it stopped with (it must)."""
    (base / "controller").mkdir()
    variables = {
        "inference_server_user": "nobody",
        "inference_server_group": "nogroup",
        "inference_server_supplementary_groups": [],
        "inference_server_gpu_devices": [],
        "inference_server_state_dir": str(base / "state"),
        "inference_server_cache_dir": str(base / "cache"),
        "ml_env_path": str(link or ""),
        "ml_env_venv_dir": str(venv),
        "model_sync_source": {"type": "host_path", "path": str(model)},
        "model_sync_root": str(base / "srv"),
        "model_sync_name": "model",
    }
    run = run_role_tasks(base / "controller", variables, ["access.yml"], check_mode=False, json_output=True)
    failed = [result for _, result in task_results(run) if result.get("failed")]
    assert run.returncode != 0 and failed, run.stdout[-3000:]
    return " ".join(failed[-1]["msg"].split())


def test_the_roles_access_check_refuses_a_closed_venv_with_one_sentence_before_anything_changes(base):
    """tasks/access.yml as deploy.yml runs it (ansible-playbook on localhost), nobody as the account."""
    venv = venv_under(base, 0o077)
    (base / "opt" / "ml-env").symlink_to(venv)
    model = base / "srv" / "model"
    model.mkdir(parents=True)
    for path in (base / "srv", model):
        path.chmod(0o755)
    link = base / "opt" / "ml-env"
    assert access_check_refusal(base, model, venv, link) == (
        f"inference_server_user nobody cannot run the python of ml_env_path's venv {link} ({link} is 0700 "
        "root:root, it needs search (x)), so the server could not start (203/EXEC): open the venv to other accounts "
        f"with chmod -R go+rX {link} (it was built under a umask that closed it; ml_env builds venvs open since "
        "issue 44) or remove it so that ml_env builds it again; nothing was stopped or changed."
    )
    assert not (base / "state").exists() and not (base / "cache").exists()


def model_tree(base: Path) -> Path:
    """``<base>/srv/model``: a model root owns and alone may change (0755 directories, 0644 files)."""
    model = base / "srv" / "model"
    (model / "sub").mkdir(parents=True)
    for name in ("config.json", "modeling_x.py", "sub/w.safetensors"):
        (model / name).write_text("x")
        (model / name).chmod(0o644)
    for path in (base / "srv", model, model / "sub"):
        path.chmod(0o755)
    return model


@pytest.mark.parametrize("change", ["file owner", "group-writable", "world-writable directory", "directory above",
                                    "link target"])  # fmt: skip
def test_a_model_another_account_can_change_is_one_root_must_not_run(base, change):
    """Issue 51, item 4: the engine's check runs as root and imports the model's own code; a tree that
    nobody may change (as the kernel says: setpriv as nobody, test -w) is reported, naming where and who."""
    model = model_tree(base)
    nobody, nogroup = NOBODY
    target = {
        "file owner": model / "modeling_x.py",
        "group-writable": model / "modeling_x.py",
        "world-writable directory": model / "sub",
        "directory above": base / "srv",
        "link target": base / "elsewhere.py",
    }[change]
    if change == "file owner":
        shutil.chown(target, user=nobody)
    elif change == "group-writable":
        shutil.chown(target, group=nogroup)
        target.chmod(0o664)
    elif change == "world-writable directory":
        target.chmod(0o777)
    elif change == "directory above":
        shutil.chown(target, user=nobody)
    else:
        target.write_text("x")
        shutil.chown(target, user=nobody)
        (model / "modeling_y.py").symlink_to(target)
    by = {"group-writable": f"group {nogroup}", "world-writable directory": "everyone"}.get(change, nobody)
    assert kernel_allows(target, "w")
    found = access(f"--root-runs=model_sync_source.path={model}")
    assert [(p["variable"], p["writable_at"], p["by"]) for p in found["root_runs_problems"]] == [
        ("model_sync_source.path", str(target), by)
    ]


def test_a_model_root_alone_can_change_passes_also_below_a_sticky_directory(base):
    sticky = base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    model = model_tree(sticky)
    found = access(f"--root-runs=model_sync_source.path={model}", f"--root-runs=x={base / 'not-there-yet'}")
    assert found["root_runs_problems"] == []
    assert not kernel_allows(model / "modeling_x.py", "w")


def test_the_roles_access_check_refuses_a_model_the_account_can_change_before_anything_changes(base):
    """tasks/access.yml as deploy.yml runs it, nobody as the account and the owner of the model's code."""
    model = model_tree(base)
    shutil.chown(model / "modeling_x.py", user=NOBODY[0])
    assert access_check_refusal(base, model, base / "opt" / "not-built-yet") == (
        f"model_sync_source.path {model} can be changed by nobody ({model / 'modeling_x.py'} is 0644 nobody:root), "
        "but root runs code from it (the engine's check imports the model's own code and runs the venv's python): "
        "make it root's and writable by root alone (chown -R root:root and chmod -R go-w, the directories above it "
        "too) or let model_sync copy the model (a controller_dir, mirror or hub source); nothing was stopped or "
        "changed."
    )
    assert not (base / "state").exists() and not (base / "cache").exists()
