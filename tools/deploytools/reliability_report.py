"""Render docs/reliability.md from the figures the reliability scenario produced.

    tools/reliability-report [--results artifacts/reliability/results.json] [--out docs/reliability.md]
                             [--rolling bench/results/rolling_deploy.json]
                             [--fleet-results docs/reliability-results-fleet.json]

``molecule test -s reliability`` (or ``make reliability``, which also runs this) writes the
results: one row per case, each with the exact message, whether the running server was left
untouched, and the measured seconds. This program only formats them; the prose around the
tables (design, limits, the GPU check) lives here too, so the page is regenerated whole.
The section on rolling deploys through the gateway has hand-written rows whose figures come
from ``--rolling`` (``bench/rolling_deploy report``, run by the fleet scenario); without
that file the section says it was not measured. ``--fleet-results`` adds the fault rows that
the fleet scenario's verify writes (a controller killed while the gateway puts a host back),
which need three hosts and a gateway; they are counted with the others.
With ``--check`` it exits 1 when the page on disk differs from what the results give.
With ``--check-rows COMMITTED`` it writes nothing and exits 1 when the results' rows or their
outcomes differ from those of COMMITTED (docs/reliability-results.json), timings aside: the
reliability scenario's verify runs it after its last test, so ``make test`` fails when the
committed page no longer says what the scenario just found.

Every row carries the test that recorded it (``test``) and that test's outcome (``outcome``,
set by the scenario's conftest once the test ended): a row is as expected only when its test
passed and its own verdict (the message matched, nothing found, the mode expected) holds.

Exit status: 0 written (or up to date), 1 ``--check`` or ``--check-rows`` found a difference,
2 usage error (no results file, a results file of another schema).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .reliability_text import (
    ADOPTION,
    BAD_INPUT,
    DESIGN,
    DRAFTERS,
    EXPOSURE,
    FAULTS,
    FILES,
    FLEET,
    INTRO,
    LIMITS,
    ON_PURPOSE,
    PLAN_ONLY,
    ROLLING,
    SECRETS,
    SERVING,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = 1


# Bad DFlash drafters: refused by the launch plan offline (precheck, before anything changes
# on the host), one sentence each. Hand-written, not scenario results: ct129's plan with
# inference_server_speculative_algorithm DFLASH and files/models/dflash-drafter-27b.config.json changed as the
# "how" says; tests/launch_plan/test_launch_plan_draft.py checks every message against the plan.
DRAFTER_ROWS: list[dict[str, str]] = [
    {
        "case": "no drafter synced",
        "how": "`inference_server_speculative_algorithm: DFLASH`, no `model_sync_draft_source`",
        "message": "inference_server_speculative_algorithm is DFLASH, which drafts with a separate model, but "
        "no drafter is synced: set model_sync_draft_source and model_sync_draft_name to the drafter, or "
        "choose NEXTN (the model's own MTP head) or null.",
    },
    {
        "case": "not a DFlash drafter",
        "how": "drafter `architectures: [Qwen3ForCausalLM]`",
        "message": "inference_server_speculative_algorithm is DFLASH, but the drafter of "
        "model_sync_draft_source has the architecture Qwen3ForCausalLM, not DFlashDraftModel: point "
        "model_sync_draft_source at a DFlash drafter, or choose the algorithm the drafter was trained for "
        "(EAGLE, EAGLE3).",
    },
    {
        "case": "hidden size differs",
        "how": "drafter `hidden_size: 4096` (target 5120)",
        "message": "the DFlash drafter of model_sync_draft_source has hidden_size 4096, but the target's is 5120: a "
        "DFlash drafter reads the target's hidden states, so point model_sync_draft_source at the drafter "
        "trained for this target.",
    },
    {
        "case": "draft tokens differ from the block size",
        "how": "`inference_server_speculative_num_draft_tokens: 8` (block 16)",
        "message": "inference_server_speculative_num_draft_tokens sets --speculative-num-draft-tokens to 8, "
        "but the DFlash drafter verifies blocks of 16 tokens (block_size in its config.json): remove it or "
        "set it to 16.",
    },
    {
        "case": "target layer beyond the target",
        "how": "`target_layer_ids: [1, 16, 31, 46, 63]` (64 layers)",
        "message": "the DFlash drafter of model_sync_draft_source reads target_layer_ids [1, 16, 31, 46, 63], but the "
        "target has 64 layers and SGLang captures the output of layer id + 1, so every id must lie between "
        "0 and 62: point model_sync_draft_source at the drafter trained for this target.",
    },
    {
        "case": "mask token outside the vocabulary",
        "how": "`mask_token_id: 248320` (vocabulary 248320)",
        "message": "the DFlash drafter of model_sync_draft_source has mask_token_id 248320, but it must be a token of "
        "the target's vocabulary (0 to 248319), or SGLang 0.5.11 stops when the drafter loads: point "
        "model_sync_draft_source at the drafter trained for this target.",
    },
    {
        "case": "drafter heads and TP",
        "how": "drafter `num_attention_heads: 15`, TP 2",
        "message": "inference_server_tensor_parallel_size is 2, which does not divide the DFlash drafter's "
        "15 attention heads (num_attention_heads): set the tensor-parallel size to one that divides both "
        "the target's and the drafter's heads.",
    },
    {
        "case": "DP attention",
        "how": "`inference_server_overrides: {--enable-dp-attention: true}`",
        "message": "inference_server_overrides['--enable-dp-attention'] enables DP attention, which SGLang 0.5.11 "
        "refuses with DFLASH speculative decoding: remove it, or set inference_server_speculative_algorithm to "
        "another algorithm.",
    },
    {
        "case": "pipeline parallel",
        "how": "`inference_server_overrides: {--pp-size: 2}`",
        "message": "inference_server_overrides['--pp-size'] is 2, but SGLang 0.5.11 runs DFLASH speculative decoding "
        "only with pipeline size 1: remove it or set it to 1.",
    },
]


def cell(value: Any) -> str:
    """One table cell: no newlines, pipes escaped."""
    text = "yes" if value is True else "no" if value is False else "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: Iterable[dict[str, Any]], keys: Sequence[str], code: Sequence[str] = ()) -> str:
    """Markdown rows (the header is in the section text); ``code`` keys are quoted as code."""
    out = []
    for row in rows:
        cells = []
        for key in keys:
            text = cell(row.get(key))
            cells.append(f"`{text}`" if key in code and text else text)
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def as_expected(row: dict[str, Any]) -> bool:
    """Whether a row's test passed and the row's own verdict holds (message matched and server
    untouched, no secret found, the expected mode)."""
    if row.get("outcome") != "passed":
        return False
    if row["table"] == "bad_input":
        return bool(row.get("matched") and row.get("untouched"))
    if row["table"] == "secrets":
        return not row.get("found")
    if row["table"] == "files":
        # A rule (e.g. "uid < 1000") carries the test's verdict in "ok"; a mode is compared as is.
        return bool(row.get("ok", row.get("expected") == row.get("found")))
    return True


def not_as_expected(rows: list[dict[str, Any]]) -> int:
    """How many rows are not :func:`as_expected`."""
    return sum(not as_expected(row) for row in rows)


def row_key(row: dict[str, Any]) -> tuple[str, str]:
    """(table, the row's name): what identifies a row from one run to the next."""
    name = row.get("id") or row.get("case") or row.get("where") or row.get("path") or row.get("fault") or "?"
    return row["table"], str(name)


def row_differences(committed: dict[str, Any], produced: dict[str, Any]) -> list[str]:
    """Rows added, gone, or whose verdict changed between two results files (timings aside)."""
    before = {row_key(r): as_expected(r) for r in committed.get("rows", [])}
    after = {row_key(r): as_expected(r) for r in produced.get("rows", [])}
    out = [f"new row {t}/{n}" for t, n in sorted(set(after) - set(before))]
    out += [f"row gone {t}/{n}" for t, n in sorted(set(before) - set(after))]
    out += [
        f"row {t}/{n}: {'as expected' if before[(t, n)] else 'NOT as expected'} in the committed page, "
        f"{'as expected' if after[(t, n)] else 'NOT as expected'} now"
        for t, n in sorted(set(before) & set(after))
        if before[(t, n)] != after[(t, n)]
    ]
    return out


def _test_cell(row: dict[str, Any]) -> str:
    """The test that recorded a row (function name, with its parameter), and NOT PASSED when it did not pass."""
    name = str(row.get("test") or "?").rsplit("::", 1)[-1]
    return name if row.get("outcome") == "passed" else f"{name}: **NOT PASSED** ({row.get('outcome') or 'no outcome'})"


def _recover_cell(row: dict[str, Any]) -> str:
    """A measured recovery time, or why there is none."""
    value = row.get("recover_s")
    return "no outage: the server was never down" if value is None else str(value)


def rolling_rows(rolling: dict[str, Any]) -> list[dict[str, Any]]:
    """The hand-written rows of the gateway section, with the measured figures."""
    phases = rolling.get("phases", {})
    good, bad = phases.get("good_change", {}), phases.get("bad_change", {})
    return [
        {
            "case": "the gateway in front of the fleet",
            "how": f"{rolling['gateway']} on its own host (group `gateways`); {rolling['hosts']} `transformers serve` "
            "hosts registered as `generic` workers with their model id and the alias `tiny-qwen3.5`; "
            f"{rolling.get('clients')} streaming clients through it during both deploys below",
            "what": f"every request answered through the gateway; p99 before any deploy {rolling['p99_before_s']} s",
            "requests": rolling["requests"],
            "failed": rolling["failed"],
            "cut": rolling["cut"],
        },
        {
            "case": "a good change rolled over every host (the drain)",
            "how": "one more environment variable in the unit, `deploy.yml` with serial 1",
            "what": f"{rolling.get('restarted_hosts')} hosts restarted one at a time, each out of the gateway and "
            f"drained first, back in after its gate; roll {rolling['rollout_s']} s, p50 {rolling['p50_s']} s, "
            f"p99 {rolling['p99_s']} s",
            "requests": good.get("requests"),
            "failed": good.get("failed"),
            "cut": good.get("cut"),
        },
        {
            "case": "a bad change stops at the first host",
            "how": "`--attn-implementation no_such_attention` (transformers refuses it while loading)",
            "what": f"{rolling.get('bad_change_stopped_at')} failed its start, rolled back to last-known-good and "
            "stayed out of the gateway; the two others never restarted and served every request "
            f"({rolling.get('bad_change_s')} s); a good deploy put it back",
            "requests": bad.get("requests"),
            "failed": bad.get("failed"),
            "cut": bad.get("cut"),
        },
    ]


def render(results: dict[str, Any], rolling: dict[str, Any] | None = None, fleet: dict[str, Any] | None = None) -> str:
    """The whole page; ``fleet``'s rows (molecule/fleet's faults) join the reliability scenario's."""
    fleet_rows = (fleet or {}).get("rows", [])
    rows = results["rows"] + fleet_rows
    by = {
        name: [r for r in rows if r["table"] == name]
        for name in ("bad_input", "faults", "secrets", "secrets_on_purpose", "files")
    }
    machine = results.get("machine", {})
    page = [
        INTRO.format(
            minutes=round(results.get("duration_s", 0) / 60, 1),
            generated=results["generated"],
            commit=results.get("commit", "?"),
            cpus=machine.get("cpus", "?"),
            load=", ".join(str(x) for x in machine.get("load_avg", [])),
            image=results.get("image") or "local/bookworm-systemd",
            rows=len(rows),
            counts=", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in by.items() if v),
            exit_status=results.get("pytest_exit_status", "not recorded"),
            failed=not_as_expected(rows),
            fleet=FLEET.format(rows=len(fleet_rows), generated=fleet["generated"], commit=fleet.get("commit", "?"))
            if fleet_rows and fleet
            else "",
        )
    ]
    bad_rows = [
        dict(
            r,
            untouched=("yes" if r.get("untouched") else "NO")
            + ("" if r.get("matched") else " (message NOT as asserted)"),
            test=_test_cell(r),
        )
        for r in by["bad_input"]
    ]
    page += [
        BAD_INPUT,
        table(
            bad_rows,
            ("case", "how", "message", "refused_by", "changed", "untouched", "seconds", "test"),
            code=("message",),
        ),
        "\n",
        PLAN_ONLY,
    ]
    fault_rows = []
    for r in by["faults"]:
        did = r.get("host_did", "")
        if r.get("message"):
            did += f" Message: `{cell(r['message'])[:300]}{'...' if len(r['message']) > 300 else ''}`"
        fault_rows.append(dict(r, host_did=did, recover_s=_recover_cell(r), test=_test_cell(r)))
    page += [DRAFTERS, table(DRAFTER_ROWS, ("case", "how", "message"), code=("message",)), "\n", EXPOSURE, "\n"]
    page += [FAULTS, table(fault_rows, ("fault", "how", "happened", "host_did", "recover_s", "test")), "\n"]
    page += [SECRETS, table(by["secrets"], ("where", "searched", "found")), "\n"]
    page += [ON_PURPOSE, table(by["secrets_on_purpose"], ("where", "mode", "holds")), "\n"]
    page += [FILES, table(by["files"], ("path", "expected", "found"), code=("path",)), "\n"]
    if rolling:
        page += [
            ROLLING.format(measured_at=rolling.get("measured_at", "?"), cpus=rolling.get("cpus", "?")),
            table(rolling_rows(rolling), ("case", "how", "what", "requests", "failed", "cut")),
            "\n",
        ]
    else:
        page += [
            "## Rolling deploys through the gateway\n\nNot measured yet: run `molecule test -s fleet`, "
            "then copy `artifacts/fleet/rolling_deploy.json` to `bench/results/`.\n\n"
        ]
    page += [DESIGN.lstrip("\n"), "\n", SERVING, ADOPTION, LIMITS]
    return "".join(page)


class ReadError(Exception):
    """An input file that cannot be read or is not what the report needs (exit 2)."""


def read_json(path: Path, hint: str = "") -> Any:
    """The JSON content of ``path``, or ReadError naming it (and ``hint``, what to do)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReadError(f"cannot read {path}: {exc}{hint}") from exc


def check_rows(committed: Any, results: dict[str, Any], args: argparse.Namespace) -> int:
    """--check-rows: 0 when the rows and outcomes are the committed ones, else 1 with each difference."""
    differences = row_differences(committed, results)
    for line in differences:
        print(f"reliability-report: {line}", file=sys.stderr)
    if differences:
        print(
            f"reliability-report: {args.results} differs from {args.check_rows} in {len(differences)} row(s): "
            "fix what broke, or run `make reliability` and commit the page and its results",
            file=sys.stderr,
        )
        return 1
    print(f"reliability-report: the {len(results['rows'])} rows and their outcomes are those of {args.check_rows}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=REPO / "artifacts" / "reliability" / "results.json")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument(
        "--rolling",
        type=Path,
        default=REPO / "bench" / "results" / "rolling_deploy.json",
        help="bench/rolling_deploy's figures for the gateway section (optional)",
    )
    parser.add_argument(
        "--fleet-results",
        type=Path,
        default=REPO / "docs" / "reliability-results-fleet.json",
        help="molecule/fleet's fault rows (artifacts/fleet/faults.json, committed as this file; optional)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when --out differs from the rendering")
    parser.add_argument(
        "--check-rows",
        type=Path,
        metavar="COMMITTED",
        help="exit 1 when the rows or their outcomes differ from COMMITTED's (timings aside); writes nothing",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        results = read_json(args.results, "; run `molecule test -s reliability` first")
        if results.get("schema") != SCHEMA or not isinstance(results.get("rows"), list):
            raise ReadError(f"{args.results} is not a schema {SCHEMA} results file")
        rolling = read_json(args.rolling) if args.rolling.exists() else None
        if args.check_rows:
            return check_rows(read_json(args.check_rows), results, args)
        fleet = read_json(args.fleet_results) if args.fleet_results.exists() else None
    except ReadError as exc:
        print(f"reliability-report: {exc}", file=sys.stderr)
        return 2
    page = render(results, rolling, fleet)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != page:
            print(f"reliability-report: {args.out} differs from {args.results}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(
        f"reliability-report: wrote {args.out} ({len(results['rows'])} rows, "
        f"{not_as_expected(results['rows'])} not as expected)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
