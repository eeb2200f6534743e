"""Print the launch plan of an inventory host without connecting to it.

    tools/launch-plan HOST [-i INVENTORY] [-e EXTRA_VARS ...] [--json] [--engine-version VERSION]

Runs playbooks/launch-plan.yml, which includes the inference_server role's own plan.yml
(the code path of a deploy) with the facts a deploy would read from the host taken from
host_vars/<HOST>.yml's ``offline_plan`` and from the repository. Prints the argv and the
environment as JSON, then the notes. ``-e`` passes extra variables to try a change, one launch
setting alone (``-e inference_server_target_concurrency=6``: the profile's others stay); ``--json`` prints
the whole result as one JSON object.

``--engine-version VERSION`` plans a candidate engine beside the one the host runs: the plan is
computed twice, as the host is and with the candidate's lock (``tools/deploytools/launch_plan/engines.json``
names the lock of each supported version), and what differs is printed: the flags, the
environment and the memory budget side by side (KV tokens, mamba slots, effective running
requests, context length). Nothing changes anywhere; a candidate the plan refuses (a known-bad
version) exits 1 with the plan's sentence. A version that is not supported has no lock: it is
planned with the running lock's venv, with a warning.

Exit status: 0 plan printed, 1 plan refused (the one-sentence reason is printed),
2 usage error (unknown host, no ansible-playbook).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks" / "launch-plan.yml"
ENGINE_FACTS = REPO / "tools" / "deploytools" / "launch_plan" / "engines.json"
# The memory budget's figures shown side by side for a candidate engine (plan["budget"] keys).
BUDGET_ROWS = (
    ("kv_tokens", "KV tokens per GPU"),
    ("mamba_slots", "mamba state slots"),
    ("max_running", "effective running requests"),
    ("requested_running", "requested running requests"),
    ("context_length", "context length"),
    ("mem_fraction_static", "--mem-fraction-static"),
    ("free_after_pools_gib", "GiB free after the pools"),
)
# How Ansible wraps a filter's exception; the sentence after it is the plan's own.
FILTER_PREFIX = "The filter plugin 'launch_plan' failed: "


def find_ansible_playbook() -> str | None:
    """ansible-playbook from PATH, else from the repository's controller venv."""
    found = shutil.which("ansible-playbook")
    if found:
        return found
    local = REPO / ".venv" / "bin" / "ansible-playbook"
    return str(local) if local.exists() else None


def refusal(message: str) -> str:
    """The plan's own sentence out of Ansible's wrapping of a task failure."""
    if FILTER_PREFIX in message:
        message = message.split(FILTER_PREFIX, 1)[1]
    return " ".join(message.split())


