"""The unit's ExecStartPre port guard and the interrupted-restart detector (roles/inference_server/files).

port-guard reads /proc like on a host: a real process listens on a real port here. Whether a
holder belongs to the unit is a question of its control group; outside systemd the test
decides it by replacing ``unit_of``. The molecule scenario ``reliability`` runs both for
real in a systemd container (a foreign orphan refused, a left-over of the unit stopped).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import durability
import pytest
import yaml
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import guard, install
from role_files import launcher_as_on_a_host

FILES = Path(__file__).resolve().parents[2] / "roles" / "inference_server" / "files"
# The guard is a subcommand of the roles' one host helper (role llm_host's package, through its
# launcher, run as on a host: -SE), installed as .../port-guard beside the modules it needs.
LAUNCHER = FILES.parents[1] / "llm_host" / "files" / "llm-host"
GUARD = ["-SE", str(launcher_as_on_a_host(LAUNCHER)), "guard"]
INFERENCE_SERVER_VARS = FILES.parent / "vars" / "main.yml"
LISTEN = """import socket, sys, time
s = socket.socket(socket.AF_INET6 if sys.argv[2] == "6" else socket.AF_INET)
s.bind(("::1" if sys.argv[2] == "6" else "127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(60)
"""


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def holder():
    """Start a process that listens on a fresh port (IPv4 or IPv6); yields (process, port)."""
    started = []

    def start(family: str = "4"):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port), family], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "listening"
        started.append(proc)
        return proc, port

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_free_port_passes_silently():
    proc = subprocess.run(
        [sys.executable, *GUARD, str(free_port()), "inference-server"], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("family", ["4", "6"])
def test_a_foreign_holder_is_named_and_left_alone(holder, family):
    if family == "6" and not socket.has_ipv6:
        pytest.fail("this machine has no IPv6 loopback; the guard reads /proc/net/tcp6 too")
    proc, port = holder(family)
    out = subprocess.run([sys.executable, *GUARD, str(port), "inference-server"], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.startswith(f"port-guard: port {port} is already taken by pid {proc.pid} ({sys.executable} -c ")
    assert out.stderr.rstrip().endswith(
        "which is not part of inference-server.service, so inference-server.service will not start: stop that "
        "process or set inference_server_port to a free port."
    )
    assert proc.poll() is None, "a process of another owner must never be stopped"


def test_a_holders_secret_flags_never_reach_the_refusal_or_the_facts(tmp_path):
    """A server run by hand with its key on the command line holds the port: the guard's refusal (the
    journal) and the preflight's port owner (a module result) name it with the key's value masked."""
    port = free_port()
    (tmp_path / "serve.py").write_text(LISTEN)
    keys = ["--api-key", "s3cret-K", "--admin-api-key=s3cret-A"]
    argv = [sys.executable, str(tmp_path / "serve.py"), str(port), "4", *keys]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening"
        out = subprocess.run([sys.executable, *GUARD, str(port), "inference-server"], capture_output=True, text=True)
        assert out.returncode == 1 and f"pid {proc.pid}" in out.stderr
        assert "s3cret" not in out.stderr and "--api-key *** --admin-api-key=***" in out.stderr
        from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import facts

        owner = facts.port_owner(port)
        assert owner["pid"] == proc.pid and "s3cret" not in owner["command"]
        assert owner["command"].endswith("--api-key *** --admin-api-key=***")
    finally:
        proc.kill()
        proc.wait()


def test_a_left_over_of_our_unit_is_stopped_and_the_start_goes_on(holder, monkeypatch, capsys):
    proc, port = holder()
    monkeypatch.setattr(guard, "unit_of", lambda pid: "inference-server.service" if pid == proc.pid else None)
    started = time.monotonic()
    assert guard.guard(port, "inference-server", grace_s=5) == 0
    assert time.monotonic() - started < 5, "SIGTERM was enough"
    assert proc.wait(timeout=5) == -15
    out = capsys.readouterr().out
    assert out.startswith(f"port-guard: port {port} is held by pid {proc.pid} (")
    assert "a process left over in inference-server.service from an earlier run: stopping it." in out
    assert not guard.listening(port)


def test_a_left_over_that_ignores_sigterm_is_killed(holder, monkeypatch):
    stubborn = (
        "import signal, socket, time, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', "
        "flush=True); time.sleep(60)\n"
    )
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", stubborn, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening"
        monkeypatch.setattr(guard, "unit_of", lambda pid: "inference-server.service" if pid == proc.pid else None)
        assert guard.guard(port, "inference-server.service", grace_s=0.5) == 0
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()


def test_usage():
    proc = subprocess.run([sys.executable, *GUARD, "http"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: port-guard PORT UNIT")


def install_port_guard(directory: Path) -> Path:
    """Install the guard as inference_server does: the modules its vars list, the launcher as port-guard."""
    files = yaml.safe_load(INFERENCE_SERVER_VARS.read_text())["_inference_server_helper_lib_files"]
    install.install(str(directory), files)
    installed = directory / "port-guard"
    installed.write_bytes(LAUNCHER.read_bytes())
    installed.chmod(0o755)
    return installed


def test_installed_as_port_guard_it_is_the_guard(tmp_path):
    """The unit runs ``/usr/local/lib/<unit>/port-guard PORT UNIT``: that name alone selects the guard,
    and the modules inference_server installs beside it are all it needs (no site-packages: -SE)."""
    installed = install_port_guard(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-SE", str(installed), str(free_port()), "inference-server"], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = subprocess.run([sys.executable, "-SE", str(installed), "http"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: port-guard PORT UNIT")


def test_install_writes_the_guards_modules_when_they_differ(tmp_path):
    """The module's ``install``: the package's files as loaded, 0644 in a 0755 folder, written when they differ."""
    files = ["__init__.py", "cli.py", "guard.py", "proc.py"]
    lib = tmp_path / install.PACKAGE_DIR
    assert install.install(str(tmp_path), files, check=True) == {
        "changed": True,
        "directory": str(lib),
        "installed": [str(lib / name) for name in files],
        "removed": [],
    }
    assert not lib.exists()
    assert install.install(str(tmp_path), files)["changed"] is True
    package = Path(guard.__file__).parent
    for name in files:
        assert (lib / name).read_bytes() == (package / name).read_bytes()
        assert (lib / name).stat().st_mode & 0o7777 == 0o644
    # Every folder down to the package's: the launcher in tmp_path imports it by its name as a path.
    folders = [tmp_path.joinpath(*install.PACKAGE_DIR.split(os.sep)[:depth]) for depth in range(1, 7)]
    assert folders[-1] == lib and [folder.stat().st_mode & 0o7777 for folder in folders] == [0o755] * 6
    unchanged = {"changed": False, "directory": str(lib), "installed": [], "removed": []}
    assert install.install(str(tmp_path), files) == unchanged
    (lib / "guard.py").write_text("# changed by hand\n")
    (lib / "proc.py").chmod(0o600)
    assert install.install(str(tmp_path), files, check=True)["installed"] == [str(lib / "guard.py")]
    assert (lib / "guard.py").read_text() == "# changed by hand\n"
    assert (lib / "proc.py").stat().st_mode & 0o7777 == 0o600, "check mode changes nothing"
    done = install.install(str(tmp_path), files)
    assert done["changed"] is True and done["installed"] == [str(lib / "guard.py")]
    assert (lib / "proc.py").stat().st_mode & 0o7777 == 0o644
    with pytest.raises(SystemExit, match="not a module file"):
        install.install(str(tmp_path), ["../guard.py"])


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show for started-before.py: a main process that started %(ago)s s ago.
echo "MainPID=%(pid)s"
echo "ExecMainStartTimestampMonotonic=%(mono)s"
"""


def started_before(tmp_path: Path, ago: float, pid: int, files: list[Path]) -> dict:
    """Run started-before.py with a fake systemctl whose main process started ``ago`` seconds ago."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    mono = int((time.clock_gettime(time.CLOCK_MONOTONIC) - ago) * 1e6)
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL % {"ago": ago, "pid": pid, "mono": mono})
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run(
        [sys.executable, str(FILES / "started-before.py"), "inference-server", *map(str, files)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout)


def test_files_newer_than_the_running_process_are_named(tmp_path):
    old, new, missing = tmp_path / "unit", tmp_path / "secrets", tmp_path / "api-key.yaml"
    old.write_text("x")
    new.write_text("y")
    now = time.time()
    os.utime(old, (now - 100, now - 100))
    result = started_before(tmp_path, ago=30, pid=4242, files=[old, new, missing])
    assert result["active"] is True and abs(result["started"] - (now - 30)) < 2
    assert result["newer"] == [str(new)]


def test_a_stopped_unit_has_nothing_pending(tmp_path):
    unit = tmp_path / "unit"
    unit.write_text("x")
    assert started_before(tmp_path, ago=30, pid=0, files=[unit]) == {"active": False, "started": None, "newer": []}


def test_install_removes_an_earlier_versions_copy_but_not_in_check_mode(tmp_path):
    """Earlier versions put the package at ``DIR/llm_host_lib``, a name nothing imports any more."""
    old = tmp_path / "llm_host_lib"
    old.mkdir()
    (old / "guard.py").write_text("# an earlier version\n")
    checked = install.install(str(tmp_path), ["__init__.py", "guard.py"], check=True)
    assert checked["changed"] and checked["removed"] == [str(old)] and (old / "guard.py").exists()
    assert install.install(str(tmp_path), ["__init__.py", "guard.py"])["removed"] == [str(old)]
    assert not old.exists() and (tmp_path / install.PACKAGE_DIR / "guard.py").exists()


@pytest.mark.parametrize("drop", ["", "file", "directory"], ids=["as-written", "no-file-fsync", "no-directory-fsync"])
def test_the_guards_modules_survive_a_power_cut_once_installed(tmp_path, monkeypatch, drop):
    """ExecStartPre=+ runs them as root at the next boot: each is on disk whole when install returns."""
    with durability.recorded(monkeypatch, drop=drop) as events:
        install.install(str(tmp_path), ["__init__.py", "guard.py"])
    lost = [problem for name in ("__init__.py", "guard.py") for problem in
            durability.lost_on_power_cut(events, str(tmp_path / install.PACKAGE_DIR / name))]  # fmt: skip
    assert bool(lost) == bool(drop), lost
