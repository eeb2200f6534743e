"""ml_env builds a venv the service account can run whatever root's umask is (issue 44, item 6):
under ``umask 077`` the venv came out 0700 and the server's start failed with 203/EXEC.

ml_env's build (roles/ml_env/tasks/pip.yml: the venv, the locked install from an offline
wheelhouse of one tiny wheel, the import proof) runs through ansible-playbook on localhost
under umask 077; then every directory and file of the venv must be open to other accounts, and
``nobody`` must run its python and import the package (setpriv, the kernel's own answer).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from deploytools import build_bundle as bb
from role_files import run_role_tasks
from test_install_hashes import offline_pip_env, sha256

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to try the account for real"
)


def closed_to_others(venv: Path) -> list[str]:
    """The venv's directories others cannot list and enter, and its files others cannot read."""
    closed = [] if venv.stat().st_mode & 0o005 == 0o005 else [str(venv)]
    for root, dirs, files in os.walk(venv):
        for name in dirs + files:
            st = os.lstat(Path(root, name))
            need = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & need != need:
                closed.append(f"{Path(root, name)} {stat.S_IMODE(st.st_mode):04o}")
    return closed


def test_a_venv_built_under_umask_077_can_be_run_by_the_service_account(
    searchable_tmp: Path, make_wheel: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = searchable_tmp
    wheelhouse = base / "controller" / "wheelhouse" / "demo"
    wheel = make_wheel(wheelhouse, "u44demo", "1.0")
    venv = base / "opt" / "ml-env.d" / "0123456789ab"
    venv.parent.mkdir(parents=True)
    venv.parent.chmod(0o755)
    (base / "opt").chmod(0o755)
    entry = bb.LockEntry("u44demo", "1.0", hashes=(sha256(wheel),))
    Path(f"{venv}.lock.txt").write_text(bb.format_entry(entry, "requested") + "\n")
    variables = {
        "ml_env_venv_dir": str(venv),
        "ml_env_lock": "demo",
        "ml_env_lock_sha256": "0" * 64,
        "ml_env_lock_file": "/controller/locks/demo.txt",
        "ml_env_wheelhouse": str(wheelhouse),
        "ml_env_host_cache_dir": str(base / "cache"),
        "ml_env_python": "/usr/bin/python3",
        "ml_env_engine_package": "u44demo",
        "ml_env_system_packages": [],
        "_ml_env_state": {"extra": []},
    }
    for name, value in offline_pip_env().items():
        monkeypatch.setenv(name, value)
    (base / "controller" / "play").mkdir()
    # Root proves the venv with python -c, which puts the current directory first on sys.path: a
    # module of the engine's name planted there must not be what it imports (issue 51, item 6).
    marker = base / "planted-module-ran"
    (base / "controller" / "play" / "u44demo.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(base / "controller" / "play")
    run = run_role_tasks(
        base / "controller" / "play", variables, ["pip.yml"], check_mode=False, role="ml_env", umask=0o077
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (venv / "lib").exists() and closed_to_others(venv) == []
    assert not marker.exists(), "the import proof imported the current directory's module"
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(venv / "bin" / "python")]
    ran = subprocess.run(
        [*as_nobody, "-c", "import sys, u44demo; print(sys.prefix)"], capture_output=True, text=True, cwd="/"
    )
    assert ran.returncode == 0 and ran.stdout.strip() == str(venv), ran.stderr
