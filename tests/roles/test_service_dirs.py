"""inference_server's tasks/service_dirs.yml: root makes the service account's state and cache
directories, and never follows a link the account could have put inside them (issue 44, item 1).

The role's task file runs through ansible-playbook on localhost, as root, on a real tree under
/tmp, with ``nobody:nogroup`` as the service account: the account owns the cache directory and
puts a link to a root-owned victim directory where the role expects ``huggingface`` (or
``huggingface/hub``), or another account left the directory with a link and a hard link to
root's files in it. The victim's owner and mode must not move.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import service_dirs as service_dirs_lib
from role_files import run_role_tasks, task_results

SERVICE = ("nobody", "nogroup")
SERVICE_IDS = (65534, 65534)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand directories to another account")


@pytest.fixture
def base(searchable_tmp: Path) -> Path:
    """A directory every account can search, with a root-owned victim in it (``victim/passwd``)."""
    (searchable_tmp / "victim").mkdir(mode=0o755)
    (searchable_tmp / "victim" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (searchable_tmp / "victim" / "passwd").chmod(0o644)
    (searchable_tmp / "controller").mkdir()
    return searchable_tmp


def service_dirs(base: Path, check_mode: bool = False) -> subprocess.CompletedProcess[str]:
    """Run tasks/service_dirs.yml for state ``base/state`` and cache ``base/cache``, the account nobody."""
    variables = {
        "inference_server_user": SERVICE[0],
        "inference_server_group": SERVICE[1],
        "inference_server_state_dir": str(base / "state"),
        "inference_server_cache_dir": str(base / "cache"),
    }
    return run_role_tasks(base / "controller", variables, ["service_dirs.yml"], check_mode=check_mode, json_output=True)


def failure(run: subprocess.CompletedProcess[str]) -> str:
    """The message of the task that failed, whitespace-normalised ('' when none did)."""
    failed = [result for _, result in task_results(run) if result.get("failed")]
    return " ".join(str(failed[-1].get("msg", "")).split()) if failed else ""


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    """uid, gid and permission bits of ``path`` itself (a link is not followed)."""
    st = path.lstat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def give_to_service(*paths: Path) -> None:
    """Make each of ``paths`` a directory of the service account, 0750, as the role leaves it."""
    for path in paths:
        path.mkdir(exist_ok=True)
        os.chown(path, *SERVICE_IDS)
        path.chmod(0o750)


VICTIM = (0, 0, 0o755)


@pytest.mark.parametrize("check_mode", [False, True], ids=["deploy", "check-mode"])
@pytest.mark.parametrize("where", ["huggingface", "huggingface/hub"])
def test_a_link_the_service_put_in_its_cache_is_refused_and_its_target_keeps_its_owner(base, where, check_mode):
    """The issue's repro: as the service account, replace huggingface (or hub) with a link to a root directory."""
    cache = base / "cache"
    give_to_service(base / "state", cache, *([cache / "huggingface"] if where != "huggingface" else []))
    (cache / where).symlink_to(base / "victim")
    run = service_dirs(base, check_mode)
    assert owner_and_mode(base / "victim") == VICTIM, "root followed the service's link and handed the victim over"
    assert owner_and_mode(base / "victim" / "passwd") == (0, 0, 0o644)
    assert run.returncode != 0, "a link where the service's directory must be was not refused"
    parent = (cache / where).parent
    assert failure(run) == (
        f"{cache / where} is a symbolic link to {base / 'victim'}, where inference_server_cache_dir needs a "
        f"directory: {parent} can be written by nobody, who could have put it there, so root follows no link "
        f"and changed nothing there; remove {cache / where} and deploy again."
    ), run.stdout[-3000:]
    assert (cache / where).is_symlink(), "the refusal changes nothing, the link included"


def test_a_file_where_the_cache_needs_a_directory_is_refused(base):
    cache = base / "cache"
    give_to_service(base / "state", cache)
    (cache / "huggingface").write_text("not a directory")
    run = service_dirs(base)
    assert run.returncode != 0
    assert failure(run).startswith(
        f"{cache / 'huggingface'} is a regular file, where inference_server_cache_dir needs a directory: "
    ), run.stdout[-3000:]


