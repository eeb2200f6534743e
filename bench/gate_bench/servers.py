"""The server under test, started two ways: a plain process (PID) or a systemd unit."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .common import CLI, make_broken_model

UNIT = "gate-bench-server"
SLOW_LOAD_S = 20
TAIL_SLEEP_S = 15


def gate_command(python: str, port: int, watch: list[str], model: Path) -> list[str]:
    """``tools/health-gate`` against the server on ``port``, watching it with ``watch``, JSON out."""
    url = f"http://127.0.0.1:{port}"
    return [
        python,
        str(CLI),
        "--url",
        url,
        *watch,
        "--model",
        str(model),
        "--ready-timeout",
        "300",
        "--json",
        "--quiet",
    ]


class PidBackend:
    """The server as a plain process on this machine; the gate watches its PID."""

    mode = "pid"

    def __init__(self, paths: dict[str, Path], work: Path, python: str) -> None:
        """Work in ``work``; the truncated copy of the model is made once, here."""
        self.paths, self.work, self.python = paths, work, python
        self.proc: subprocess.Popen | None = None
        self.log = work / "server.log"
        self.exit_at: float | None = None
        self.broken = make_broken_model(paths["model"], work / "broken-model")

    def start(self, scenario: str, port: int) -> float:
        """Start the server for ``scenario`` on ``port``; the monotonic time of the start."""
        model = self.paths["model"] if scenario in ("kill_during_load", "healthy") else self.broken
        serve = f"exec {self.paths['serve']} serve --host 127.0.0.1 --port {port} --device cpu {model}"
        if scenario == "slow_load_crash":
            serve = f"sleep {SLOW_LOAD_S}; {serve}"
        (self.work / "hf" / "hub").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_HOME=str(self.work / "hf"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.exit_at = None
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", serve], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return time.monotonic()

    def gate_argv(self, port: int) -> list[str]:
        """The gate as the bench runs it: ``tools/health-gate --pid --log``."""
        return gate_command(
            self.python, port, ["--pid", str(self.proc.pid), "--log", str(self.log)], self.paths["model"]
        )

    def tail_argv(self) -> list[str]:
        """The old check, ``sleep 15 && tail -50`` of the log file."""
        return ["bash", "-c", f"sleep {TAIL_SLEEP_S} && tail -50 {self.log}"]

    def kill(self) -> None:
        """SIGKILL the server's process group."""
        os.killpg(self.proc.pid, signal.SIGKILL)

    def poll_exit(self) -> None:
        """Note the moment the process is seen gone."""
        if self.exit_at is None and self.proc.poll() is not None:
            self.exit_at = time.monotonic()

    def crash_time(self) -> float | None:
        """When the server exited (monotonic), None while it runs."""
        return self.exit_at

    def full_log(self) -> str:
        """Everything the server wrote."""
        return self.log.read_text(errors="replace")

    def cleanup(self) -> None:
        """Kill the server if it still runs."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class UnitBackend:
    """The server as a systemd unit (run inside the systemd container); the gate watches the unit."""

    mode = "systemd"

    def __init__(self, paths: dict[str, Path], work: Path, python: str) -> None:
        """Work in ``work``; the truncated copy of the model is made once, here."""
        self.paths, self.work, self.python = paths, work, python
        self.broken = make_broken_model(paths["model"], work / "broken-model")
        self.invocation = ""
        self.started_epoch = 0.0

    def _systemctl(self, *args: str) -> str:
        """``systemctl ARGS``; its stdout."""
        return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False).stdout

    def start(self, scenario: str, port: int) -> float:
        """Write the unit for ``scenario`` and start it; the monotonic time of the start."""
        model = self.paths["model"] if scenario == "kill_during_load" else self.broken
        pre = f"ExecStartPre=/bin/sleep {SLOW_LOAD_S}\n" if scenario == "slow_load_crash" else ""
        unit = (
            f"[Unit]\nDescription=gate bench server ({scenario})\n[Service]\nType=exec\n"
            f"Environment=HF_HOME={self.work}/hf HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1\n{pre}"
            f"ExecStart={self.paths['serve']} serve --host 127.0.0.1 --port {port} --device cpu {model}\n"
            "Restart=on-failure\nRestartSec=30\n"
        )
        (self.work / "hf" / "hub").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/systemd/system/{UNIT}.service").write_text(unit)
        self._systemctl("daemon-reload")
        self._systemctl("reset-failed", UNIT)
        t = time.monotonic()
        self.started_epoch = time.time()
        self._systemctl("start", "--no-block", UNIT)
        # wait until the new start exists, so the gate's baseline sees it
        for _ in range(100):
            state = self._systemctl("show", UNIT, "-p", "ActiveState", "--value").strip()
            if state in ("active", "activating"):
                break
            time.sleep(0.02)
        self.invocation = self._systemctl("show", UNIT, "-p", "InvocationID", "--value").strip()
        return t

    def gate_argv(self, port: int) -> list[str]:
        """The gate as the role runs it: ``tools/health-gate --unit``."""
        return gate_command(self.python, port, ["--unit", UNIT], self.paths["model"])

    def tail_argv(self) -> list[str]:
        """The old check on the journal of this start: ``sleep 15 && journalctl -n 50``."""
        # like `> log` in the by-hand launch: only this start's lines (--since its start)
        return [
            "bash",
            "-c",
            f"sleep {TAIL_SLEEP_S} && journalctl -u {UNIT} -o cat -n 50 --no-pager --since @{self.started_epoch:.3f}",
        ]

    def kill(self) -> None:
        """SIGKILL the unit's processes."""
        self._systemctl("kill", "-s", "KILL", UNIT)

    def poll_exit(self) -> None:
        """Nothing to do: systemd keeps the exit time."""
        return None

    def crash_time(self) -> float | None:
        """The main process's exit (CLOCK_MONOTONIC), None while it runs."""
        raw = self._systemctl("show", UNIT, "-p", "ExecMainExitTimestampMonotonic", "--value").strip()
        return int(raw) / 1e6 if raw and raw != "0" else None  # CLOCK_MONOTONIC, like time.monotonic()

    def full_log(self) -> str:
        """The journal of this start of the unit."""
        return subprocess.run(
            [
                "journalctl",
                "--no-pager",
                "-o",
                "cat",
                "_SYSTEMD_INVOCATION_ID=" + self.invocation,
                "+",
                "INVOCATION_ID=" + self.invocation,
            ],
            capture_output=True,
            text=True,
        ).stdout

    def cleanup(self) -> None:
        """Stop the unit and forget its failure."""
        self._systemctl("stop", UNIT)
        self._systemctl("reset-failed", UNIT)
