"""Print the launch plan of an inventory host without connecting to it.

    tools/launch-plan HOST [-i INVENTORY] [-e EXTRA_VARS ...] [--json]

Runs playbooks/launch-plan.yml, which includes the inference_server role's own plan.yml
(the code path of a deploy) with the facts a deploy would read from the host taken from
host_vars/<HOST>.yml's ``offline_plan`` and from the repository. Prints the argv and the
environment as JSON, then the notes. ``-e`` passes extra variables to try a change
(``-e '{"inference_server_settings": {"tensor_parallel_size": 1}}'``); ``--json`` prints
the whole result as one JSON object.

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

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = REPO / "playbooks" / "launch-plan.yml"
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
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="launch-plan.") as tmp:
        out = Path(tmp) / "plan.json"
        try:
            proc = run_playbook(args.host, args.extra_vars, out, args.inventory)
        except FileNotFoundError:
            print(
                "launch-plan: ansible-playbook not found: run `make setup` or put the controller venv on PATH",
                file=sys.stderr,
            )
            return 2
        if not out.exists():
            if proc.returncode == 0:  # the play matched no host
                print(
                    f"launch-plan: {args.host} is not a host of the inventory "
                    f"({args.inventory or 'inventory/hosts.yml'})",
                    file=sys.stderr,
                )
                return 2
            print(f"launch-plan: ansible-playbook failed (exit {proc.returncode}):", file=sys.stderr)
            print((proc.stdout + proc.stderr).strip()[-4000:], file=sys.stderr)
            return 2 if proc.returncode in (4, 5) else 1
        result = json.loads(out.read_text())
    if "error" in result:
        message = refusal(result["error"])
        if args.json:
            print(json.dumps({"error": message}, indent=2))
        else:
            print(f"launch-plan: {args.host}: {message}", file=sys.stderr)
        return 1
    print_plan(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
