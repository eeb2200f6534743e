"""llm-host inspect, record, restore, switch, alive (llm_host_lib/adopt.py, through
its launcher as on a host) against a real server
started by hand (python3 -m http.server from a venv-shaped directory, with a secret in its environment)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from role_files import launcher_as_on_a_host

LAUNCHER = launcher_as_on_a_host(Path(__file__).resolve().parents[2] / "roles" / "llm_host" / "files" / "llm-host")


def run(*args: str) -> dict:
    """Run llm-host and parse its JSON."""
    proc = subprocess.run([sys.executable, "-SE", str(LAUNCHER), *args], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def free_port() -> int:
    """A TCP port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def by_hand(tmp_path):
    """A server 'by hand': <venv>/bin/python -m http.server PORT --directory <model>, nohup-style."""
    venv = tmp_path / "ml-env"
    (venv / "bin").mkdir(parents=True)
    real = os.path.realpath(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(real)
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    port = free_port()
    log = tmp_path / "serve.log"
    env = {"PATH": os.environ.get("PATH", ""), "MY_TOKEN": 's3cr$t"`x', "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                str(venv / "bin" / "python"),
                "-m",
                "http.server",
                str(port),
                "--bind",
                "127.0.0.1",
                "--directory",
                str(model),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=out,
        )
    for _ in range(400):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield {"proc": proc, "port": port, "venv": venv, "model": model, "log": log, "tmp": tmp_path}
    proc.kill()
    proc.wait()


def test_inspect_finds_argv_cwd_venv_model_log_and_masks_secrets(by_hand):
    found = run("inspect", str(by_hand["port"]), "inference-server")
    assert found["found"] and found["pid"] == by_hand["proc"].pid
    assert found["argv"][0] == str(by_hand["venv"] / "bin" / "python")
    assert found["cwd"] == str(by_hand["tmp"])
    assert found["venv"] == str(by_hand["venv"]) and found["model_dir"] == str(by_hand["model"])
    assert found["stdout"] == str(by_hand["log"])
    assert found["env_masked"]["MY_TOKEN"] == "***" and found["env_masked"]["OMP_NUM_THREADS"] == "1"
    assert "s3cr" not in json.dumps(found)


def test_record_keeps_the_environment_on_the_host_only(by_hand):
    state = by_hand["tmp"] / "state"
    shown = run("record", str(by_hand["port"]), "inference-server", str(state))
    assert shown["changed"] and "s3cr" not in json.dumps(shown)
    assert (state / "by-hand.env").stat().st_mode & 0o777 == 0o600
    assert 'MY_TOKEN="s3cr\\$t\\"\\`x"' in (state / "by-hand.env").read_text()
    assert "s3cr" not in (state / "by-hand.json").read_text()
    assert run("record", str(by_hand["port"]), "inference-server", str(state))["changed"] is False


def test_switch_stops_it_gracefully_moves_the_venv_aside_and_links_ours(by_hand):
    state = by_hand["tmp"] / "state"
    run("record", str(by_hand["port"]), "inference-server", str(state))
    record = json.loads((state / "by-hand.json").read_text())
    ours = by_hand["tmp"] / "ml-env.d" / "abc"
    ours.mkdir(parents=True)
    kept = str(by_hand["venv"]) + ".by-hand-20261201T000000Z"
    done = run(
        "switch",
        str(state / "by-hand.json"),
        str(record["pid"]),
        str(record["start_ticks"]),
        str(by_hand["port"]),
        "10",
        "--move",
        str(by_hand["venv"]),
        kept,
        "--link",
        str(by_hand["venv"]),
        str(ours),
    )
    assert done["port_free"] and not done["killed"]
    by_hand["proc"].wait(timeout=5)
    assert os.path.isdir(kept) and os.readlink(by_hand["venv"]) == str(ours)
    assert json.loads((state / "by-hand.json").read_text())["venv_kept"] == kept
    assert run("alive", str(record["pid"]), str(record["start_ticks"])) == {"alive": False}


def test_a_port_held_by_our_unit_or_nobody_is_nothing_to_adopt():
    assert run("inspect", str(free_port()), "inference-server")["found"] is False
