"""ansible-runner's record of a run -> one summary per host: the play recap's counts, the changed and
failed tasks, and what the roles reported through ``set_stats`` (the server's restarts, the gate).

Kept beside ansible-runner: ``Runner.stats`` drops the ``artifact_data`` (the ``set_stats`` data)
that this module reads from the same ``playbook_on_stats`` event (docs/architecture.md,
'Hand-written code beside a library or builtin').

The roles say what happened themselves, in the run's custom stats (``ansible.builtin.set_stats``,
not per host, under :data:`STATS_KEY`, one entry per host): ansible-runner hands them over in the
``playbook_on_stats`` event as ``artifact_data`` (its display callback's ``stats.custom['_run']``),
beside the counters ``Runner.stats`` gives. Nothing here is recognised by a task's name or module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# The roles' set_stats key: {host: {"gate": ..., "restarts": ...}}, merged over the run.
#   gate      roles/health_gate/tasks/gate.yml, after every gate (a later gate of the host, a
#             rollback's, replaces it): passed, summary, report_path, timestamp, figures (the
#             verdict's: decode_tps_mean, ttft_p95_s, accept_length, ...), unit (its systemd state)
#   restarts  roles/inference_server/tasks/restart.yml, after every deliberate restart (the
#             deploy's, a rollback's): one entry per new start of the unit
STATS_KEY = "llm_deploy"


# --- Small helpers ----------------------------------------------------------------------


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.timezone.utc)


def iso(moment: dt.datetime) -> str:
    """``2026-11-30T02:00:03Z``."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_number(value: Any) -> float | None:
    """A finite float from a number or a numeric string; ``None`` otherwise (bools too)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number


def short(text: Any, limit: int = 240) -> str:
    """First non-empty line of ``text``, at most ``limit`` characters."""
    for line in str(text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def truthy(value: Any) -> bool:
    """A value's truth as Ansible's ``| bool`` reads it (``True``, ``"true"``, ``"yes"``, ``1``...)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y")
    return bool(value)


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def text(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else ``None``."""
    return value if isinstance(value, str) and value else None


def task_label(event_data: Mapping[str, Any]) -> str:
    """``role : task name`` as ansible-playbook prints it."""
    task = str(event_data.get("task") or "(unnamed task)").strip()
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def stats_count(key: str) -> Any:
    """A :class:`HostSummary` counter (default 0) that :func:`summarize_events` reads from the
    ``playbook_on_stats`` event under ``key``, Ansible's name for it (``failures``, ``dark``...)."""
    return field(default=0, metadata={"stats": key})


# --- What the roles reported -----------------------------------------------------------------


@dataclass
class GateFigure:
    """What one host's (last) gate reported through set_stats."""

    # The verdict's figures (its ``figures``), the gate's outcome, its report, the unit it watched.
    decode_tps: float | None = None
    ttft_p95_s: float | None = None
    accept_length: float | None = None
    passed: bool | None = None
    summary: str = ""
    report_path: str | None = None
    timestamp: str | None = None
    # ExecMainStartTimestamp (else ActiveEnterTimestamp) and InvocationID: a restart changes both.
    unit_started: str | None = None
    unit_invocation_id: str | None = None
    source: str = f"set_stats {STATS_KEY}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (every field)."""
        return asdict(self)


def gate_from_stats(gate: Any) -> GateFigure | None:
    """The :class:`GateFigure` of a host's ``gate`` entry (roles/health_gate/tasks/gate.yml); ``None``
    when there is none. Tolerant: every field is optional and numbers may be strings."""
    if not isinstance(gate, Mapping) or not gate:
        return None
    figures, unit = mapping(gate.get("figures")), mapping(gate.get("unit"))
    passed = gate.get("passed")
    return GateFigure(
        decode_tps=as_number(figures.get("decode_tps_mean")),
        passed=truthy(passed) if isinstance(passed, (bool, int, str)) else None,
        summary=short(gate.get("summary")),
        report_path=text(gate.get("report_path")),
        ttft_p95_s=as_number(figures.get("ttft_p95_s")),
        accept_length=as_number(figures.get("accept_length")),
        timestamp=text(gate.get("timestamp")),
        unit_started=text(unit.get("ExecMainStartTimestamp")) or text(unit.get("ActiveEnterTimestamp")),
        unit_invocation_id=text(unit.get("InvocationID")),
    )


@dataclass
class HostSummary:
    """Counts and findings for one host of the run (the counts as the play recap's stats give them)."""

    ok: int = stats_count("ok")
    changed: int = stats_count("changed")
    failed: int = stats_count("failures")
    unreachable: int = stats_count("dark")
    skipped: int = stats_count("skipped")
    rescued: int = stats_count("rescued")
    ignored: int = stats_count("ignored")
    changed_tasks: list[str] = field(default_factory=list)
    failed_tasks: list[dict[str, str]] = field(default_factory=list)
    # The new starts of the unit the role reported (its InvocationIDs), one per restart.
    restart_invocations: list[str] = field(default_factory=list)
    gate: GateFigure | None = None

    @property
    def restarts(self) -> int:
        """Deliberate restarts of the server in this run (the deploy's, a rollback's)."""
        return len(self.restart_invocations)

    @property
    def healthy(self) -> bool:
        """No unrescued failure and reachable."""
        return self.failed == 0 and self.unreachable == 0


def apply_reported(summary: HostSummary, reported: Any) -> None:
    """Fill ``summary`` with one host's set_stats entry (``{"gate": ..., "restarts": ...}``)."""
    reported = mapping(reported)
    summary.gate = gate_from_stats(reported.get("gate"))
    restarts = mapping(reported.get("restarts"))
    summary.restart_invocations = [str(new) for new in restarts]


# --- The run -> per-host summary ---------------------------------------------------------------


def summarize_events(events: Iterable[Mapping[str, Any]]) -> dict[str, HostSummary]:
    """Per-host summary of an ansible-runner event stream (``runner.events`` or job_events).

    Counts and the roles' reports come from the ``playbook_on_stats`` event (the play recap and
    ``artifact_data``, the set_stats data under :data:`STATS_KEY`); the changed and failed tasks
    from the final task results (``runner_on_ok``, ``runner_on_failed``, ``runner_on_unreachable``).
    A loop whose final result no_log censored (one secret item is enough) counts as changed when one
    of its visible items (``runner_item_on_ok``) did. Without the stats event (ansible-playbook died)
    the counts are the events' and nothing reported is known.
    """
    hosts: dict[str, HostSummary] = {}
    stats: Mapping[str, Any] | None = None
    # Loop items that reported a change, by (host, task).
    changed_items: set = set()

    def host_of(data: Mapping[str, Any]) -> HostSummary:
        return hosts.setdefault(str(data.get("host")), HostSummary())

    for event in events:
        kind = event.get("event")
        data = mapping(event.get("event_data"))
        res = mapping(data.get("res"))
        key = (str(data.get("host")), str(data.get("task_uuid")))
        if kind == "runner_item_on_ok" and res.get("changed"):
            changed_items.add(key)
        elif kind == "runner_on_ok":
            summary = host_of(data)
            if res.get("changed") or ("censored" in res and key in changed_items):
                summary.changed_tasks.append(task_label(data))
        elif kind == "runner_on_failed":
            host_of(data).failed_tasks.append(
                {
                    "task": task_label(data),
                    "msg": short(res.get("msg") or res.get("stderr") or res.get("reason")),
                    "ignored": "yes" if data.get("ignore_errors") else "no",
                }
            )
        elif kind == "runner_on_unreachable":
            host_of(data).failed_tasks.append(
                {"task": task_label(data), "msg": "unreachable: " + short(res.get("msg")), "ignored": "no"}
            )
        elif kind == "playbook_on_stats":
            stats = data
    if stats is None:
        # No stats (ansible-playbook died): count what the events show.
        for summary in hosts.values():
            summary.changed = len(summary.changed_tasks)
            summary.failed = sum(1 for t in summary.failed_tasks if t["ignored"] == "no")
        hosts.pop("None", None)
        return hosts
    counters = {f.metadata["stats"]: f.name for f in fields(HostSummary) if "stats" in f.metadata}
    names = set()
    for key in list(counters) + ["processed"]:
        names.update(mapping(stats.get(key)))
    reported = mapping(mapping(stats.get("artifact_data")).get(STATS_KEY))
    for host in names | set(reported):
        summary = hosts.setdefault(str(host), HostSummary())
        for key, attr in counters.items():
            setattr(summary, attr, int(mapping(stats.get(key)).get(host, 0)))
        apply_reported(summary, reported.get(host))
    hosts.pop("None", None)
    return hosts
