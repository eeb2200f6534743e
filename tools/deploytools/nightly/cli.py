"""The nightly-deploy command line and run: lock, ansible-runner, summary, drop check."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import (
    STATS_KEY,
    HostSummary,
    as_number,
    iso,
    short,
    summarize_events,
    utc_now,
)
from .state import (
    RunLock,
    check_drop,
    last_entry,
    load_history,
    new_run_dir,
    prune_runs,
    record_history,
    redact_command_file,
    write_json_atomic,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3

SUMMARY_SCHEMA = 1
RUNNER_IDENT = "deploy"


class UsageError(Exception):
    """A bad command line or a missing input (exit code 2)."""


# --- The run ----------------------------------------------------------------------------


@dataclass
class Options:
    """Validated command line."""

    repo: Path
    playbook: str
    inventories: list[Path]
    limit: str
    artifacts: Path
    keep_days: float
    lock_file: Path
    history_file: Path
    max_drop_percent: float
    rebaseline: bool
    require_gate: bool
    extra_vars: list[str]
    tags: str | None
    skip_tags: str | None
    vault_password_file: Path | None
    timeout: int
    ansible_output: bool
    json_out: bool


def extra_vars_cmdline(values: Sequence[str]) -> list[str]:
    """``-e`` arguments for ansible-playbook, as given (ansible-playbook parses them), with an
    ``@FILE`` made absolute: the playbook runs in the project directory, not here."""
    args: list[str] = []
    for value in values:
        if value.startswith("@") and not Path(value[1:]).is_absolute():
            value = "@" + str(Path(value[1:]).resolve())
        args += ["-e", value]
    return args


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    repo = Path(__file__).resolve().parents[3]
    parser = argparse.ArgumentParser(
        prog="nightly-deploy",
        description="Run deploy.yml through ansible-runner (one run at a time), print a one-line "
        "summary, write a JSON summary, keep and prune artifacts, and fail when a "
        "host's gate figure dropped too far below its last recorded figure.",
        epilog="Exit codes: 0 success; 1 the deploy failed, the gate figure regressed or "
        "ansible-runner failed; 2 usage error; 3 another run holds the lock. "
        "See docs/nightly.md.",
    )
    parser.add_argument(
        "--limit", "-l", required=True, help="hosts to deploy (ansible --limit pattern, e.g. ct129 or 'sglang_servers')"
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=repo,
        help="project directory holding the playbook and ansible.cfg (default: %(default)s)",
    )
    parser.add_argument("--playbook", default="deploy.yml", help="playbook, relative to --repo (default: %(default)s)")
    parser.add_argument(
        "--inventory",
        "-i",
        type=Path,
        action="append",
        default=None,
        help="inventory source; repeatable (default: <repo>/inventory/hosts.yml)",
    )
    parser.add_argument(
        "--artifacts-dir",
        type=Path,
        default=None,
        help="where run dirs, history.json, latest.json and the lock live (default: <repo>/artifacts/nightly)",
    )
    parser.add_argument(
        "--keep-days",
        type=float,
        default=14.0,
        help="prune run dirs older than this many days; 0 keeps all (default: %(default)s)",
    )
    parser.add_argument(
        "--lock-file", type=Path, default=None, help="lock file (default: <artifacts dir>/nightly.lock)"
    )
    parser.add_argument(
        "--history-file", type=Path, default=None, help="gate figure history (default: <artifacts dir>/history.json)"
    )
    parser.add_argument(
        "--max-drop-percent",
        type=float,
        default=20.0,
        help="fail when a host's gate tok/s is more than this many percent below its "
        "last recorded figure (default: %(default)s)",
    )
    parser.add_argument(
        "--rebaseline",
        action="store_true",
        help="skip the drop check once and record this run's figures as the new baseline",
    )
    parser.add_argument(
        "--require-gate", action="store_true", help="fail when a host that deployed produced no gate figure"
    )
    parser.add_argument(
        "--extra-vars",
        "-e",
        action="append",
        default=[],
        metavar="VARS",
        help="passed to ansible-playbook as -e VARS: KEY=VALUE, JSON/YAML or @FILE; repeatable "
        "(no secrets: they land in the run's artifacts/deploy/command)",
    )
    parser.add_argument("--tags", help="only run plays and tasks tagged with these values")
    parser.add_argument("--skip-tags", help="skip plays and tasks tagged with these values")
    parser.add_argument(
        "--vault-password-file", type=Path, help="passed to ansible-playbook by path (the password is never copied)"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=0,
        help="cancel the deploy after this many seconds; 0 = no limit (default: %(default)s)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        dest="json_out",
        help="print the JSON summary on stdout (the summary line goes to stderr)",
    )
    out.add_argument(
        "--ansible-output", action="store_true", help="stream ansible-playbook's output before the summary line"
    )
    return parser


def parse_options(argv: Sequence[str] | None) -> Options:
    """Parse and validate; raises :class:`UsageError` (argparse itself exits 2)."""
    args = build_parser().parse_args(argv)
    if not args.limit.strip():
        raise UsageError("--limit must not be empty")
    if args.keep_days < 0:
        raise UsageError("--keep-days must be >= 0")
    if not 0 <= args.max_drop_percent <= 100:
        raise UsageError("--max-drop-percent must be between 0 and 100")
    if args.timeout < 0:
        raise UsageError("--timeout must be >= 0")
    repo = args.repo.resolve()
    if not repo.is_dir():
        raise UsageError(f"--repo {repo} is not a directory")
    playbook_path = repo / args.playbook
    if not playbook_path.is_file():
        raise UsageError(f"playbook {playbook_path} not found")
    inventories = [p.resolve() for p in (args.inventory or [repo / "inventory" / "hosts.yml"])]
    for inv in inventories:
        if not inv.exists():
            raise UsageError(f"inventory {inv} not found")
    if args.vault_password_file is not None and not args.vault_password_file.is_file():
        raise UsageError(f"--vault-password-file {args.vault_password_file} not found")
    artifacts = (args.artifacts_dir or repo / "artifacts" / "nightly").resolve()
    return Options(
        repo=repo,
        playbook=args.playbook,
        inventories=inventories,
        limit=args.limit.strip(),
        artifacts=artifacts,
        keep_days=args.keep_days,
        lock_file=(args.lock_file or artifacts / "nightly.lock").resolve(),
        history_file=(args.history_file or artifacts / "history.json").resolve(),
        max_drop_percent=args.max_drop_percent,
        rebaseline=args.rebaseline,
        require_gate=args.require_gate,
        extra_vars=extra_vars_cmdline(args.extra_vars),
        tags=args.tags,
        skip_tags=args.skip_tags,
        vault_password_file=args.vault_password_file.resolve() if args.vault_password_file else None,
        timeout=args.timeout,
        ansible_output=args.ansible_output,
        json_out=args.json_out,
    )


def runner_envvars(opts: Options) -> dict[str, str]:
    """The few variables written to ``env/envvars`` (nothing secret)."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {
        # ansible-playbook and its Python from the same venv as this tool (cron's PATH is bare).
        "PATH": bindir + os.pathsep + path if bindir not in path.split(os.pathsep) else path,
        "ANSIBLE_NOCOLOR": "1",
    }
    cfg = opts.repo / "ansible.cfg"
    if cfg.is_file():
        env["ANSIBLE_CONFIG"] = str(cfg)
    return env


