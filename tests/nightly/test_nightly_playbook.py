"""playbooks/nightly.yml, applied for real to a control node with cron and systemd.

The control node is a systemd container of the local base image (it has cron; PID 1 is
systemd, which this dev machine's own PID 1 is not), reached by overriding
``ansible_connection`` for ``localhost``; the repository is mounted read-only at its own
path so the tool the entries point at exists. The cron path is checked in the real
crontab and by running the installed line; the timer path is verified with
systemd-analyze, enabled, started and run once. Needs docker (as `make test` does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from systemd_container import systemd_container
from test_nightly_support import REPO

IMAGE = os.environ.get("NIGHTLY_TEST_IMAGE", "local/bookworm-systemd")
PLAYBOOK = REPO / "playbooks" / "nightly.yml"
BIN = Path(sys.executable).parent
ARTIFACTS = "/var/lib/llm-nightly"
# The container's system python has no ansible_runner: a run started by cron or systemd
# ends at once with this line in the log, which proves the installed command line works.
NO_RUNNER = "ansible_runner is not importable by /usr/bin/python3"


def ansible_bin(name: str) -> str:
    """An Ansible executable of the controller venv."""
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found next to {sys.executable} nor on PATH: run `make setup`")
    return found


class ControlNode:
    """A systemd container standing in for the control node."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.inventory = workdir / "inventory.yml"
        # The repository's group_vars (ansible_managed), as inventory/ links them.
        (workdir / "group_vars").symlink_to(REPO / "group_vars")
        self.inventory.write_text(
            json.dumps(
                {
                    "all": {
                        "hosts": {
                            "localhost": {
                                "ansible_connection": "community.docker.docker",
                                "ansible_host": name,
                                "ansible_python_interpreter": "/usr/bin/python3",
                            }
                        }
                    }
                }
            )
        )

    def sh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a shell command in the container."""
        proc = subprocess.run(
            ["docker", "exec", self.name, "sh", "-c", command], capture_output=True, text=True, timeout=120
        )
        if check:
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        return proc

    def play(self, *extra: str, check: bool = False, expect_rc: int = 0) -> dict[str, Any]:
        """Apply playbooks/nightly.yml; the per-task results and the stats of localhost."""
        argv = [
            ansible_bin("ansible-playbook"),
            str(PLAYBOOK),
            "-i",
            str(self.inventory),
            "-e",
            "nightly_python=/usr/bin/python3",
            "-e",
            f"nightly_artifacts_dir={ARTIFACTS}",
            *extra,
        ]
        if check:
            argv.append("--check")
        # fmt: off
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
                   ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="false", ANSIBLE_PIPELINING="true")
        # fmt: on
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=str(REPO))
        try:
            out = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            pytest.fail(f"no JSON from ansible-playbook (rc {proc.returncode:d}):\n{proc.stdout}\n{proc.stderr}")
        assert proc.returncode == expect_rc, json.dumps(out, indent=1)[-4000:]
        tasks = {t["task"]["name"]: t["hosts"].get("localhost", {}) for t in out["plays"][0]["tasks"]}
        return {"tasks": tasks, "stats": out["stats"]["localhost"]}

    def crontab(self, user: str = "root") -> str:
        """The user's crontab ('' when there is none)."""
        proc = self.sh(f"crontab -l -u {user}", check=False)
        return proc.stdout if proc.returncode == 0 else ""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """Start the control-node container; remove it afterwards."""
    # ANSIBALLZ_CODE_CACHE: the base image's cache of module payloads' compiled code, as in the
    # molecule scenarios' containers (tools/base-image/ansiballz_code_cache.py).
    extra = ("--hostname", "control", "-e", "ANSIBALLZ_CODE_CACHE=/var/cache/ansiballz-code", "-v", f"{REPO}:{REPO}:ro")
    with systemd_container("nr-nightly-ctl", IMAGE, extra) as name:
        yield ControlNode(name, tmp_path_factory.mktemp("control"))


def cron_lines(text: str, job: str = "llm-nightly-deploy") -> list[str]:
    """The schedule line under the ``#Ansible: <job>`` marker."""
    lines = text.splitlines()
    return [lines[i + 1] for i, line in enumerate(lines) if line.strip() == f"#Ansible: {job}"]


def test_cron_entry_check_mode_install_idempotence_and_removal(node):
    env = json.dumps({"nightly_environment": {"DEPLOY_CACHE_DIR": "/srv/cache dir"}})
    common = ["-e", "nightly_limit=sglang_servers", "-e", env, "-e", "nightly_hour=3", "-e", "nightly_minute=15"]

    dry = node.play(*common, check=True)
    assert dry["tasks"]["Install or remove the nightly cron entry"]["changed"] is True
    assert cron_lines(node.crontab()) == []  # check mode wrote nothing

    first = node.play(*common)
    assert first["stats"]["changed"] >= 1
    [line] = cron_lines(node.crontab())
    assert line.startswith("15 3 * * * ")
    assert f"env 'DEPLOY_CACHE_DIR=/srv/cache dir' /usr/bin/python3 {REPO}/tools/nightly-deploy" in line
    assert f"--limit sglang_servers --artifacts-dir {ARTIFACTS} --keep-days 14 --max-drop-percent 20" in line
    assert line.endswith(f">> {ARTIFACTS}/nightly.log 2>&1")

    again = node.play(*common)
    assert again["stats"]["changed"] == 0
    assert node.play(*common, check=True)["stats"]["changed"] == 0

    # What cron will run: the line's command works as written (and logs to the file).
    command = line.split(" ", 5)[5]
    node.sh(command.replace("\\%", "%"), check=False)
    log = node.sh(f"cat {ARTIFACTS}/nightly.log").stdout
    assert NO_RUNNER in log

    node.play(*common[:4], "-e", "nightly_hour=4", "-e", "nightly_minute=15")
    [moved] = cron_lines(node.crontab())
    assert moved.startswith("15 4 * * * ")

    gone = node.play("-e", "nightly_state=absent")
    assert gone["tasks"]["Install or remove the nightly cron entry"]["changed"] is True
    assert cron_lines(node.crontab()) == []
    assert node.play("-e", "nightly_state=absent")["stats"]["changed"] == 0


