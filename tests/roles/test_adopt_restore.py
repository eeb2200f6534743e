"""The rescue's rollback to a server run by hand never opens that server's log as root (issue 51, item 3).

``llm_host_lib.adopt.restore`` starts the recorded server again under a transient unit
(systemd-run), as its own user, with its output appended to its old log files. Before, it asked
systemd for ``StandardOutput=append:<log>``, which systemd opens itself, as root, following links:
the by-hand user replaced the log with a link to a root-owned file, and root appended the server's
output (which that user controls) to it.

systemd-run is played here by tests/roles/fake_systemd_run.py as systemd runs a transient service:
it opens the ``Standard*=append:`` files as root, then starts the command as ``--uid``/``--gid``
(setpriv) in ``--working-directory``. The server is a small program that prints a line and waits.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import adopt

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to start the server as its user"
)
SERVER = "import sys, time; print('served by hand', flush=True); time.sleep(30)"
# What the server runs with: a Python that user nobody may run (this test's venv may sit where it cannot).
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def by_hand(searchable_tmp: Path, monkeypatch: pytest.MonkeyPatch):
    """A recorded by-hand server of user nobody, its home and log where nobody can reach them; systemd-run played."""
    tmp_path = searchable_tmp
    nobody = pwd.getpwnam("nobody")
    home = tmp_path / "home-ml"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("systemd-run", "systemctl"):
        run = f"sys.path.insert(0, {str(HERE)!r})\nimport fake_systemd_run\nsys.exit(fake_systemd_run.main({name!r}))"
        (bin_dir / name).write_text(f"#!{sys.executable}\nimport sys\n{run}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD_STATE", str(tmp_path / "systemd.json"))
    state_dir = tmp_path / "adopt"
    state_dir.mkdir()
    (state_dir / "by-hand.env").write_text("")
    started = []

    def record(log: Path) -> dict:
        state = {"pid": 2**22 + 1, "start_ticks": 1, "argv": [SYSTEM_PYTHON, "-c", SERVER], "port": 30000}
        state.update(uid=nobody.pw_uid, gid=nobody.pw_gid, cwd=str(home), stdout=str(log), stderr=str(log))
        (state_dir / "by-hand.json").write_text(json.dumps(state))
        done = adopt.restore(str(state_dir), "llm-by-hand-test", "")
        if int(done.get("pid") or 0) > 1:
            started.append(int(done["pid"]))
        time.sleep(0.5)
        return done

    yield home, tmp_path, record
    for pid in started:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_a_log_replaced_by_a_link_to_a_root_file_is_not_appended_to(by_hand):
    home, tmp_path, record = by_hand
    canary = tmp_path / "root-owned"
    canary.write_text("root's own\n")
    canary.chmod(0o644)
    (home / "s.log").symlink_to(canary)
    done = record(home / "s.log")
    assert done["started"] and done["same_argv"], done
    assert canary.read_text() == "root's own\n", "root appended the by-hand server's output to a root-owned file"
    assert canary.stat().st_uid == 0 and (canary.stat().st_mode & 0o777) == 0o644


def test_the_servers_own_log_still_gets_its_output(by_hand):
    home, _, record = by_hand
    log = home / "s.log"
    log.write_text("earlier\n")
    os.chown(log, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    done = record(log)
    assert done["started"] and done["same_argv"], done
    assert log.read_text() == "earlier\nserved by hand\n"
