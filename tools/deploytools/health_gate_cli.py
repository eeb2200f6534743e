"""Health-and-throughput gate for an LLM server, by hand: the logic of the ``health_gate`` module.

    tools/health-gate --url http://127.0.0.1:30000 --unit inference-server \\
        --min-decode-tps 40 --max-ttft 3 --min-accept-length 1.5 [--json]

Waits for readiness (connection refused = loading, 503 = warming up) while watching a
systemd unit (``--unit``) or a process (``--pid``, with ``--log`` quoted when it dies),
then measures streaming chat completions and compares them with the thresholds.

The gate's own noise (docs/health-gate.md): ``--repeat N`` runs N whole gates back to back
against the one unchanged server (one stream at a time and, with ``--concurrency C`` above 1,
at C, alternating), prints each run's decode tok/s, TTFT, accept length and running requests,
and the spread (max - min) / median of each figure against a third of ``--max-regression-pct``:

    tools/health-gate --url http://127.0.0.1:30000 --pid PID --engine sglang \
        --warmup 8 --requests 8 --concurrency 4 --repeat 5 [--json]

Exit status: 0 pass, 1 fail (server down, not ready in time, too slow, ...), 2 usage error;
with ``--repeat``: 0 when every run passed and the noise is under a third of the margin.
With ``--json`` stdout carries exactly one JSON object (the report, or ``{"error": ...}``
for a usage error); progress goes to stderr unless ``--quiet``.

What the server says (docs/health-gate.md, "Correctness"): by default the gate also asks the
role's probe set ``chat-general`` (``--probe-set NAME|FILE``, ``--correctness off``) and fails a
server that answers fewer than half of its eval (``--min-eval-score``); with ``--baseline`` (an
earlier report) it compares the golden outputs and the score with that one's.

The API key is read from ``$HEALTH_GATE_API_KEY`` or ``--api-key-file``, SGLang's admin key (for
``/flush_cache``) from ``$HEALTH_GATE_ADMIN_API_KEY`` or ``--admin-api-key-file`` (never from the
command line, where ``ps`` would show them). Standard library only (Python 3.8 and later): to
run it on any host, copy ``tools/health-gate`` with ``deploytools/`` (its ``__init__.py`` and
this module) and ``collections/ansible_collections/`` beside it (the gate's package keeps its
import name), or run it from a checkout with ``PYTHONPATH=collections``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

# The gate's package, by the one name it has everywhere (docs/architecture.md): installed in the
# controller's venv (pyproject.toml); in a bundle, ``ansible_collections/`` beside tools/health-gate;
# from a checkout under a python3 without the venv, PYTHONPATH=collections.
from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate

TOOLS = Path(__file__).resolve().parents[1]
ROOT = TOOLS.parent

DEFAULT_PROMPTS = ROOT / "roles" / "health_gate" / "files" / "prompts.json"
PROBES = ROOT / "roles" / "health_gate" / "files" / "probes"
# By hand, with no last-known-good to compare with, a chat model must answer at least half of the
# default probe set's 40 easy questions: a server that streams fluent garbage fast fails the gate.
CLI_MIN_EVAL_SCORE = 0.5
EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageParser(argparse.ArgumentParser):
    """argparse that honours ``--json`` for its own usage errors (still exit 2)."""

    json_mode = False

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        """Print the usage error (as JSON with ``--json``) and exit 2."""
        if self.json_mode:
            print(json.dumps({"error": message, "usage": True}))
            sys.exit(EXIT_USAGE)
        super().error(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line -> namespace (exit 2 on a usage error)."""
    d = llm_gate.DEFAULTS
    p = UsageParser(
        prog="health-gate", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.json_mode = "--json" in (argv if argv is not None else sys.argv[1:])

    def floats(*options: tuple[str, str, str | None]) -> None:
        """Float options (flag, destination, help) whose defaults are the gate's own."""
        for flag, dest, text in options:
            p.add_argument(flag, dest=dest, type=float, default=d[dest], help=text)

    p.add_argument("--url", default=d["url"], help="server base URL")
    watch = p.add_mutually_exclusive_group()
    watch.add_argument("--unit", help="systemd unit to watch (fail at once if it fails or restarts)")
    watch.add_argument("--pid", type=int, help="process id to watch instead of a unit")
    p.add_argument("--log", dest="log_file", help="with --pid: log file quoted when the process dies")
    p.add_argument(
        "--allow-prior-restarts",
        action="store_true",
        help="do not fail when the unit already restarted (NRestarts > 0) before the gate",
    )
    p.add_argument("--model", help="model id (default: first id of /v1/models; required when it lists none)")
    p.add_argument("--api-key-file", help="file holding the API key (else $HEALTH_GATE_API_KEY)")
    p.add_argument(
        "--listener-user",
        help="the account that runs the server: refuse, before any key is sent, a listener on the URL's port "
        "(of this host) that belongs to another account",
    )
    p.add_argument(
        "--public-url",
        default=d["public_url"],
        help="the API front's public bind, with the server behind it on --url (loopback): with an admin key, "
        "its /server_info and /get_server_info are asked with the API key instead of the server's, and the gate "
        "fails when they hand the admin key over (empty: not asked)",
    )
    p.add_argument(
        "--public-listener-user",
        help="the account that runs the API front: refuse, before any key is sent, a listener on --public-url's "
        "port (of this host) that belongs to another account",
    )
    p.add_argument(
        "--ca-file",
        default=d["ca_file"],
        help="the CA (PEM) that an https URL's certificate is verified with (empty: the system's CAs)",
    )
    p.add_argument(
        "--tls-server-name",
        default=d["tls_server_name"],
        help="the name an https URL's certificate must be issued to (empty: the URL's host)",
    )
    p.add_argument("--engine", choices=llm_gate.ENGINES, default=d["engine"])
    floats(
        ("--ready-timeout", "ready_timeout_s", "seconds to wait for readiness"),
        ("--poll-interval", "poll_interval_s", None),
        ("--health-timeout", "health_timeout_s", None),
        ("--request-timeout", "request_timeout_s", "limit for one request and for silence within its stream"),
    )
    p.add_argument("--warmup", dest="warmup_requests", type=int, default=d["warmup_requests"])
    p.add_argument("--requests", type=int, default=d["requests"])
    p.add_argument("--concurrency", type=int, default=d["concurrency"])
    p.add_argument("--max-tokens", type=int, default=d["max_tokens"])
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSON file of prompts")
    floats(
        ("--min-decode-tps", "min_decode_tps", "minimum mean decode tok/s per request (0: no check)"),
        ("--max-ttft", "max_ttft_s", "maximum TTFT p95 in seconds (0: no check)"),
        (
            "--min-accept-length",
            "min_accept_length",
            "minimum MTP accept length, when the engine reports one (0: no check)",
        ),
    )
    p.add_argument(
        "--min-running-requests",
        type=int,
        default=d["min_running_requests"],
        help="minimum requests the server runs at once, by SGLang's /server_info (0: no check)",
    )
    p.add_argument(
        "--probe-set",
        default="chat-general",
        help="the correctness probe set: a name of the role's files/probes/ or a JSON file (docs/health-gate.md)",
    )
    p.add_argument("--correctness", choices=llm_gate.CORRECTNESS_MODES, default=d["correctness"])
    floats(
        ("--min-eval-score", "min_eval_score", "lowest share of the probe set's eval answered exactly (0: no check)"),
        ("--eval-margin-pct", "eval_margin_pct", "with --baseline: points of the eval the baseline's may lead by"),
        ("--golden-min-match-share", "golden_min_match_share", "with --baseline: share of golden outputs the same"),
    )
    p.set_defaults(min_eval_score=CLI_MIN_EVAL_SCORE)
    p.add_argument("--accept-output-change", action="store_true", help="with --baseline: outputs may differ on purpose")
    p.add_argument("--admin-api-key-file", help="file holding SGLang's admin key, for /flush_cache")
    p.add_argument(
        "--baseline",
        metavar="FILE",
        help="compare with this earlier gate report (or its baseline mapping): the relative gate",
    )
    p.add_argument(
        "--max-regression-pct",
        type=float,
        default=10.0,
        help="with --baseline: fail when a figure is worse than the baseline's by more than this %% (default 10)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=0,
        metavar="N",
        help="measure the gate's own noise: N gates of this one server (one stream and --concurrency), "
        "the spread of each figure against a third of --max-regression-pct (no --baseline)",
    )
    p.add_argument("--journal-max-lines", type=int, default=d["journal_max_lines"])
    p.add_argument("--report-dir", help="store the report there (<UTC timestamp>.json + latest.json)")
    p.add_argument("--keep-reports", type=int, default=d["keep_reports"])
    p.add_argument(
        "--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata copied into the report (repeatable)"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p.parse_args(argv)


def _secret(path: str | None, variable: str, flag: str) -> str | None:
    """A key from the file ``path``, else from the environment ``variable`` (never from the command line)."""
    if not path:
        return os.environ.get(variable) or None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise llm_gate.GateUsageError(f"cannot read {flag}: {exc}") from exc


def _probe_set(value: str) -> str:
    """The probe set's path: a name of the role's files/probes/ or a path as given."""
    named = PROBES / f"{value}.json"
    return str(named) if "/" not in value and named.exists() else value


def options_from(args: argparse.Namespace) -> dict[str, Any]:
    """Namespace -> llm_gate options; raises GateUsageError for bad --meta or key file."""
    meta: dict[str, str] = {}
    for item in args.meta:
        if "=" not in item:
            raise llm_gate.GateUsageError(f"--meta wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        meta[key] = value
    api_key = _secret(args.api_key_file, "HEALTH_GATE_API_KEY", "--api-key-file")
    admin_api_key = _secret(args.admin_api_key_file, "HEALTH_GATE_ADMIN_API_KEY", "--admin-api-key-file")
    if args.log_file and not args.pid:
        raise llm_gate.GateUsageError("--log goes with --pid")
    if args.repeat < 0 or args.repeat == 1:
        raise llm_gate.GateUsageError(f"--repeat wants 2 or more runs (0: one ordinary gate), got {args.repeat}")
    if args.repeat and args.baseline:
        raise llm_gate.GateUsageError(
            "--repeat measures the gate against the same server: leave out --baseline (the margin is "
            "--max-regression-pct)"
        )
    baseline = None
    if args.baseline:
        try:
            loaded = json.loads(Path(args.baseline).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise llm_gate.GateUsageError(f"cannot read --baseline: {exc}") from exc
        # A whole report (it has an aggregate) or the baseline mapping last-known-good records.
        baseline = llm_gate.baseline_of(loaded) if isinstance(loaded, dict) and "aggregate" in loaded else loaded
    return {
        "url": args.url,
        "unit": args.unit,
        "pid": args.pid,
        "log_file": args.log_file,
        "allow_prior_restarts": args.allow_prior_restarts,
        "model": args.model,
        "api_key": api_key,
        "listener_user": args.listener_user,
        "public_url": args.public_url,
        "public_listener_user": args.public_listener_user,
        "ca_file": args.ca_file,
        "tls_server_name": args.tls_server_name,
        "engine": args.engine,
        "ready_timeout_s": args.ready_timeout_s,
        "poll_interval_s": args.poll_interval_s,
        "health_timeout_s": args.health_timeout_s,
        "request_timeout_s": args.request_timeout_s,
        "warmup_requests": args.warmup_requests,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "prompts": args.prompts,
        "min_decode_tps": args.min_decode_tps,
        "max_ttft_s": args.max_ttft_s,
        "min_accept_length": args.min_accept_length,
        "min_running_requests": args.min_running_requests,
        "baseline": baseline,
        "max_regression_pct": args.max_regression_pct if baseline else 0.0,
        "journal_max_lines": args.journal_max_lines,
        "report_dir": args.report_dir,
        "keep_reports": args.keep_reports,
        "metadata": meta,
        "correctness": args.correctness,
        "probe_set": _probe_set(args.probe_set) if args.correctness != "off" else None,
        "admin_api_key": admin_api_key,
        "min_eval_score": args.min_eval_score,
        "eval_margin_pct": args.eval_margin_pct,
        "golden_min_match_share": args.golden_min_match_share,
        "accept_output_change": args.accept_output_change,
    }


def repeat(args: argparse.Namespace, options: dict[str, Any], progress: Any) -> int:
    """``--repeat N``: the runs and the spread of their figures (JSON with ``--json``); the exit status."""
    result = llm_gate.run_repeat(
        options, args.repeat, args.max_regression_pct, progress=None if args.quiet else progress
    )
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(llm_gate.repeat_table(result))
    return EXIT_PASS if result["ok"] else EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    """Run the gate; return the exit status."""
    args = parse_args(argv)

    def progress(line: str) -> None:
        """One progress line on stderr, unless ``--quiet``."""
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        options = options_from(args)
        if args.repeat:
            return repeat(args, options, progress)
        report = llm_gate.run_gate(options, progress=None if args.quiet else progress)
    except llm_gate.GateUsageError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "usage": True}))
        else:
            print(f"health-gate: usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.report_dir:
        try:
            report["report_path"] = llm_gate.store_report(report, args.report_dir, int(args.keep_reports))
        except OSError as exc:
            print(f"health-gate: could not store the report in {args.report_dir}: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    elif report["passed"]:
        print(report["summary"])
    else:
        print(llm_gate.failure_message(report))
    return EXIT_PASS if report["passed"] else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