def run_playbook(
    host: str, extra_vars: list[str], out: Path, inventory: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the offline plan playbook for ``host`` (from ``inventory``, else ansible.cfg's),
    writing its result to ``out``."""
    ansible_playbook = find_ansible_playbook()
    if ansible_playbook is None:
        raise FileNotFoundError("ansible-playbook")
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
    env.setdefault("DEPLOY_CACHE_DIR", str(REPO / ".cache"))
    env.update(
        {
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_DEPRECATION_WARNINGS": "False",
            "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
        }
    )
    cmd = [ansible_playbook, str(PLAYBOOK), "-e", f"launch_plan_host={host}", "-e", f"launch_plan_out={out}"]
    if inventory:
        cmd += ["-i", inventory]
    for extra in extra_vars:
        cmd += ["-e", extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def print_plan(result: dict, as_json: bool) -> None:
    """Argv and environment as JSON, then the notes (or everything as JSON)."""
    plan = result["plan"]
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    print(json.dumps({"argv": plan["argv"], "env": plan["env"]}, indent=2))
    print()
    print("Notes:")
    for note in plan["notes"] + result.get("offline_notes", []):
        print(f"- {note}")
    exposure = result.get("exposure")
    if exposure:
        print()
        print("Exposure (docs/security.md):")
        for name, value in exposure.items():
            print(f"- {name}: {'(none)' if value in (None, [], '') else value}")


def argv_flags(argv: list[str]) -> dict[str, str]:
    """``--flag value...`` of an argv (the entry point before the first flag left out), a bare
    flag as ``true``."""
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for word in argv:
        if word.startswith("--"):
            current = word
            flags[current] = []
        elif current is not None:
            flags[current].append(word)
    return {flag: " ".join(values) if values else "true" for flag, values in flags.items()}


def plan_diff(running: dict, candidate: dict) -> dict:
    """What differs between two plans: flags, environment (name -> [running, candidate], None when
    absent) and the memory budget's figures side by side."""

    def changed(old: dict, new: dict) -> dict[str, list]:
        return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}

    old_budget, new_budget = running.get("budget") or {}, candidate.get("budget") or {}
    return {
        "flags": changed(argv_flags(running["argv"]), argv_flags(candidate["argv"])),
        "env": changed(running["env"], candidate["env"]),
        "budget": {key: [old_budget.get(key), new_budget.get(key)] for key, _ in BUDGET_ROWS},
        "notes": [note for note in candidate["notes"] if note not in running["notes"]],
    }


def print_diff(host: str, running: dict, candidate: dict, version: str, lock: str) -> None:
    """The candidate engine's plan beside the running one's: only what differs."""
    diff = plan_diff(running["plan"], candidate["plan"])
    print(f"{host}: candidate SGLang {version} (lock {lock}) beside the running plan")
    print()
    for title, rows in (("Flags", diff["flags"]), ("Environment variables", diff["env"])):
        print(f"{title} that differ (running -> candidate):")
        for name, (old, new) in rows.items():
            print(f"  {name}: {'(absent)' if old is None else old} -> {'(absent)' if new is None else new}")
        if not rows:
            print("  none")
    print()
    width = max(len(label) for _, label in BUDGET_ROWS)
    print(f"Memory budget per GPU ({'running':>10} {'candidate':>10}):")
    for key, label in BUDGET_ROWS:
        old, new = diff["budget"][key]
        mark = "" if old == new else "   <- differs"
        print(f"  {label:<{width}} {str(old):>10} {str(new):>10}{mark}")
    print()
    print("Notes of the candidate's plan that the running plan does not have:")
    for note in diff["notes"]:
        print(f"- {note}")


def candidate_lock(version: str) -> str | None:
    """The lock the facts file names for a supported SGLang version (None: not supported)."""
    supported = json.loads(ENGINE_FACTS.read_text())["sglang"]["supported"]
    entry = supported.get(version)
    return entry["lock"] if entry else None


def compute(host: str, extra_vars: list[str], inventory: str | None) -> tuple[int, dict | None, str]:
    """Run the offline plan playbook: (exit status, result or None, message for stderr)."""
    with tempfile.TemporaryDirectory(prefix="launch-plan.") as tmp:
        out = Path(tmp) / "plan.json"
        try:
            proc = run_playbook(host, extra_vars, out, inventory)
        except FileNotFoundError:
            return (
                2,
                None,
                "launch-plan: ansible-playbook not found: run `make setup` or put the controller venv on PATH.",
            )
        if not out.exists():
            if proc.returncode == 0:  # the play matched no host
                where = inventory or "inventory/hosts.yml"
                return 2, None, f"launch-plan: {host} is not a host of the inventory ({where})"
            detail = (proc.stdout + proc.stderr).strip()[-4000:]
            return (
                2 if proc.returncode in (4, 5) else 1,
                None,
                f"launch-plan: ansible-playbook failed (exit {proc.returncode}):\n{detail}",
            )
        return 0, json.loads(out.read_text()), ""


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, compute the plan offline, print it."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Exit status: 0 plan printed, 1 plan refused, 2 usage error."
    )
    parser.add_argument("host", help="inventory host name (inventory/hosts.yml)")
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        help="extra variables for ansible-playbook (key=value, JSON or @file); repeatable",
    )
    parser.add_argument("-i", "--inventory", help="inventory file (default: ansible.cfg's, inventory/hosts.yml)")
    parser.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    parser.add_argument(
        "--engine-version",
        metavar="VERSION",
        help="plan this SGLang version as a candidate and print what differs from the running plan",
    )
    args = parser.parse_args(argv)

    runs = [("running", args.extra_vars)]
    lock = None
    if args.engine_version:
        lock = candidate_lock(args.engine_version)
        candidate_vars = [f"offline_engine_version={args.engine_version}"]
        if lock is not None:
            candidate_vars += [f"ml_env_lock={lock}", f"ml_env_expected_engine_version={args.engine_version}"]
        else:  # planned with the running lock's venv: the plan still refuses a known-bad version
            print(
                f"launch-plan: SGLang {args.engine_version} is not a supported version "
                f"({ENGINE_FACTS.relative_to(REPO)}): it has no lock to deploy; add one (docs/upgrading.md)",
                file=sys.stderr,
            )
        runs.append(("candidate", args.extra_vars + candidate_vars))
    results: dict[str, dict] = {}
    for name, extra in runs:
        status, result, message = compute(args.host, extra, args.inventory)
        if result is None:
            print(message, file=sys.stderr)
            return status
        if "error" in result:
            reason = refusal(result["error"])
            if args.json:
                print(json.dumps({"error": reason, "plan": name}, indent=2))
            else:
                which = f" (the {name} plan)" if args.engine_version else ""
                print(f"launch-plan: {args.host}{which}: {reason}", file=sys.stderr)
            return 1
        results[name] = result
    if not args.engine_version:
        print_plan(results["running"], args.json)
    elif args.json:
        diff = plan_diff(results["running"]["plan"], results["candidate"]["plan"])
        print(json.dumps({**results, "diff": diff}, indent=2, sort_keys=True))
    else:
        print_diff(args.host, results["running"], results["candidate"], args.engine_version, lock or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
