# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Watchers: the systemd unit or the process the server runs as, and the evidence of its death.

A watcher has ``baseline()`` (raise :class:`GateFailure` if the server is already down),
``poll()`` (a :class:`WatchFailure` once it is down) and ``describe()`` (state for the report).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import GateFailure, WatchFailure

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .config import GateConfig

UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "InvocationID",
    "MainPID",
    "ExecMainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "ActiveEnterTimestamp",
    "ExecMainStartTimestamp",
)
EXCEPTION_RE = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b.*")
CLD_CODES = {"1": "exited", "2": "killed", "3": "dumped core"}


def last_exception_line(text: str) -> str | None:
    """The last line that looks like a raised Python exception (``ValueError: ...``)."""
    for line in reversed(text.splitlines()):
        if EXCEPTION_RE.match(line) and "Traceback" not in line:
            return line.strip()
    return None


def cap_lines(text: str, max_lines: int, max_bytes: int) -> tuple[str, int, bool]:
    """Keep the last ``max_lines`` lines and at most ``max_bytes``; (text, lines, capped)."""
    lines = text.splitlines()
    capped = len(lines) > max_lines
    lines = lines[-max_lines:]
    out = "\n".join(lines)
    if len(out.encode("utf-8")) > max_bytes:
        capped = True
        raw = out.encode("utf-8")[-max_bytes:]
        out = raw.decode("utf-8", "replace")
        out = out.split("\n", 1)[1] if "\n" in out else out
    return out, len(out.splitlines()), capped


class NullWatcher:
    """Watches nothing (a server run by someone else)."""

    kind = "none"

    def baseline(self) -> None:
        """Nothing to record."""

    def poll(self) -> WatchFailure | None:
        """Never fails."""
        return None

    def describe(self) -> dict[str, Any] | None:
        """No state."""
        return None


class UnitWatcher:
    """Watches a systemd unit with ``systemctl show``; reads this start's journal on failure.

    A failure is: the unit is not loaded, is ``failed`` or ``inactive``, sits in
    ``auto-restart``, its ``NRestarts`` grew, or its ``InvocationID`` changed (someone or
    something restarted it). ``NRestarts`` is reset by a manual (re)start, so a value above
    zero at the start of the gate means the unit crashed and was restarted by systemd
    since it was last started on purpose: a failure unless ``allow_prior_restarts``.
    """

    kind = "unit"

    def __init__(
        self,
        unit: str,
        max_lines: int,
        max_bytes: int,
        allow_prior_restarts: bool = False,
        runner: Callable[..., subprocess.CompletedProcess] | None = None,
    ) -> None:
        """Watch ``unit`` (``.service`` added when it has no suffix); ``runner`` runs systemctl/journalctl."""
        self.unit = unit if "." in unit else unit + ".service"
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.allow_prior_restarts = allow_prior_restarts
        self.runner = runner or subprocess.run
        self.first: dict[str, str] = {}
        self.last: dict[str, str] = {}

    def _run(self, argv: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
        """Run a systemd tool with a plain, pager-free, C-locale output."""
        env = dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0", LC_ALL="C")
        return self.runner(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env, check=False)

    def show(self) -> dict[str, str]:
        """``systemctl show`` of the unit as a dict."""
        try:
            proc = self._run(["systemctl", "show", self.unit, "--no-pager", "--property=" + ",".join(UNIT_PROPERTIES)])
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GateFailure("watch", f"cannot run systemctl to watch {self.unit}: {exc}") from exc
        if proc.returncode != 0:
            raise GateFailure(
                "watch",
                f"systemctl show {self.unit} failed (exit {proc.returncode}): "
                f"{proc.stderr.decode('utf-8', 'replace').strip()}",
            )
        props: dict[str, str] = {}
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                props[key] = value
        return props

    def describe(self) -> dict[str, Any] | None:
        """Last seen state, for the report."""
        state = self.last or self.first
        if not state:
            return None
        out: dict[str, Any] = {"name": self.unit}
        out.update(state)
        return out

    def _exit_text(self, props: dict[str, str]) -> str:
        """How the main process ended, in words ("main process killed by SIGKILL")."""
        code = props.get("ExecMainCode", "0")
        status = props.get("ExecMainStatus", "0")
        if code in ("2", "3"):
            try:
                name = signal.Signals(int(status)).name
            except (ValueError, TypeError):
                name = f"signal {status}"
            return f"main process {CLD_CODES[code]} by {name}"
        if code == "1":
            return f"main process exited with status {status}"
        return "main process running"

    def _verdict(self, props: dict[str, str], initial: bool) -> str | None:
        """Why the unit counts as down (one sentence), or None while it is fine."""
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        where = "{}/{}, result {}, {}".format(active, sub, props.get("Result", "?"), self._exit_text(props))
        if props.get("LoadState") not in (None, "loaded"):
            return "unit {} is not loaded (LoadState={})".format(self.unit, props.get("LoadState"))
        if active == "failed":
            return f"unit {self.unit} failed ({where})"
        if sub == "auto-restart":
            return f"unit {self.unit} exited and waits to be restarted ({where})"
        if active in ("inactive", "deactivating"):
            return f"unit {self.unit} is not running ({where})"
        restarts = _int(props.get("NRestarts"))
        if initial:
            if restarts > 0 and not self.allow_prior_restarts:
                return (
                    f"unit {self.unit} was restarted {restarts} time(s) by systemd since it was last started "
                    f"on purpose (NRestarts={restarts}): it crashed at least once"
                )
            return None
        if restarts > _int(self.first.get("NRestarts")):
            return (
                f"unit {self.unit} restarted during the gate "
                f"(NRestarts {self.first.get('NRestarts')} -> {restarts}; {where})"
            )
        old, new = self.first.get("InvocationID"), props.get("InvocationID")
        if old and new and old != new:
            return f"unit {self.unit} was restarted during the gate (new invocation {new}; {where})"
        return None

    def baseline(self) -> None:
        """Record the state at the start; fail at once when the unit is already down."""
        self.first = self.show()
        self.last = self.first
        reason = self._verdict(self.first, initial=True)
        if reason:
            raise GateFailure("watch", reason, watch=self._evidence(reason, self.first))

    def poll(self) -> WatchFailure | None:
        """Look once; a :class:`WatchFailure` with the journal when the unit is down."""
        try:
            props = self.show()
        except GateFailure as exc:
            return WatchFailure("unit", exc.reason)
        self.last = props
        reason = self._verdict(props, initial=False)
        return self._evidence(reason, props) if reason else None

    def journal(self, invocation: str) -> tuple[str, str]:
        """The journal of one start of the unit: its own output plus systemd's lines about it.

        Reads until two consecutive reads agree (journald may still be flushing the dying
        process's last lines), at most about 2 s.
        """
        if invocation:
            argv = [
                "journalctl",
                "--no-pager",
                "-o",
                "cat",
                "-n",
                str(self.max_lines + 1),
                "_SYSTEMD_INVOCATION_ID=" + invocation,
                "+",
                "INVOCATION_ID=" + invocation,
            ]
            source = f"journalctl _SYSTEMD_INVOCATION_ID={invocation}"
        else:
            argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(self.max_lines + 1), "-u", self.unit]
            source = f"journalctl -u {self.unit} (no InvocationID known)"
        previous = None
        text = ""
        for _ in range(8):
            try:
                proc = self._run(argv, timeout=30.0)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"(cannot read the journal: {exc})", source
            text = proc.stdout.decode("utf-8", "replace")
            if proc.returncode != 0 and not text:
                text = f"(journalctl exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace').strip()})"
            if text == previous:
                break
            previous = text
            time.sleep(0.25)
        return text, source

    def _evidence(self, reason: str, props: dict[str, str]) -> WatchFailure:
        """The failure with the unit's state and the capped journal of the watched start."""
        # The start we were watching; at the very beginning, the unit's current/last one.
        invocation = self.first.get("InvocationID") or props.get("InvocationID", "")
        text, source = self.journal(invocation)
        log, lines, capped = cap_lines(text, self.max_lines, self.max_bytes)
        state = {"name": self.unit}
        state.update(props)
        return WatchFailure(
            "unit",
            reason,
            state=state,
            log=log,
            log_lines=lines,
            log_capped=capped,
            log_source=source,
            exception=last_exception_line(log),
        )


