# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The gate's exceptions and the evidence a watcher hands over when the server dies."""

from __future__ import annotations

import json
from typing import Any


class GateUsageError(ValueError):
    """Bad options: nothing was measured (CLI exit code 2, module fails before measuring)."""


class RequestError(Exception):
    """One HTTP request to the server failed; the message quotes what the server said."""


class WatchFailure:
    """What the watcher saw when the supervised server failed, exited or restarted."""

    def __init__(
        self,
        kind: str,
        reason: str,
        state: dict[str, Any] | None = None,
        log: str = "",
        log_lines: int = 0,
        log_capped: bool = False,
        log_source: str = "",
        exception: str | None = None,
    ) -> None:
        """The failure ``kind`` (unit, pid), why, and the state and log that show it."""
        self.kind = kind
        self.reason = reason
        self.state = state or {}
        self.log = log
        self.log_lines = log_lines
        self.log_capped = log_capped
        self.log_source = log_source
        self.exception = exception

    def as_dict(self) -> dict[str, Any]:
        """Evidence for the report."""
        return {
            "watch": self.kind,
            "reason": self.reason,
            "state": self.state,
            "exception": self.exception,
            "log_source": self.log_source,
            "log_lines": self.log_lines,
            "log_capped": self.log_capped,
            "log": self.log,
        }


class GateFailure(Exception):
    """The gate failed in ``phase``; ``reason`` is one sentence, ``watch`` the unit evidence."""

    def __init__(
        self, phase: str, reason: str, watch: WatchFailure | None = None, detail: dict[str, Any] | None = None
    ) -> None:
        """A failure of ``phase`` for ``reason``, with the watcher's evidence when it has some."""
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.watch = watch
        self.detail = detail or {}


def read_json_option(value: Any, what: str) -> tuple[Any, str]:
    """An option that is data or the path of a JSON file holding it: (the data, where it came from, for
    messages). A file that cannot be read or parsed raises :class:`GateUsageError` naming ``what``."""
    if not isinstance(value, str):
        return value, what
    try:
        with open(value, encoding="utf-8") as handle:
            return json.load(handle), value
    except (OSError, ValueError) as exc:
        raise GateUsageError(f"cannot read {what} from {value}: {exc}") from exc
