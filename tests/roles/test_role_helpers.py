"""Host-side helpers of the roles, run for real on this machine."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import facts as host_facts
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.proc import group_of, user_of
from role_files import import_file, launcher_as_on_a_host

REPO = Path(__file__).resolve().parents[2]
VENV_STATE = REPO / "roles/ml_env/files/venv_state.py"
# llm-host facts: what preflight reads from the host (role llm_host's launcher, run as on a host).
HOST_TOOL = launcher_as_on_a_host(REPO / "roles/llm_host/files/llm-host")
CHECK_SPECS = REPO / "tools/check-argument-specs"


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A fresh venv without pip: only the seed-free interpreter."""
    path = tmp_path_factory.mktemp("venv") / "v"
    venv.create(path, with_pip=False)
    return path


def run_state(python: Path, lock: Path) -> dict:
    """Run venv_state.py with ``python`` against ``lock``."""
    out = subprocess.run([str(python), str(VENV_STATE), str(lock)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_venv_state_reports_missing_and_in_sync(bare_venv, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("# comment\nSome_Package==1.0\n")
    state = run_state(bare_venv / "bin/python", lock)
    assert state["missing"] == ["some-package"] and not state["in_sync"]
    lock.write_text("")
    assert run_state(bare_venv / "bin/python", lock)["in_sync"]


def test_venv_state_reports_mismatch_and_extra(tmp_path):
    """The controller venv has pytest installed: pin it wrong, leave the rest extra."""
    lock = tmp_path / "lock.txt"
    lock.write_text("pytest==0.0.1\n")
    state = run_state(Path(sys.executable), lock)
    assert state["mismatched"][0][:2] == ["pytest", "0.0.1"]
    assert "pluggy" in state["extra"]
    assert "pip" not in state["extra"]


def test_venv_state_refuses_an_unpinned_lock(bare_venv, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("requests>=2\n")
    out = subprocess.run([str(bare_venv / "bin/python"), str(VENV_STATE), str(lock)], capture_output=True, text=True)
    assert out.returncode != 0 and "not pinned" in out.stderr


def test_host_facts_names_the_process_on_a_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        facts = json.loads(
            subprocess.run(
                [sys.executable, "-SE", str(HOST_TOOL), "facts", str(port)], capture_output=True, text=True, check=True
            ).stdout
        )
    assert facts["port"]["listening"] is True
    assert facts["port"]["pid"] is not None
    assert "pytest" in facts["port"]["command"] or "python" in facts["port"]["command"]
    assert facts["glibc"].count(".") == 1


def test_host_facts_on_a_free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    facts = json.loads(
        subprocess.run(
            [sys.executable, "-SE", str(HOST_TOOL), "facts", str(port)], capture_output=True, text=True, check=True
        ).stdout
    )
    assert facts["port"] == {"listening": False, "pid": None, "command": None, "user": None, "unit": None}
    assert facts["deployed"] == {}


def test_check_argument_specs_passes_on_the_repository():
    out = subprocess.run([sys.executable, str(CHECK_SPECS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_check_argument_specs_finds_drift(tmp_path):
    role = tmp_path / "roles/demo"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta").mkdir()
    (role / "defaults/main.yml").write_text("demo_a: 1\ndemo_b: x\nother: 2\n")
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      demo_a: {type: int, default: 2, description: A}\n"
        "      demo_c: {type: str, description: C}\n"
    )
    out = subprocess.run([sys.executable, str(CHECK_SPECS), str(tmp_path / "roles")], capture_output=True, text=True)
    assert out.returncode == 1
    assert "demo_b is in defaults/main.yml but not in meta/argument_specs.yml" in out.stdout
    assert "demo_c is in meta/argument_specs.yml but not in defaults/main.yml" in out.stdout
    assert "demo_a defaults to 1 but argument_specs says 2" in out.stdout
    assert "other is in defaults/main.yml" in out.stdout


def test_venv_state_keeps_only_lines_whose_marker_applies(tmp_path):
    venv_state = import_file(VENV_STATE)

    lock = tmp_path / "lock.txt"
    lock.write_text(
        'a==1 ; python_version < "3.11"  # via x\n'
        'a==2 ; python_version >= "3.11" and python_version < "3.12"\n'
        'a==3 ; python_version >= "3.12"\nb==4\n'
    )
    assert venv_state.read_lock(str(lock), (3, 10)) == {"a": "1", "b": "4"}
    assert venv_state.read_lock(str(lock), (3, 11)) == {"a": "2", "b": "4"}
    assert venv_state.read_lock(str(lock), (3, 12)) == {"a": "3", "b": "4"}
    lock.write_text('a==1 ; sys_platform == "linux"\n')
    with pytest.raises(SystemExit, match="unsupported environment marker"):
        venv_state.read_lock(str(lock), (3, 11))


def test_sglang_lock_pins_the_engine_and_the_kernels_fix_on_every_python(repo):
    venv_state = import_file(VENV_STATE)

    for python in ((3, 10), (3, 11), (3, 12)):
        pins = venv_state.read_lock(str(repo / "roles/ml_env/files/locks/sglang-0.5.11.txt"), python)
        assert (pins["sglang"], pins["kernels"], pins["torch"]) == ("0.5.11", "0.12.3", "2.11.0")


def test_host_facts_reads_the_deployed_state(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"venv_dir": "/opt/ml-env.d/abc", "model_dir": "/srv/m/revisions/r1"}))
    facts = json.loads(
        subprocess.run(
            [sys.executable, "-SE", str(HOST_TOOL), "facts", "1", str(state)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert facts["deployed"]["venv_dir"] == "/opt/ml-env.d/abc"
    state.write_text("{not json")
    facts = json.loads(
        subprocess.run(
            [sys.executable, "-SE", str(HOST_TOOL), "facts", "1", str(state)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert facts["deployed"] == {}


@pytest.mark.parametrize(
    "hostname, addresses",
    [
        ("#!/bin/sh\n[ \"$1\" = --all-ip-addresses ] && echo '10.0.4.17 fd00::5 '\n", ["10.0.4.17", "fd00::5"]),
        ("#!/bin/sh\nexit 1\n", []),
        (None, []),
    ],
    ids=["listed", "failing", "missing"],
)
def test_host_facts_list_the_hosts_addresses_for_the_ip_allow_list(tmp_path, hostname, addresses):
    """This host's addresses, as `hostname --all-ip-addresses` gives them (the unit's IP allow-list, read in
    preflight's one round trip); none when the program fails or is missing."""
    if hostname:
        (tmp_path / "hostname").write_text(hostname)
        (tmp_path / "hostname").chmod(0o755)
    run = subprocess.run(
        [sys.executable, "-SE", str(HOST_TOOL), "facts", "1"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/nonexistent"},
    )
    assert json.loads(run.stdout)["addresses"] == addresses


def free_port() -> int:
    """A TCP port nothing listens on."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        return probe_port.getsockname()[1]


WAIT_READY = REPO / "roles/inference_server/files/wait-ready.py"


def test_wait_ready_gives_up_at_once_when_the_server_is_gone():
    """ExecStartPost's probe: a dead $MAINPID ends the wait (no 30-minute start timeout)."""
    finished = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE)
    pid = int(finished.communicate()[0])
    out = subprocess.run(
        [
            sys.executable,
            "-SE",
            str(launcher_as_on_a_host(WAIT_READY)),
            f"http://127.0.0.1:{free_port()}/health",
            "0.1",
        ],
        env={"MAINPID": str(pid)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and f"pid {pid}" in out.stderr


def test_wait_ready_returns_once_health_answers_200(tmp_path):
    port = free_port()
    (tmp_path / "health").write_text("ok")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out = subprocess.run(
            [sys.executable, "-SE", str(launcher_as_on_a_host(WAIT_READY)), f"http://127.0.0.1:{port}/health", "0.1"],
            env={"MAINPID": str(server.pid)},
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        server.kill()
    assert out.returncode == 0 and "ready after" in out.stdout


def test_host_facts_tells_what_is_at_each_path_without_following_links(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    paths = [str(tmp_path / name) for name in ("dir", "file", "link", "absent")]
    argv = [sys.executable, "-SE", str(HOST_TOOL), "facts", "1"] + [arg for path in paths for arg in ("--path", path)]
    facts = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert facts["paths"] == dict(zip(paths, ["dir", "file", "link", "absent"], strict=True))


def test_host_facts_report_who_may_open_the_gpu_device_nodes(tmp_path, monkeypatch):
    """Character devices matching the globs, with their mode, owner and group; nothing else."""
    (tmp_path / "nvidia-notadevice").write_text("")
    monkeypatch.setattr(host_facts, "GPU_DEVICE_GLOBS", ("/dev/nul*", "/dev/zero", str(tmp_path / "nvidia*")))
    nodes = host_facts.gpu_device_nodes()
    assert [node["path"] for node in nodes] == ["/dev/null", "/dev/zero"]
    for node in nodes:
        st = Path(node["path"]).stat()
        mode, owner_group = node["access"].split()
        assert int(mode, 8) == st.st_mode & 0o7777
        assert owner_group == f"{user_of(st.st_uid)}:{group_of(st.st_gid)}"
    monkeypatch.setattr(host_facts, "GPU_DEVICE_GLOBS", (str(tmp_path / "none*"),))
    assert host_facts.gpu_device_nodes() == []
