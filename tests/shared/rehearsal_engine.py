"""The REAL rehearsal engine: ``transformers serve`` with the tiny model, started and stopped.

Finds the CPU venv and the model under ``$DEPLOY_CACHE_DIR`` (default ``<repo>/.cache``),
which ``make tools-venv model`` builds; missing, the test that starts it FAILS (never skips).
Shared by health_gate/test_gate_rehearsal.py and roles/test_drain.py (the root conftest puts
tests/shared on the path, pyproject.toml).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DEPLOY_CACHE_DIR") or REPO / ".cache")
SERVE = CACHE / "venvs" / "transformers-cpu" / "bin" / "transformers"
MODEL = CACHE / "models" / "tiny-qwen3.5"


def start_server(tmp: Path, port: int) -> subprocess.Popen:
    """Start ``transformers serve`` on ``port``, output in ``tmp/server.log``."""
    missing = [str(p) for p in (SERVE, MODEL / "config.json") if not p.exists()]
    if missing:
        pytest.fail(
            "rehearsal server not available: {} missing. Run `make tools-venv model` or set "
            "DEPLOY_CACHE_DIR to a cache that has them.".format(", ".join(missing))
        )
    (tmp / "hf" / "hub").mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        HF_HOME=str(tmp / "hf"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
    )
    log = open(tmp / "server.log", "wb")
    return subprocess.Popen(
        [str(SERVE), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(MODEL)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_health(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"transformers serve not healthy after {int(timeout):d} s:\n{log.read_text()[-3000:]}")