class PidWatcher:
    """Watches a process id (a server started by hand or by the bench) and its log file."""

    kind = "pid"

    def __init__(self, pid: int, log_file: str | None, max_lines: int, max_bytes: int) -> None:
        """Watch ``pid``; quote ``log_file`` (its last lines) when the process is gone."""
        self.pid = int(pid)
        self.log_file = log_file
        self.max_lines = max_lines
        self.max_bytes = max_bytes

    def alive(self) -> tuple[bool, str]:
        """(alive, state letter from /proc); a zombie counts as dead."""
        try:
            with open(f"/proc/{self.pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False, "gone"
            except PermissionError:
                return True, "?"
            return True, "?"
        return state not in ("Z", "X", "x"), state

    def describe(self) -> dict[str, Any] | None:
        """PID and liveness, for the report."""
        alive, state = self.alive()
        return {"pid": self.pid, "alive": alive, "state": state}

    def baseline(self) -> None:
        """Fail at once when the process is not there."""
        failure = self.poll()
        if failure:
            raise GateFailure("watch", failure.reason, watch=failure)

    def poll(self) -> WatchFailure | None:
        """A :class:`WatchFailure` with the log file once the process is gone."""
        alive, state = self.alive()
        if alive:
            return None
        reason = f"process {self.pid} exited ({'zombie' if state == 'Z' else 'no longer exists'})"
        text, source = "", ""
        if self.log_file:
            source = self.log_file
            previous = None
            for _ in range(8):
                try:
                    with open(self.log_file, encoding="utf-8", errors="replace") as handle:
                        text = handle.read()
                except OSError as exc:
                    text = f"(cannot read {self.log_file}: {exc})"
                    break
                if text == previous:
                    break
                previous = text
                time.sleep(0.1)
        log, lines, capped = cap_lines(text, self.max_lines, self.max_bytes)
        return WatchFailure(
            "pid",
            reason,
            state={"pid": self.pid, "state": state},
            log=log,
            log_lines=lines,
            log_capped=capped,
            log_source=source,
            exception=last_exception_line(log),
        )


def _int(value: Any) -> int:
    """``int(value)``, 0 when it is not a number (systemd's ``NRestarts`` may be empty)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def make_watcher(cfg: GateConfig) -> NullWatcher | UnitWatcher | PidWatcher:
    """The watcher the options ask for."""
    if cfg.unit:
        return UnitWatcher(cfg.unit, cfg.journal_max_lines, cfg.journal_max_bytes, cfg.allow_prior_restarts)
    if cfg.pid:
        return PidWatcher(cfg.pid, cfg.log_file, cfg.journal_max_lines, cfg.journal_max_bytes)
    return NullWatcher()
