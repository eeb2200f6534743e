"""Hashed locks: pip refuses a wheel whose sha256 the lock does not list, through the very
install step ml_env runs (roles/ml_env/tasks/pip_install.yml, run by ansible-playbook on
localhost against a venv and an offline wheelhouse of tiny wheels), and a lock written by
tools/lock-profile (markers, several hashes, '# via' after the hashes) is one pip reads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from deploytools import build_bundle as bb
from deploytools import lock_profile as lp

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def offline_pip_env() -> dict[str, str]:
    """No pip configuration of this machine (find-links, indexes, constraints): the wheelhouse alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run_install_step(tmp: Path, cases: dict[str, str]) -> dict[str, str]:
    """Run ml_env's install step once per case (name -> lock text) into its own copy of one venv,
    from the wheelhouse <tmp>/cache/wheelhouse/demo; return name -> 'ok' or the failure message."""
    base = tmp / "venv-base"
    subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
    tasks = []
    for name, text in cases.items():
        venv = tmp / "ml-env.d" / name
        shutil.copytree(base, venv, symlinks=True)
        Path(f"{venv}.lock.txt").write_text(text)
        role_vars = {
            "ml_env_venv_dir": str(venv),
            "ml_env_lock": "demo",
            "ml_env_lock_file": f"/controller/locks/demo-{name}.txt",
            "ml_env_wheelhouse": "/controller/wheelhouse/demo",
            "ml_env_host_cache_dir": str(tmp / "cache"),
        }
        record = "{{ outcomes | default({}) | combine({%r: %s}) }}"
        # fmt: off
        tasks.append({"name": f"Case {name}", "block": [
            {"name": "Install", "ansible.builtin.include_role": {"name": "ml_env", "tasks_from": "pip_install.yml"},
             "vars": role_vars},
            {"name": "Passed", "ansible.builtin.set_fact": {"outcomes": record % (name, "'ok'")}}],
            "rescue": [{"name": "Failed", "ansible.builtin.set_fact": {
                "outcomes": record % (name, "ansible_failed_result.msg")}}]})
    tasks.append({"name": "Show", "ansible.builtin.debug": {"var": "outcomes"}})
    (tmp / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = dict(
        offline_pip_env(),
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(tmp / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
    )
    # fmt: on
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plays = json.loads(proc.stdout[proc.stdout.index("{") :])["plays"]
    return plays[0]["tasks"][-1]["hosts"]["localhost"]["outcomes"]


def installed(venv: Path, module: str) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True).returncode == 0


def test_ml_env_refuses_a_wheel_whose_hash_the_lock_does_not_list(
    tmp_path: Path, make_wheel: Callable[..., Path]
) -> None:
    wheel = make_wheel(tmp_path / "cache" / "wheelhouse" / "demo", "h5demo", "1.0")
    good = sha256(wheel)
    wrong = "sha256:" + hashlib.sha256(b"another file").hexdigest()
    entry = bb.LockEntry("h5demo", "1.0", hashes=(good,))
    outcomes = run_install_step(
        tmp_path,
        {
            "good": bb.format_entry(entry, "requested") + "\n",
            "wrong": bb.format_entry(bb.LockEntry("h5demo", "1.0", hashes=(wrong,)), "requested") + "\n",
            "unhashed": "h5demo==1.0\n",
        },
    )
    venvs = tmp_path / "ml-env.d"
    assert outcomes["good"] == "ok" and installed(venvs / "good", "h5demo")
    message = outcomes["wrong"]
    assert message.startswith(f"pip refused to install ml_env_lock 'demo' into {venvs / 'wrong'} because ")
    assert f"h5demo==1.0 has sha256 {good[7:23]}, which /controller/locks/demo-wrong.txt does not list" in message
    assert "(THESE PACKAGES DO NOT MATCH THE HASHES)" in message
    assert "the wheelhouse /controller/wheelhouse/demo holds another file than the lock was made from" in message
    assert "tools/build-bundle --lock /controller/locks/demo-wrong.txt --out /controller/wheelhouse/demo" in message
    assert "\n" not in message.strip() and not installed(venvs / "wrong", "h5demo")
    assert outcomes["unhashed"] == (
        f"pip refused to install ml_env_lock 'demo' into {venvs / 'unhashed'} because "
        "/controller/locks/demo-unhashed.txt pins h5demo==1.0 without --hash=sha256 and ml_env installs only "
        "files pinned by hash (--require-hashes): add the hashes with tools/lock-profile --hash-only "
        "/controller/locks/demo-unhashed.txt."
    )
    assert not installed(venvs / "unhashed", "h5demo")


def test_a_lock_written_by_lock_profile_is_read_by_pip_with_require_hashes(
    tmp_path: Path, make_wheel: Callable[..., Path]
) -> None:
    house = tmp_path / "wheelhouse"
    # h5app 1.0 has a wheel only Python 3.10 takes (py310) and one for the others (py3): two hashes.
    app310, app3 = make_wheel(house, "h5app", "1.0", "py310-none-any"), make_wheel(house, "h5app", "1.0")
    lib1, lib2 = make_wheel(house, "h5lib", "1.0"), make_wheel(house, "h5lib", "2.0")

    def item(path: Path, version: str, requires: list[str], requested: bool) -> dict:
        name = path.name.split("-")[0]
        return {
            "requested": requested,
            "metadata": {"name": name, "version": version, "requires_dist": requires},
            "download_info": {"url": path.as_uri(), "archive_info": {}},  # a local file: read for its sha256
        }

    reports = {
        py: {
            "environment": bb.marker_environment(py),
            "install": [item(app, "1.0", ["h5lib"], True), item(lib, v, [], False)],
        }
        for py, app, lib, v in (("3.10", app310, lib1, "1.0"), ("3.12", app3, lib2, "2.0"))
    }
    text = lp.render(
        "t", ["h5app==1.0"], ["3.10", "3.12"], [], "https://example.invalid/simple", lp.merge(reports), Path("x")
    )
    lp.check(text, reports)
    first, second = sorted([sha256(app310), sha256(app3)])
    assert f"h5app==1.0 \\\n    --hash={first} \\\n    --hash={second}\n    # requested\n" in text
    assert f'h5lib==1.0 ; python_version < "3.12" \\\n    --hash={sha256(lib1)}\n    # via h5app\n' in text
    lock = tmp_path / "lock.txt"
    lock.write_text(text)

    def pip_dry_run(python: str) -> subprocess.CompletedProcess[str]:
        # That Python's own pip: pip evaluates the markers for the interpreter it runs under.
        # fmt: off
        cmd = [bb.find_interpreter(python), "-m", "pip", "install", "--dry-run", "--require-hashes", "--no-deps",
               "--no-index", "--find-links", str(house), "--python-version", python, "--only-binary=:all:",
               "--target", str(tmp_path / f"t{python}"), "-r", str(lock)]
        # fmt: on
        return subprocess.run(cmd, capture_output=True, text=True, env=offline_pip_env())

    for python, app, lib in (("3.10", app310, lib1), ("3.12", app3, lib2)):
        done = pip_dry_run(python)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Processing {app}" in done.stdout and f"Processing {lib}" in done.stdout, done.stdout
    lock.write_text(text.replace(sha256(lib2), "sha256:" + "0" * 64))
    done = pip_dry_run("3.12")
    assert done.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert pip_dry_run("3.10").returncode == 0  # 3.10 installs h5lib 1.0, whose hash is intact