def gate_text(hosts: Mapping[str, HostSummary]) -> str:
    """``52.1 tok/s`` for one host, ``a:52.1,b:n/a tok/s`` for several, ``n/a`` for none."""
    figures = {h: (s.gate.decode_tps if s.gate else None) for h, s in sorted(hosts.items())}
    if not figures or all(v is None for v in figures.values()):
        return "n/a"
    if len(figures) == 1:
        return f"{next(iter(figures.values())):.1f} tok/s"
    return ",".join(f"{h}:{'n/a' if v is None else f'{v:.1f}'}" for h, v in figures.items()) + " tok/s"


def run(opts: Options) -> tuple[int, dict[str, Any]]:
    """Lock, run the deploy, summarise, check, record. Returns (exit code, summary)."""
    started = utc_now()
    clock = time.monotonic()
    prefix = f"nightly {started.strftime('%Y-%m-%dT%H:%MZ')} limit={opts.limit}:"
    lock = RunLock(opts.lock_file)
    if not lock.acquire():
        line = f"{prefix} LOCKED another run holds {opts.lock_file} ({lock.holder()}); not starting"
        return EXIT_LOCKED, {
            "schema": SUMMARY_SCHEMA,
            "status": "LOCKED",
            "exit_code": EXIT_LOCKED,
            "limit": opts.limit,
            "started": iso(started),
            "lock_file": str(opts.lock_file),
            "summary_line": line,
        }
    try:
        return _run_locked(opts, started, clock, prefix)
    finally:
        lock.release()


