# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The monitor: a watcher run in the background, so the gate fails as soon as the server dies."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import GateFailure, WatchFailure
from .watchers import NullWatcher


class Monitor:
    """Runs a watcher in a background thread, so the gate fails at once, even mid-request.

    Blocking work goes through :meth:`call` (or polls :meth:`wait`), which raises
    :class:`GateFailure` as soon as the watcher reports a failure.
    """

    def __init__(self, watcher: Any, interval: float) -> None:
        """Watch with ``watcher`` every ``interval`` seconds once started."""
        self.watcher = watcher
        self.interval = interval
        self.failure: WatchFailure | None = None
        self.phase = "wait"
        self._event = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Baseline (may raise), then watch in the background."""
        self.watcher.baseline()
        if isinstance(self.watcher, NullWatcher):
            return
        self._thread = threading.Thread(target=self._loop, name="health-gate-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _loop(self) -> None:
        """The background thread: poll until stopped or the server is down."""
        while not self._stop.wait(self.interval):
            if self.poll_now():
                return

    def poll_now(self) -> bool:
        """Look once, synchronously; True when the server is down."""
        with self._lock:
            if self.failure is None:
                failure = self.watcher.poll()
                if failure is not None:
                    self.failure = failure
                    self._event.set()
            return self.failure is not None

    def check(self) -> None:
        """Raise when the watcher has seen a failure."""
        if self.failure is not None:
            raise GateFailure(self.phase, self.failure.reason, watch=self.failure)

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; wake up and raise at once if the server goes down."""
        if self._event.wait(max(seconds, 0.0)):
            self.check()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in a thread; raise the watcher's failure if it comes first.

        When ``fn`` raises, the watcher is asked once more before the error propagates,
        so a request broken by a dying server reports the unit's state and journal rather
        than just "connection reset".
        """
        box: dict[str, Any] = {}

        def target() -> None:
            """Run ``fn`` and keep its value or its exception for the caller."""
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed over to the caller
                box["error"] = exc

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            self.check()
        if "error" in box:
            if not isinstance(self.watcher, NullWatcher):
                self.poll_now()
                self.check()
            raise box["error"]
        return box.get("value")
