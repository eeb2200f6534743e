"""Runs the attacker scenario's steps on the controller: each playbook between the attacker's
``before`` and ``after`` (attacker.py, on the host), mallory's squatter on the port where a step asks.

A step that fails at a planted link (its output names the link's path: a playbook that refuses a link
where it needs its own file or directory, or the service account's server that cannot use its own cache)
changed nothing, if the attacker's manifest says so; when the account that planted it owns the directory
(its own to break), that path is marked guarded (planted no more) and the step runs again, until it runs
past every plant. Each step's record goes to OUT/attacker-STEP.json, and a copy to artifacts/attacker/
(which outlives the scenario): {rc, output, rounds: [the attacker's records], guarded, reached_its_end,
squatter}.

A step has reached its end when its playbook passed, or printed the step's ``reached`` (the sentence of
a failure it is meant to end with, e.g. a rollback's); a step that failed otherwise, at no plant it may
skip, is left as it is (reached_its_end false) for verify to report.

Usage: python3 run_steps.py HOST OUT STEPS_JSON ATTACKER_ARGV_JSON ACCOUNT UNIT (STEPS_JSON: [{name, argv,
learn_only?, reached?, squat?}], argv run in the repository; ATTACKER_ARGV_JSON: the command that runs
attacker.py on the host, through docker exec, with before/watch/after/guarded and the step added;
ACCOUNT and UNIT: the server's service account and its systemd unit).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
STATE = "/var/lib/attacker-harness"
SQUAT_LOG = "/home/mallory/squat.log"
SQUAT_STOP = "/home/mallory/squat.stop"
SQUAT_ERR = "/home/mallory/squat.err"
# A step refused at more plants than this, one per run, is a finding of its own (a run per plant).
MAX_ROUNDS = 4


def attacker(host: str, argv: list[str], *args: str) -> dict[str, Any]:
    """Run attacker.py on the host with ``args``; its JSON record (empty for guarded)."""
    run = subprocess.run(["docker", "exec", host, *argv, *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"attacker.py {' '.join(args[:2])} failed ({run.returncode}): {run.stderr}")
    return json.loads(run.stdout) if run.stdout.strip() else {}


def squat(host: str, port: int, account: str) -> None:
    """Start mallory's squatter on ``port``, in the window between the port guard and the engine's listen
    of the service ``account``'s next start (files/squatter.py, copied by prepare)."""
    subprocess.run(
        ["docker", "exec", "--user", "mallory", host, "rm", "-f", SQUAT_LOG, SQUAT_STOP, SQUAT_ERR], check=True
    )
    subprocess.run(
        [
            "docker",
            "exec",
            "-d",
            "--user",
            "mallory",
            host,
            "sh",
            "-c",
            f"exec python3 -SE /usr/local/lib/squatter.py {port} {account} {SQUAT_LOG} {SQUAT_STOP} 2>{SQUAT_ERR}",
        ],
        check=True,
    )


def squat_end(host: str) -> list[dict[str, Any]]:
    """Stop the squatter; what it received, one record per connection, and how often it held the port."""
    subprocess.run(["docker", "exec", "--user", "mallory", host, "touch", SQUAT_STOP], check=True)
    for _ in range(100):
        log = subprocess.run(["docker", "exec", host, "cat", SQUAT_LOG], capture_output=True, text=True).stdout
        if '"bound"' in log:
            return [json.loads(line) for line in log.splitlines()]
        time.sleep(0.2)
    err = subprocess.run(["docker", "exec", host, "cat", SQUAT_ERR], capture_output=True, text=True).stdout
    raise SystemExit(f"the squatter did not stop; its log: {log!r}; its errors: {err}")


def settled(host: str, unit: str) -> str:
    """The server's ``unit`` once the squatter left: systemd restarts it on its own (Restart=), so the next
    step starts from a host that serves again, not from one whose restart races the deploy's. Its
    state after at most 90 s."""
    state = ""
    for _ in range(90):
        state = subprocess.run(
            ["docker", "exec", host, "systemctl", "is-active", unit], capture_output=True, text=True
        ).stdout.strip()
        if state in ("active", "failed", "inactive"):
            break
        time.sleep(1)
    return state