@dataclass
class RunnerOutcome:
    """What ansible-runner left behind."""

    status: str = "error"
    rc: int | None = None
    events: list[Mapping[str, Any]] = field(default_factory=list)
    stdout_tail: str = ""
    error: str = ""
    canceled_by: str | None = None


def invoke_runner(opts: Options, run_dir: Path) -> RunnerOutcome:
    """Run the playbook with ``ansible_runner.run`` in ``run_dir`` (the private data dir).

    SIGTERM/SIGINT/SIGHUP cancel the run through ansible-runner's cancel callback.
    Afterwards ansible-runner's ``command`` file is redacted (it records the environment).
    """
    import ansible_runner  # imported late: --help and usage errors work without it

    outcome = RunnerOutcome()

    def on_signal(signum: int, _frame: Any) -> None:
        outcome.canceled_by = signal.Signals(signum).name

    kwargs: dict[str, Any] = dict(
        private_data_dir=str(run_dir),
        project_dir=str(opts.repo),
        playbook=opts.playbook,
        inventory=[str(p) for p in opts.inventories],
        limit=opts.limit,
        envvars=runner_envvars(opts),
        ident=RUNNER_IDENT,
        quiet=not opts.ansible_output,
        rotate_artifacts=0,
        cancel_callback=lambda: outcome.canceled_by is not None,
    )
    if opts.tags:
        kwargs["tags"] = opts.tags
    if opts.skip_tags:
        kwargs["skip_tags"] = opts.skip_tags
    cmdline = list(opts.extra_vars)
    if opts.vault_password_file:
        cmdline += ["--vault-password-file", str(opts.vault_password_file)]
    if cmdline:
        kwargs["cmdline"] = shlex.join(cmdline)
    if opts.timeout:
        kwargs["timeout"] = opts.timeout
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        runner = ansible_runner.run(**kwargs)
        outcome.status, outcome.rc = runner.status, runner.rc
        outcome.events = list(runner.events)
    except Exception as exc:  # ansible-runner raised before or around the run
        outcome.error = f"{type(exc).__name__}: {short(exc)}"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outcome.stdout_tail = _last_line(run_dir / "artifacts" / RUNNER_IDENT / "stdout")
    redact_command_file(run_dir / "artifacts" / RUNNER_IDENT / "command")
    return outcome


def runner_reasons(outcome: RunnerOutcome, opts: Options, any_host: bool) -> list[str]:
    """Why the run failed as a whole: runner error, cancel, timeout, no host ran (else empty)."""
    if outcome.error:
        return [f"ansible-runner failed: {outcome.error}"]
    if outcome.canceled_by:
        return [f"canceled by {outcome.canceled_by}"]
    if outcome.status == "timeout":
        return [f"canceled after --timeout {opts.timeout:d} s"]
    if (outcome.status != "successful" or outcome.rc != 0) and not any_host:
        return [f"ansible-playbook exited {outcome.rc} before any host ran: {outcome.stdout_tail or outcome.status}"]
    return []


