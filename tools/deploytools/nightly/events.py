"""ansible-runner events -> one summary per host: counts, failures, restarts, the gate figure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# --- Event markers --------------------------------------------------------------------
# The inference_server role's own fact: true when this run restarts the server (set_fact in
# roles/inference_server/tasks/service.yml; its runner_on_ok carries res.ansible_facts.<fact>).
RESTART_FACT = "inference_server_restarted"
# Service modules (last component of the action name); a changed result with
# module_args.state == "restarted" is a restart (the handler's, a rollback's), with
# "started" a start.
SERVICE_ACTIONS = frozenset({"systemd_service", "systemd", "service", "sysvinit"})
# The health gate module (last component of the action name).
GATE_ACTIONS = frozenset({"health_gate"})
# Where the gate's aggregate decode tok/s sits in the module result; the first path that
# holds a number wins. The first one is the health_gate module's schema 1 report.
GATE_TPS_KEY_PATHS: tuple[tuple[str, ...], ...] = (
    ("report", "aggregate", "decode_tps_mean"),
    ("report", "aggregate", "decode_tps"),
    ("report", "decode_tps"),
    ("decode_tps",),
)
# Fallback when the module's own result is not in the stream (e.g. no_log): the role
# keeps the report in this fact (set_fact result: res.ansible_facts.<fact>).
GATE_REPORT_FACT = "health_gate_report"
# The unit the gate watched: its start time and invocation id (a restart changes both).
GATE_UNIT_START_PATHS: tuple[tuple[str, ...], ...] = (
    ("report", "unit", "ExecMainStartTimestamp"),
    ("report", "unit", "ActiveEnterTimestamp"),
)
GATE_UNIT_INVOCATION_PATH: tuple[str, ...] = ("report", "unit", "InvocationID")


# --- Small helpers ----------------------------------------------------------------------


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.timezone.utc)


def iso(moment: dt.datetime) -> str:
    """``2026-11-30T02:00:03Z``."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dig(data: Any, path: Sequence[str]) -> Any:
    """``data[path[0]][path[1]]...`` or ``None`` when any step is missing or not a mapping."""
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    return data


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


def action_name(event_data: Mapping[str, Any]) -> str:
    """Last dotted component of the task's action (``ansible.builtin.systemd`` -> ``systemd``)."""
    action = event_data.get("resolved_action") or event_data.get("task_action") or ""
    return str(action).rsplit(".", 1)[-1]


def task_label(event_data: Mapping[str, Any]) -> str:
    """``role : task name`` as ansible-playbook prints it."""
    task = str(event_data.get("task") or "(unnamed task)").strip()
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def report_number(*path: str) -> Any:
    """A :class:`GateFigure` field (default ``None``) that :func:`gate_from_result` reads as a
    number at ``path`` in the gate's report."""
    return field(default=None, metadata={"in_report": path})


def stats_count(key: str) -> Any:
    """A :class:`HostSummary` counter (default 0) that :func:`summarize_events` reads from the
    ``playbook_on_stats`` event under ``key``, Ansible's name for it (``failures``, ``dark``...)."""
    return field(default=0, metadata={"stats": key})


# --- Event stream -> per-host summary ------------------------------------------------------


@dataclass
class GateFigure:
    """What one host's gate reported (the report's own figures name their place in it)."""

    decode_tps: float | None = None
    passed: bool | None = None
    summary: str = ""
    report_path: str | None = None
    ttft_p95_s: float | None = report_number("aggregate", "ttft_p95_s")
    accept_length: float | None = report_number("speculative", "accept_length")
    timestamp: str | None = None
    unit_started: str | None = None
    unit_invocation_id: str | None = None
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (every field)."""
        return asdict(self)


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
    service_restarts: list[str] = field(default_factory=list)
    restart_fact: str | None = None
    start_tasks: list[str] = field(default_factory=list)
    gate: GateFigure | None = None

    @property
    def restart_tasks(self) -> list[str]:
        """The tasks that restarted the server: the service modules' restarts, or the task that
        set the role's restart fact when no service module result showed the restart."""
        if self.service_restarts or not self.restart_fact:
            return list(self.service_restarts)
        return [self.restart_fact]

    @property
    def restarts(self) -> int:
        """Number of service restarts: the role's fact counts the run's own restart, which
        its handler's service result (when in the stream) shows again; a rollback adds one."""
        return len(self.restart_tasks)

    @property
    def healthy(self) -> bool:
        """No unrescued failure and reachable."""
        return self.failed == 0 and self.unreachable == 0


def gate_from_result(res: Mapping[str, Any], source: str) -> GateFigure | None:
    """Extract a :class:`GateFigure` from a health_gate module result; ``None`` if it is not one.

    ``res`` is the module result (``event_data.res``). Tolerant: every field is optional,
    numbers may be strings, and the first path of ``GATE_TPS_KEY_PATHS`` that holds a
    number gives the figure.
    """
    if not isinstance(res, Mapping):
        return None
    tps = None
    for path in GATE_TPS_KEY_PATHS:
        tps = as_number(dig(res, path))
        if tps is not None:
            break
    report = res.get("report") if isinstance(res.get("report"), Mapping) else {}
    passed = res.get("passed", report.get("passed"))
    figure = GateFigure(
        decode_tps=tps,
        passed=bool(passed) if isinstance(passed, (bool, int)) else None,
        summary=short(res.get("summary") or report.get("summary") or res.get("msg")),
        report_path=res.get("report_path") if isinstance(res.get("report_path"), str) else None,
        timestamp=report.get("timestamp") if isinstance(report.get("timestamp"), str) else None,
        source=source,
        **{
            f.name: as_number(dig(report, f.metadata["in_report"]))
            for f in fields(GateFigure)
            if "in_report" in f.metadata
        },
    )
    for path in GATE_UNIT_START_PATHS:
        value = dig(res, path)
        if isinstance(value, str) and value:
            figure.unit_started = value
            break
    invocation = dig(res, GATE_UNIT_INVOCATION_PATH)
    figure.unit_invocation_id = invocation if isinstance(invocation, str) and invocation else None
    if figure.decode_tps is None and figure.passed is None and not report:
        return None
    return figure