def refused_at(record: dict[str, Any], rc: int, output: str) -> list[str]:
    """The planted paths a failed run stopped at (its output names them: a playbook that refused a link
    where it needs its own file or directory, or the service account's server that could not use its
    own cache), when the attacker found nothing changed and each was planted by the account that owns
    its directory (an account may break what is its own; a link in a shared directory such as /tmp that
    stops a playbook is a finding: a local user who can refuse every deploy); else none."""
    if rc == 0 or record["canary_changed"] or record["differences"]:
        return []
    # The failure: what Ansible prints after the recap ([ERROR] and the failed task's message); the
    # play's output before it names paths of its own (the by-hand server's log, say).
    output = output[max(output.rfind("PLAY RECAP"), 0) :]
    # A link's path, or a path below it (the link stands where a directory was).
    named = [item for item in record["planted"] if re.search(re.escape(item["path"]) + r"(?![\w.-])", output)]
    return [item["path"] for item in named] if named and all(item["own"] for item in named) else []


def run_step(host: str, step: dict[str, Any], argv: list[str], account: str, unit: str) -> dict[str, Any]:
    """Every round of one step, until it reaches its end or fails at no plant it may skip (or MAX_ROUNDS);
    ``account`` and ``unit``: the server's service account and unit (the squatter waits for the one, the
    other must serve again after it)."""
    rounds, guarded = [], []
    for number in range(1, MAX_ROUNDS + 1):
        name = step["name"] if number == 1 else f"{step['name']}-{number}"
        began = time.monotonic()
        attacker(host, argv, "before", name, *(["--no-plant"] if step.get("learn_only") else []))
        before_s = round(time.monotonic() - began, 1)
        subprocess.run(["docker", "exec", "-d", host, *argv, "watch", name], check=True)
        for _ in range(100):
            if subprocess.run(["docker", "exec", host, "test", "-e", f"{STATE}/watching"]).returncode == 0:
                break
            time.sleep(0.1)
        if step.get("squat"):
            squat(host, step["squat"], account)
        started = time.monotonic()
        proc = subprocess.run(step["argv"], cwd=REPO, capture_output=True, text=True)
        seconds = round(time.monotonic() - started, 1)
        squatter = squat_end(host) if step.get("squat") else None
        if squatter is not None:
            squatter.append({"unit_after": settled(host, unit)})
        began = time.monotonic()
        record = attacker(host, argv, "after", name)
        after_s = round(time.monotonic() - began, 1)
        output = proc.stdout + "\n" + proc.stderr
        rounds.append(dict(record, rc=proc.returncode, seconds=seconds))
        print(
            f"{name}: exit {proc.returncode} in {seconds} s (attacker {before_s} s + {after_s} s), "
            f"{len(record['planted'])} links planted, "
            f"{len(record['learned_now'])} paths learned, canary changed: {record['canary_changed']}, "
            f"root-owned files changed outside the declared paths: {[d['path'] for d in record['differences']]}",
            flush=True,
        )
        reached = proc.returncode == 0 or bool(step.get("reached")) and step["reached"] in " ".join(output.split())
        refused = [] if reached else refused_at(record, proc.returncode, output)
        if not refused:
            break
        guarded += refused
        attacker(host, argv, "guarded", json.dumps(refused))
    return {
        "rc": proc.returncode,
        "output": output,
        "rounds": rounds,
        "guarded": guarded,
        "reached_its_end": reached,
        "squatter": squatter,
    }


def main() -> None:
    """Run every step and keep its record in the scenario's ephemeral directory."""
    host, out, steps, argv = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
    account, unit = sys.argv[5], sys.argv[6]
    # The squatter's own files are the harness's, not a path of the playbooks: never planted at.
    attacker(host, argv, "guarded", json.dumps([SQUAT_LOG, SQUAT_STOP, SQUAT_ERR]))
    kept = REPO / "artifacts" / "attacker"
    kept.mkdir(parents=True, exist_ok=True)
    for step in steps:
        record = json.dumps(run_step(host, step, argv, account, unit))
        (out / f"attacker-{step['name']}.json").write_text(record)
        (kept / f"attacker-{step['name']}.json").write_text(record)


if __name__ == "__main__":
    main()