def judge_host(
    name: str, summary: HostSummary, history: dict[str, Any], opts: Options, run_id: str, started: dt.datetime
) -> tuple[dict[str, Any], list[str]]:
    """One host's JSON summary and failure reasons; records its gate figure in ``history``."""
    reasons: list[str] = []
    fatal = [t for t in summary.failed_tasks if t["ignored"] == "no"]
    if fatal and not summary.healthy:
        # The last failure is the one that stopped the host (after a rescue: the rollback's).
        reasons.append(f"{name}: {fatal[-1]['task']} failed: {fatal[-1]['msg'] or '(no message)'}")
    elif not summary.healthy:
        reasons.append(f"{name}: failed={summary.failed:d} unreachable={summary.unreachable:d}")
    gate = summary.gate
    figure = gate.decode_tps if gate else None
    baseline = last_entry(history, name, baseline_only=True)
    previous_run = last_entry(history, name, baseline_only=False)
    prev_tps = as_number(baseline.get("decode_tps")) if baseline else None
    verdict, drop = check_drop(figure, prev_tps, opts.max_drop_percent)
    if opts.rebaseline and verdict in ("ok", "regression"):
        verdict = "rebaseline"
    if verdict == "regression":
        reasons.append(
            f"{name}: decode {figure:.1f} tok/s is {drop:.1f}% below the last recorded {prev_tps:.1f} "
            f"(max {opts.max_drop_percent:g}%)"
        )
    if verdict == "no-figure" and opts.require_gate and summary.healthy:
        reasons.append(f"{name}: the gate reported no decode tok/s (--require-gate)")
    unit_same: bool | None = None
    if gate and gate.unit_invocation_id and previous_run and previous_run.get("unit_invocation_id"):
        unit_same = gate.unit_invocation_id == previous_run.get("unit_invocation_id")
    if gate and figure is not None:
        record_history(
            history,
            name,
            {
                "run_id": run_id,
                "time": iso(started),
                "decode_tps": figure,
                "passed": gate.passed,
                "baseline": bool(summary.healthy and verdict in ("ok", "no-baseline", "rebaseline")),
                "drop_check": verdict,
                "unit_started": gate.unit_started,
                "unit_invocation_id": gate.unit_invocation_id,
            },
        )
    out = {
        "ok": summary.ok,
        "changed": summary.changed,
        "failed": summary.failed,
        "unreachable": summary.unreachable,
        "skipped": summary.skipped,
        "rescued": summary.rescued,
        "ignored": summary.ignored,
        "changed_tasks": summary.changed_tasks,
        "failed_tasks": summary.failed_tasks,
        "restarts": summary.restarts,
        "restart_invocations": summary.restart_invocations,
        "gate": gate.as_dict() if gate else None,
        "drop_check": {
            "verdict": verdict,
            "previous_decode_tps": prev_tps,
            "drop_percent": drop,
            "previous_run": baseline.get("run_id") if baseline else None,
        },
        "unit_same_as_last_run": unit_same,
    }
    return out, reasons


def summary_line(
    prefix: str, ok: bool, totals: Mapping[str, int], gate: str, duration: float, reasons: Sequence[str], run_dir: Path
) -> str:
    """``nightly <time> limit=<limit>: OK hosts=1 changed=0 restarts=0 gate=52.1 tok/s duration=41.2s``."""
    line = (
        f"{prefix} {'OK' if ok else 'FAILED'} hosts={totals['hosts']:d} changed={totals['changed']:d} "
        f"restarts={totals['restarts']:d} gate={gate} duration={duration:.1f}s"
    )
    if reasons:
        line += "; " + "; ".join(reasons) + f"; artifacts={run_dir}"
    return line