def test_what_another_account_left_is_handed_over_without_following_its_links(base):
    """Moving a host off root: the cache belongs to root and holds JIT entries, a symbolic link
    and a hard link to root's files (as another account could have left them)."""
    cache = base / "cache"
    (cache / "triton" / "abc").mkdir(parents=True)
    cache.chmod(0o755)
    (cache / "triton" / "abc" / "kernel.so").write_bytes(b"\x7fELF")
    (cache / "triton" / "abc" / "kernel.so").chmod(0o640)
    (cache / "escape").symlink_to(base / "victim")
    os.link(base / "victim" / "passwd", cache / "passwd-link")
    run = service_dirs(base)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert owner_and_mode(base / "victim") == VICTIM, "root followed a link it handed over"
    assert owner_and_mode(base / "victim" / "passwd")[:2] == (0, 0), "root handed over a hard link to a root file"
    assert owner_and_mode(cache / "triton" / "abc" / "kernel.so") == (*SERVICE_IDS, 0o640), "modes are kept"
    assert owner_and_mode(cache / "triton" / "abc")[:2] == SERVICE_IDS
    assert owner_and_mode(cache / "escape")[:2] == SERVICE_IDS, "the link itself is handed over (lchown)"
    for path in (cache, base / "state", cache / "huggingface", cache / "huggingface" / "hub"):
        assert owner_and_mode(path) == (*SERVICE_IDS, 0o750), path


def test_a_new_host_gets_the_four_directories_once_and_check_mode_writes_nothing(base):
    checked = service_dirs(base, check_mode=True)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert not (base / "cache").exists() and not (base / "state").exists()
    assert any(result.get("changed") for _, result in task_results(checked))
    first = service_dirs(base)
    assert first.returncode == 0, first.stdout[-3000:]
    for path in (
        base / "state",
        base / "cache",
        base / "cache" / "huggingface",
        base / "cache" / "huggingface" / "hub",
    ):
        assert owner_and_mode(path) == (*SERVICE_IDS, 0o750), path
    again = service_dirs(base)
    assert again.returncode == 0 and not any(result.get("changed") for _, result in task_results(again))


def test_an_operators_link_in_a_directory_of_root_alone_is_followed(base):
    """/var/cache may hold a link to a larger disk: root alone writes there, so the link is the operator's."""
    (base / "disk" / "cache").mkdir(parents=True)
    (base / "var").mkdir(mode=0o755)
    (base / "var" / "cache").symlink_to(base / "disk" / "cache")
    found = service_dirs_lib.service_dirs(
        [*SERVICE, f"inference_server_cache_dir={base / 'var' / 'cache' / 'inference-server'}"]
    )
    assert found["refused"] is None and found["made"] == [str(base / "disk" / "cache" / "inference-server")]
    assert owner_and_mode(base / "disk" / "cache" / "inference-server") == (*SERVICE_IDS, 0o750)
    assert (base / "var" / "cache").is_symlink()


def test_a_link_in_a_directory_its_group_can_write_is_refused(base):
    shared = base / "shared"
    shared.mkdir()
    os.chown(shared, 0, 65534)
    shared.chmod(0o775)
    (shared / "cache").symlink_to(base / "victim")
    found = service_dirs_lib.service_dirs([*SERVICE, f"inference_server_cache_dir={shared / 'cache'}"])
    assert "can be written by the group nogroup, who could have put it there" in found["refused"]
    assert found["changed"] is False and owner_and_mode(base / "victim") == VICTIM


def test_check_mode_before_the_account_exists_says_what_it_would_make_and_still_refuses_a_link(base):
    """tasks/access.yml runs it in check mode before account.yml has created the account."""
    new = ["svc-not-created", "svc-not-created", f"inference_server_cache_dir={base / 'cache'}"]
    assert service_dirs_lib.service_dirs(new, check=True) == {
        "changed": True,
        "made": [str(base / "cache")],
        "settled": [],
        "handed_over": {},
        "kept": 0,
        "refused": None,
    }
    assert not (base / "cache").exists()
    give_to_service(base / "cache")
    (base / "cache" / "huggingface").symlink_to(base / "victim")
    found = service_dirs_lib.service_dirs(
        [*new, f"inference_server_cache_dir={base / 'cache' / 'huggingface'}"], check=True
    )
    assert found["refused"].startswith(f"{base / 'cache' / 'huggingface'} is a symbolic link to {base / 'victim'}")
