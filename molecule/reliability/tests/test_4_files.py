"""testinfra: after every case, the host serves as the dedicated non-root user, with the files
the deploy owns in the right hands (the secrets test left an API key and an HF token set)."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, UNIT, record

# The files of llm_host_lib that the port guard imports, as the role installs them: beside the guard,
# under the package's import name as a path (the launcher imports it by that name), each folder root's.
GUARD_FILES = yaml.safe_load((REPO / "roles/inference_server/vars/main.yml").read_text())[
    "_inference_server_helper_lib_files"
]
GUARD_FOLDERS = [
    f"/usr/local/lib/{UNIT}/"
    + "/".join("ansible_collections/llm_deploy/inference/plugins/module_utils/llm_host_lib".split("/")[:depth])
    for depth in range(1, 7)
]
# path -> (type, user, group, mode)
EXPECTED = {
    f"/etc/systemd/system/{UNIT}.service": ("file", "root", "root", 0o644),
    f"/etc/{UNIT}": ("directory", "root", "inference", 0o750),
    f"/etc/{UNIT}/secrets.env": ("file", "root", "root", 0o600),
    f"/etc/{UNIT}/api-key.yaml": ("file", "root", "inference", 0o640),
    # The deploy's own state, root's only (issue 26 item 6).
    f"/var/lib/{UNIT}-deploy": ("directory", "root", "root", 0o700),
    f"/var/lib/{UNIT}-deploy/gate": ("directory", "root", "root", 0o700),
    f"/var/lib/{UNIT}-deploy/gate/latest.json": ("file", "root", "root", 0o600),
    f"/var/lib/{UNIT}-deploy/converged.json": ("file", "root", "root", 0o600),
    f"/var/lib/{UNIT}-deploy/last-known-good": ("directory", "root", "root", 0o700),
    f"/var/lib/{UNIT}-deploy/last-known-good/secrets.env": ("file", "root", "root", 0o600),
    f"/var/lib/{UNIT}-deploy/last-known-good/api-key.yaml": ("file", "root", "root", 0o600),
    f"/var/lib/{UNIT}": ("directory", "inference", "inference", 0o750),
    f"/var/cache/{UNIT}": ("directory", "inference", "inference", 0o750),
    f"/usr/local/lib/{UNIT}/port-guard": ("file", "root", "root", 0o755),
    # The port guard's package: run as root (ExecStartPre=+), so nobody else may write it.
    **{folder: ("directory", "root", "root", 0o755) for folder in GUARD_FOLDERS},
    **{f"{GUARD_FOLDERS[-1]}/{name}": ("file", "root", "root", 0o644) for name in GUARD_FILES},
}


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_owner_and_mode(host, path: str) -> None:
    kind, user, group, mode = EXPECTED[path]
    found = host.file(path)
    record(
        "files",
        path=path,
        expected=f"{kind} {user}:{group} {mode:04o}",
        found=f"{'directory' if found.is_directory else 'file' if found.is_file else 'missing'} "
        f"{found.user}:{found.group} {found.mode:04o}"
        if found.exists
        else "missing",
    )
    assert found.exists, path
    assert found.is_directory if kind == "directory" else found.is_file, path
    assert (found.user, found.group, found.mode) == (user, group, mode)


def test_the_server_runs_as_a_dedicated_non_root_user(host) -> None:
    user = host.user("inference")
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    runs_as = host.run(f"ps -o user= -p {pid}").stdout.strip()
    record(
        "files",
        path=f"{UNIT}.service main process",
        expected="user inference (uid < 1000, nologin)",
        found=f"user {runs_as} (uid {user.uid}, shell {user.shell})",
        ok=runs_as == "inference" and 0 < user.uid < 1000 and user.shell == "/usr/sbin/nologin",
    )
    assert host.service(UNIT).is_running
    assert runs_as == "inference" and user.uid != 0 and user.uid < 1000
    assert user.shell == "/usr/sbin/nologin"


def test_the_service_user_cannot_read_the_secrets_file(host) -> None:
    denied = host.run(f"setpriv --reuid=inference --regid=inference --clear-groups cat /etc/{UNIT}/secrets.env")
    readable = host.run(f"setpriv --reuid=inference --regid=inference --init-groups cat /etc/{UNIT}/api-key.yaml")
    assert denied.rc != 0 and "Permission denied" in denied.stderr
    assert readable.rc == 0 and readable.stdout.startswith("#")


def test_no_deploy_lock_is_left(host) -> None:
    assert not host.file("/run/llm-deploy/deploy.lock").exists