def _run_locked(opts: Options, started: dt.datetime, clock: float, prefix: str) -> tuple[int, dict[str, Any]]:
    """The part of :func:`run` done while holding the lock."""
    opts.artifacts.mkdir(parents=True, exist_ok=True)
    run_dir = new_run_dir(opts.artifacts, started)
    pruned, prune_errors = prune_runs(opts.artifacts, opts.keep_days, started, keep=[run_dir.name])

    outcome = invoke_runner(opts, run_dir)
    hosts = summarize_events(outcome.events)
    reasons = runner_reasons(outcome, opts, any_host=bool(hosts))
    history = load_history(opts.history_file)
    host_out: dict[str, Any] = {}
    for name, host in sorted(hosts.items()):
        host_out[name], host_reasons = judge_host(name, host, history, opts, run_dir.name, started)
        reasons.extend(host_reasons)
    if not reasons and (outcome.status != "successful" or outcome.rc != 0):
        # ansible-playbook failed without a host failure to show for it.
        reasons.append(f"ansible-playbook exited {outcome.rc} ({outcome.status})")
    if any(h["gate"] and h["gate"]["decode_tps"] is not None for h in host_out.values()):
        try:
            write_json_atomic(opts.history_file, history)
        except OSError as exc:
            reasons.append(f"could not write {opts.history_file}: {exc}")

    totals = {
        "hosts": len(host_out),
        "changed": sum(h["changed"] for h in host_out.values()),
        "restarts": sum(h["restarts"] for h in host_out.values()),
        "failed": sum(1 for h in host_out.values() if h["failed"] or h["unreachable"]),
    }
    gate = gate_text(hosts)
    duration = time.monotonic() - clock
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "tool": "nightly-deploy",
        "run_id": run_dir.name,
        "started": iso(started),
        "finished": iso(utc_now()),
        "duration_s": round(duration, 3),
        "limit": opts.limit,
        "playbook": opts.playbook,
        "repo": str(opts.repo),
        "inventory": [str(p) for p in opts.inventories],
        "runner": {
            "status": outcome.status,
            "rc": outcome.rc,
            "error": outcome.error or None,
            "artifacts": str(run_dir / "artifacts" / RUNNER_IDENT),
        },
        "totals": totals,
        "hosts": host_out,
        "reasons": reasons,
        "max_drop_percent": opts.max_drop_percent,
        "rebaseline": opts.rebaseline,
        # Where the roles' reports are in ansible-runner's playbook_on_stats event (set_stats).
        "reported_stats": f"artifact_data.{STATS_KEY}",
        "artifacts": str(run_dir),
        "history_file": str(opts.history_file),
        "pruned": pruned,
        "prune_errors": prune_errors,
    }

    def finish() -> None:
        ok = not reasons
        summary.update(
            status="OK" if ok else "FAILED",
            exit_code=EXIT_OK if ok else EXIT_FAILED,
            summary_line=summary_line(prefix, ok, totals, gate, duration, reasons, run_dir),
        )

    finish()
    try:
        write_json_atomic(run_dir / "summary.json", summary)
        write_json_atomic(opts.artifacts / "latest.json", summary)
    except OSError as exc:
        reasons.append(f"could not write the summary: {exc}")
        finish()
    return summary["exit_code"], summary


def _last_line(path: Path) -> str:
    """The last non-empty line of a text file (ansible's final words), or ``''``."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines if line]
    return short(lines[-1]) if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    try:
        opts = parse_options(argv)
    except UsageError as exc:
        sys.stderr.write(f"nightly-deploy: error: {exc}\n")
        return EXIT_USAGE
    try:
        import ansible_runner  # noqa: F401  (checked here for a clear message)
    except ImportError:
        sys.stderr.write(
            f"nightly-deploy: error: ansible_runner is not importable by {sys.executable}; run this tool "
            f"with the controller venv's python (e.g. {opts.repo}/.venv/bin/python)\n"
        )
        return EXIT_USAGE
    code, summary = run(opts)
    line = summary["summary_line"]
    if opts.json_out:
        sys.stderr.write(line + "\n")
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