def test_cron_file_and_percent_escaping(node):
    extra = json.dumps({"nightly_extra_args": ["-e", "note=50%"], "nightly_require_gate": True})
    node.play("-e", "nightly_cron_file=llm-nightly", "-e", extra)
    text = node.sh("cat /etc/cron.d/llm-nightly").stdout
    [line] = cron_lines(text)
    assert line.startswith("0 2 * * * root ")
    assert "--require-gate -e note=50\\% >>" in line
    node.play("-e", "nightly_cron_file=llm-nightly", "-e", "nightly_state=absent")
    assert node.sh("test -e /etc/cron.d/llm-nightly", check=False).returncode != 0


def test_systemd_timer_replaces_cron_and_runs(node):
    node.play()  # start from a cron entry
    assert len(cron_lines(node.crontab())) == 1

    common = ["-e", "nightly_scheduler=systemd", "-e", "nightly_limit=ct129"]
    dry = node.play(*common, check=True)
    assert dry["tasks"]["Render the nightly timer unit"]["changed"] is True
    assert node.sh("test -e /etc/systemd/system/llm-nightly-deploy.timer", check=False).returncode != 0

    node.play(*common)
    assert cron_lines(node.crontab()) == []  # switching schedulers removed the cron entry
    assert node.sh("systemctl is-enabled llm-nightly-deploy.timer").stdout.strip() == "enabled"
    assert node.sh("systemctl is-active llm-nightly-deploy.timer").stdout.strip() == "active"
    calendar = node.sh("systemctl show -P TimersCalendar llm-nightly-deploy.timer").stdout
    assert "*-*-* 02:00:00" in calendar
    node.sh(
        "systemd-analyze verify /etc/systemd/system/llm-nightly-deploy.service "
        "/etc/systemd/system/llm-nightly-deploy.timer"
    )
    assert node.play(*common)["stats"]["changed"] == 0

    # A run started by the timer's service executes the tool and appends to the log.
    node.sh("systemctl start llm-nightly-deploy.service", check=False)
    log = node.sh(f"cat {ARTIFACTS}/nightly.log").stdout
    assert log.count(NO_RUNNER) >= 1
    assert node.sh("systemctl show -P ExecMainStatus llm-nightly-deploy.service").stdout.strip() == "2"

    moved = node.play(*common, "-e", "nightly_hour=5", "-e", "nightly_minute=7")
    assert moved["tasks"]["Render the nightly timer unit"]["changed"] is True
    assert "*-*-* 05:07:00" in node.sh("systemctl show -P TimersCalendar llm-nightly-deploy.timer").stdout

    node.play(*common, "-e", "nightly_state=absent")
    assert node.sh("test -e /etc/systemd/system/llm-nightly-deploy.timer", check=False).returncode != 0
    assert node.sh("systemctl is-active llm-nightly-deploy.timer", check=False).stdout.strip() != "active"


def test_bad_variables_are_refused(node):
    out = node.play("-e", "nightly_hour=24", expect_rc=2)
    assert "A nightly_ variable is out of range" in out["tasks"]["Check the nightly variables"]["msg"]
    out = node.play("-e", "nightly_python=/nonexistent/python", expect_rc=2)
    failed = out["tasks"]["Fail when the tool or its Python is missing"]
    assert "/nonexistent/python does not exist on the control node" in json.dumps(failed)


def test_timer_units_render_and_verify_on_this_machine(tmp_path):
    """Where PID 1 is not systemd (this dev machine): render and verify only, no activation.

    Runs with the local connection the playbook declares; a job name of its own keeps any
    real nightly entry of this machine's crontab out of reach.
    """
    job = f"nr-test-{uuid.uuid4().hex[:8]}"
    units = tmp_path / "units"
    units.mkdir()
    argv = [
        ansible_bin("ansible-playbook"),
        str(PLAYBOOK),
        "-e",
        "nightly_scheduler=systemd",
        "-e",
        "nightly_systemd_activate=false",
        "-e",
        f"nightly_systemd_unit_dir={units}",
        "-e",
        f"nightly_python={sys.executable}",
        "-e",
        "nightly_artifacts_dir={}".format(tmp_path / "art"),
        "-e",
        f"nightly_job_name={job}",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    # fmt: off
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="false")
    # fmt: on
    results = []
    for _ in range(2):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=str(REPO))
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
        out = json.loads(proc.stdout[proc.stdout.index("{") :])
        results.append(
            ({t["task"]["name"]: t["hosts"]["localhost"] for t in out["plays"][0]["tasks"]}, out["stats"]["localhost"])
        )
    tasks, stats = results[0]
    service = (units / (f"{job}.service")).read_text()
    assert f"ExecStart={sys.executable} {REPO}/tools/nightly-deploy --limit ct129" in service
    assert "StandardOutput=append:{}/nightly.log".format(tmp_path / "art") in service
    assert "OnCalendar=*-*-* 02:00:00" in (units / (f"{job}.timer")).read_text()
    verify = tasks["Verify the rendered units with systemd-analyze"]
    if Path("/usr/bin/systemd-analyze").exists():
        assert not verify.get("skipped") and verify["rc"] == 0, verify
    assert tasks["Enable and start the nightly timer"].get("skipped") is True
    assert results[1][1]["changed"] == 0  # idempotent