def truthy(value: Any) -> bool:
    """A fact's truth as Ansible's ``| bool`` reads it (``True``, ``"true"``, ``"yes"``, ``1``...)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y")
    return bool(value)


def summarize_events(events: Iterable[Mapping[str, Any]]) -> dict[str, HostSummary]:
    """Per-host summary of an ansible-runner event stream (``runner.events`` or job_events).

    Only final task results count: ``runner_on_ok``/``runner_on_failed``/
    ``runner_on_unreachable`` (``runner_on_async_ok`` repeats the ``runner_on_ok`` of an
    async task and is used only when no ``runner_on_ok`` carried that task's result). A
    loop's ``runner_item_on_ok`` events are read only for a final result that no_log
    censored: the task changed when one of its visible items did.
    """
    hosts: dict[str, HostSummary] = {}
    stats: Mapping[str, Any] | None = None
    seen_ok: set = set()
    async_results: dict[tuple[str, str], Mapping[str, Any]] = {}
    fact_gates: dict[str, GateFigure] = {}
    # Loop items that reported a change, by (host, task): a loop with one no_log item has its
    # final result censored whole (no `changed`), but its other items still say so.
    changed_items: set = set()

    def host_of(data: Mapping[str, Any]) -> HostSummary:
        return hosts.setdefault(str(data.get("host")), HostSummary())

    def handle_ok(data: Mapping[str, Any]) -> None:
        summary = host_of(data)
        res = data.get("res") if isinstance(data.get("res"), Mapping) else {}
        action = action_name(data)
        if action in GATE_ACTIONS:
            figure = gate_from_result(res, f"{action} result")
            if figure is not None:
                summary.gate = figure
        facts = res.get("ansible_facts") if isinstance(res.get("ansible_facts"), Mapping) else {}
        if RESTART_FACT in facts and truthy(facts[RESTART_FACT]):
            summary.restart_fact = task_label(data)
        if isinstance(facts.get(GATE_REPORT_FACT), Mapping):
            figure = gate_from_result({"report": facts[GATE_REPORT_FACT]}, f"fact {GATE_REPORT_FACT}")
            if figure is not None:
                fact_gates[str(data.get("host"))] = figure
        task_key = (str(data.get("host")), str(data.get("task_uuid")))
        if not (res.get("changed") or ("censored" in res and task_key in changed_items)):
            return
        label = task_label(data)
        summary.changed_tasks.append(label)
        state = dig(res, ("invocation", "module_args", "state"))
        if action in SERVICE_ACTIONS and state == "restarted":
            summary.service_restarts.append(label)
        elif action in SERVICE_ACTIONS and state == "started":
            summary.start_tasks.append(label)

    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "runner_item_on_ok" and isinstance(data.get("res"), Mapping) and data["res"].get("changed"):
            changed_items.add((str(data.get("host")), str(data.get("task_uuid"))))
        elif kind == "runner_on_ok":
            seen_ok.add((str(data.get("host")), str(data.get("task_uuid"))))
            handle_ok(data)
        elif kind == "runner_on_async_ok":
            async_results[(str(data.get("host")), str(data.get("task_uuid")))] = data
        elif kind == "runner_on_failed":
            summary = host_of(data)
            res = data.get("res") if isinstance(data.get("res"), Mapping) else {}
            summary.failed_tasks.append(
                {
                    "task": task_label(data),
                    "msg": short(res.get("msg") or res.get("stderr") or res.get("reason")),
                    "ignored": "yes" if data.get("ignore_errors") else "no",
                }
            )
            if action_name(data) in GATE_ACTIONS:
                figure = gate_from_result(res, f"{action_name(data)} result")
                if figure is not None:
                    summary.gate = figure
        elif kind == "runner_on_unreachable":
            summary = host_of(data)
            res = data.get("res") if isinstance(data.get("res"), Mapping) else {}
            summary.failed_tasks.append(
                {"task": task_label(data), "msg": "unreachable: " + short(res.get("msg")), "ignored": "no"}
            )
        elif kind == "playbook_on_stats":
            stats = data
    for key, data in async_results.items():
        if key not in seen_ok:
            handle_ok(data)
    for host, figure in fact_gates.items():
        summary = hosts.setdefault(host, HostSummary())
        if summary.gate is None:
            summary.gate = figure
    if stats is not None:
        counters = {f.metadata["stats"]: f.name for f in fields(HostSummary) if "stats" in f.metadata}
        names = set()
        for key in list(counters) + ["processed"]:
            if isinstance(stats.get(key), Mapping):
                names.update(stats[key])
        for host in names:
            summary = hosts.setdefault(str(host), HostSummary())
            for key, attr in counters.items():
                value = stats.get(key) or {}
                setattr(summary, attr, int(value.get(host, 0)) if isinstance(value, Mapping) else 0)
    else:
        # No stats (ansible-playbook died): count what the events show.
        for summary in hosts.values():
            summary.changed = len(summary.changed_tasks)
            summary.failed = sum(1 for t in summary.failed_tasks if t["ignored"] == "no")
    hosts.pop("None", None)
    return hosts
