"""Faults: what happened, what the host did, how long until it served again (measured).

The tests run in file order and each starts from the state the previous one left; the
server must be serving (and gated) at the end of each. Times are wall-clock seconds on the
2-core CI machine, from the fault to the end of the run that proved the host serves again
(its gate passed), unless a row says otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    ENGINE_SECRET,
    FAST_GATE,
    HOST,
    PORT,
    REPO,
    SECRETS,
    UNIT,
    Deployer,
    RunHandle,
    dexec,
    full_match,
    healthy,
    record,
    rsync_sent_bytes,
    server_state,
    sh,
    task_started,
    unit_props,
    unit_sha_and_lkg,
    wait_for,
    write_shard,
)

# A change that restarts the server (a new Environment= line), kept for the next tests.
MARK_A = {"inference_server_environment": {"RELIABILITY_MARK": "a"}}
MARK_B = {"inference_server_environment": {"RELIABILITY_MARK": "b"}}
LOCK_REFUSAL = (
    r"Another deploy holds /run/llm-deploy/deploy\.lock on rel-molecule: run \S+ of \S+ on controller "
    r"\S+ \(pid \d+\), taken \S+ \(\d+ s ago\); wait for it to finish, or, if that run is gone, remove "
    r"/run/llm-deploy/deploy\.lock on the host \(a lock older than deploy_lock_stale_after_s, 21600 s, is "
    r"taken over automatically\)\."
)
BACK_ON_LKG = (
    r"Deploy step 'Fail when the gate failed' failed on rel-molecule: gate FAIL .* The host is back on "
    r"its last-known-good state \(engine transformers 5\.6\.0, model revision [0-9a-f]{12}, venv lock "
    r"transformers-cpu\) and serving: gate PASS: .*"
)


# The site-packages of the venv the server runs from.
VENV_SITE = "$(readlink -f /opt/ml-env)/lib/python3*/site-packages"


def main_pid() -> int:
    """The unit's main PID (0 when none)."""
    return int(unit_props("MainPID")["MainPID"])


def environ_of(pid: int) -> str:
    """The environment of a process in the container, NUL-separated."""
    return dexec("cat", f"/proc/{pid}/environ", check=False)


def gate_reason(message: str) -> str:
    """The gate's own reason inside a rolled-back deploy's message."""
    found = re.search(r"failed on rel-molecule: (gate FAIL.*?)(?: The host is back|$)", message)
    return found.group(1) if found else message[:200]


def lock_held() -> bool:
    """Whether the host's deploy lock file exists."""
    return sh("test -e /run/llm-deploy/deploy.lock && echo yes || echo no").strip() == "yes"


def in_background(fn: Any) -> threading.Thread:
    """Run ``fn`` in a daemon thread."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_controller_killed_mid_deploy_then_two_deploys_at_once(deployer: Deployer, good_state: dict[str, Any]) -> None:
    """Kill the controller after the new unit is written but before the restart; run again.

    While that second run holds the lock, a third deploy starts: it must be refused at once.
    """
    before = server_state()

    def kill_before_restart(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, "Note whether the unit or one of its inputs changed in this run"):
            handle.kill()

    killed = deployer.run(MARK_A, watch=kill_before_restart, verbose=True)
    assert killed.killed, f"the run ended before the unit was written:\n{killed.tail()}"
    after_kill = server_state()
    unit = sh(f"cat /etc/systemd/system/{UNIT}.service")
    assert "RELIABILITY_MARK=a" in unit, "the killed run had not written the new unit yet"
    assert after_kill["MainPID"] == before["MainPID"], "the server restarted before the kill"
    assert lock_held(), "the killed run's lock should still be on the host"

    rerun = deployer.start(MARK_A, verbose=True)
    # Once the rerun is past its lock (it took over the dead run's), start a third deploy.
    assert wait_for(lambda: any(task_started(e, "Refuse a host that has no profile") for e in list(rerun.events)), 60)
    concurrent = deployer.run(MARK_A)
    second = rerun.wait(timeout=600)
    after = server_state()
    pid = main_pid()

    took_over = [w for w in second.warnings() if "Took over the deploy lock" in w]
    record(
        "faults",
        id="controller-killed",
        fault="the controller's run is killed mid-deploy and run again",
        how="SIGKILL to ansible-playbook and its workers right after the new unit file (a new Environment= "
        "line) was written, before the deploy restarted the server; then the same deploy again",
        happened=f"the host kept the new unit file with the old process (MainPID {before['MainPID']} unchanged) "
        "and the killed run's lock",
        host_did="the rerun took over the lock of the dead run (warning), found the unit file newer than the "
        "running process, restarted the server, gated it and recorded it as last-known-good",
        evidence=took_over[:1] + second.messages("Say why the server restarts"),
        recover_s=second.duration_s,
        rc=second.rc,
    )
    record(
        "faults",
        id="two-deploys",
        fault="two deploys start at once on one host",
        how="a third deploy started while the second held the host's lock",
        happened="the third run met the lock of the live second run",
        host_did=f"refused it in {concurrent.duration_s} s with one sentence naming the holder; the second run "
        "went on untouched",
        message=concurrent.message,
        recover_s=None,  # the second run went on: no outage to recover from
        rc=concurrent.rc,
    )

    assert second.rc == 0, second.tail()
    assert took_over, f"no takeover warning: {second.warnings()}"
    restart_reasons = second.messages("Say why the server restarts")
    assert any("an earlier deploy stopped before its restart" in m for m in restart_reasons), restart_reasons
    assert any(t.endswith("Restart the server") for t in second.changed_tasks()), second.changed_tasks()
    assert pid != int(before["MainPID"]) and "RELIABILITY_MARK=a" in environ_of(pid)
    assert concurrent.rc != 0 and full_match(LOCK_REFUSAL, concurrent.message), concurrent.message
    assert not lock_held() and after["ActiveState"] == "active"


def test_engine_crashes_during_the_gate(deployer: Deployer) -> None:
    """kill -9 of the new engine while the gate measures it: the deploy rolls back."""
    old_pid = main_pid()
    crashed: dict[str, float] = {}

    def crash(handle: RunHandle) -> None:
        assert wait_for(lambda: main_pid() not in (0, old_pid) and healthy(), 120)
        crashed["pid"] = main_pid()
        dexec("kill", "-9", str(crashed["pid"]))
        crashed["at"] = handle.mark("crash")

    def watch(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, "Run the health gate on the host") and "at" not in crashed and "t" not in crashed:
            crashed["t"] = 1
            in_background(lambda: crash(handle))
        if task_started(event, "Roll back to the last-known-good state and fail with one message"):
            handle.mark("rollback")

    # The failing deploy also rotates the secrets (set 1): the rollback must bring set 0 back.
    deployer.set_secrets(SECRETS[1])
    try:
        run = deployer.run(MARK_B, watch=watch, verbose=True)
    finally:
        deployer.set_secrets(SECRETS[0])
    pid = main_pid()
    detect = run.marks.get("rollback", 0) - run.marks.get("crash", 0)
    key_file = sh(f"cat /etc/{UNIT}/api-key.yaml")
    record(
        "faults",
        id="crash-during-gate",
        fault="the engine crashes during the gate",
        how="a deploy that changes the unit; once the new engine answered /health, kill -9 of its main PID",
        happened="the engine died while the gate was measuring it",
        host_did=f"the gate failed {detect:.1f} s after the crash ({gate_reason(run.message)}); the rescue "
        "restored the last-known-good unit, secrets and API key file (the run had rotated them), "
        "restarted and gated it, and the play failed with one message",
        message=run.message[:400],
        recover_s=round(run.duration_s - run.marks.get("crash", 0), 1),
        rc=run.rc,
    )
    assert "at" in crashed, "the engine was never killed"
    assert run.rc != 0 and full_match(BACK_ON_LKG, run.message), run.message
    assert pid not in (0, crashed["pid"]) and "RELIABILITY_MARK=a" in environ_of(pid), "not back on last-known-good"
    assert "RELIABILITY_MARK=b" not in sh(f"cat /etc/systemd/system/{UNIT}.service")
    assert SECRETS[0]["api_key"] in key_file and SECRETS[1]["api_key"] not in key_file, "the key was not rolled back"
    assert f"{ENGINE_SECRET}={SECRETS[0]['engine_secret']}" in environ_of(pid)
    assert healthy() and not lock_held()


def test_engine_hangs_without_answering_during_the_nightly_run(deployer: Deployer, nightly_dir: Path) -> None:
    """SIGSTOP of the engine while the nightly redeploy (tools/nightly-deploy, a no-op) gates it."""
    stopped: dict[str, Any] = {}
    since = sh("date '+%Y-%m-%d %H:%M:%S'").strip()
    old_pid = main_pid()

    def hang() -> None:
        # Once the gate's first chat request reached the server, freeze the engine (no crash).
        if wait_for(
            lambda: (
                "POST /v1/chat/completions"
                in sh(f"journalctl -u {UNIT} --since '{since}' --no-pager -o cat", check=False)
            ),
            300,
            0.3,
        ):
            dexec("kill", "-STOP", str(old_pid))
            stopped["at"] = time.time()

    extra = dict(FAST_GATE, **MARK_A)
    started = time.time()
    thread = in_background(hang)
    nightly = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "nightly-deploy"),
            "--limit",
            "rel-molecule",
            "--inventory",
            str(deployer.inventory),
            "--vault-password-file",
            str(deployer.vault_password),
            "--artifacts-dir",
            str(nightly_dir),
            "--json",
            "-e",
            json.dumps(extra),
        ],
        capture_output=True,
        text=True,
        env=deployer.env("default"),
        timeout=900,
    )
    ended = time.time()
    thread.join(5)
    deployer.outputs.append(("tools/nightly-deploy (stdout, stderr)", nightly.stdout + nightly.stderr))
    summary = json.loads(nightly.stdout)
    host = summary["hosts"].get("rel-molecule", {})
    rollback_at = _first_event_time(nightly_dir, "Roll back to the last-known-good state and fail with one message")
    pid = main_pid()
    detect = (rollback_at - stopped["at"]) if rollback_at and "at" in stopped else None
    reasons = _last_failure(nightly_dir)
    record(
        "faults",
        id="hang-during-gate",
        fault="the engine hangs without answering (no crash)",
        how="the nightly redeploy (tools/nightly-deploy, nothing to change); once the gate's first chat request "
        "reached the engine, SIGSTOP of its main PID (alive, port open, silent)",
        happened="the request got no answer; /health would time out too",
        host_did=f"the gate failed when the request stayed silent for health_gate_request_timeout_s (20 s here, "
        f"300 s by default; {detect if detect is None else round(detect, 1)} s from the freeze to the "
        "rollback); the unit was already the last-known-good one and the gate had measured nothing, so "
        "the rescue restarted it (systemd sends SIGCONT after SIGTERM) and gated it again; the nightly "
        f"run exited {nightly.returncode} with the reason, restarts={host.get('restarts')}",
        message=reasons[:400],
        recover_s=round(ended - stopped.get("at", started), 1),
        rc=nightly.returncode,
    )
    assert "at" in stopped, "the engine was never stopped"
    assert nightly.returncode == 1 and summary["status"] == "FAILED", nightly.stdout[-2000:]
    assert full_match(BACK_ON_LKG, reasons), reasons
    assert any("Fail with the reason now that the host serves" in r for r in summary.get("reasons") or [])
    assert pid not in (0, old_pid) and healthy() and not lock_held()


def _newest_run_events(artifacts: Path) -> list:
    """The ansible-runner events of the newest nightly run, in order."""
    runs = sorted(p for p in artifacts.iterdir() if p.is_dir() and (p / "artifacts").is_dir())
    paths = (runs[-1] / "artifacts" / "deploy" / "job_events").glob("*.json")
    return [json.loads(p.read_text()) for p in sorted(paths, key=lambda p: int(p.name.split("-", 1)[0]))]


def _last_failure(artifacts: Path) -> str:
    """The message of the last failed task of the newest nightly run (whitespace-normalised)."""
    failed = [
        e
        for e in _newest_run_events(artifacts)
        if e.get("event") == "runner_on_failed" and not e.get("event_data", {}).get("ignore_errors")
    ]
    return " ".join(str(failed[-1]["event_data"]["res"].get("msg", "")).split()) if failed else ""


def _first_event_time(artifacts: Path, task: str) -> float | None:
    """When a task started in the newest nightly run's ansible-runner events (Unix seconds)."""
    for event in _newest_run_events(artifacts):
        if event.get("event") == "playbook_on_task_start" and event.get("event_data", {}).get("task", "") == task:
            return dt.datetime.fromisoformat(event["created"]).replace(tzinfo=dt.timezone.utc).timestamp()
    return None


def test_an_orphan_of_another_owner_holds_the_port(deployer: Deployer) -> None:
    """A foreign process holds the port when the unit starts: refused and named, never killed."""
    sh(f"systemctl stop {UNIT}; systemd-run --unit rel-orphan python3 -m http.server {PORT} --bind 127.0.0.1; sleep 1")
    try:
        started = time.monotonic()
        start = dexec("systemctl", "start", UNIT, check=False)
        failed_after = round(time.monotonic() - started, 2)
        # Two more tries: each is refused the same way (the guard never touches the process).
        for _ in range(2):
            dexec("systemctl", "start", UNIT, check=False)
        limit = unit_props("ActiveState", "Result")
        journal = sh(f"journalctl -u {UNIT} -n 20 --no-pager -o cat", check=False)
        guard = next((line for line in journal.splitlines() if line.startswith("port-guard:")), "")
        refused = deployer.run(MARK_A)
        alive = sh("systemctl is-active rel-orphan", check=False).strip()
    finally:
        sh("systemctl stop rel-orphan", check=False)
    recovered = deployer.run(MARK_A)
    record(
        "faults",
        id="orphan-foreign",
        fault="an orphan process of another owner holds the port when the unit starts",
        how=f"`python3 -m http.server {PORT}` (transient unit rel-orphan) holds the port; `systemctl start "
        f"{UNIT}`, then a deploy; then the orphan's owner stops it and the deploy runs again",
        happened="the unit's ExecStartPre port guard found the port taken by a process outside the unit",
        host_did=f"the unit failed after {failed_after} s without touching the process (journal: '{guard}'); "
        f"three tries left it {limit['ActiveState']} ({limit['Result']}); the deploy's preflight refused "
        f"too, naming it; the orphan was still {alive}; once its owner stopped it, the next deploy "
        "cleared the failed state (reset-failed) and started the server",
        message=refused.message,
        recover_s=recovered.duration_s,
        rc=recovered.rc,
    )
    assert "is already taken by" in guard and "rel-orphan.service" in guard, journal
    assert failed_after < 5, start
    # exit-code (the guard refused) or start-limit-hit (StartLimitBurst reached): failed, not running.
    assert limit["ActiveState"] == "failed" and limit["Result"] in ("exit-code", "start-limit-hit"), limit
    assert refused.rc != 0 and re.search(
        r"Port 8000 on rel-molecule is already taken by .*http\.server 8000 "
        r"--bind 127\.0\.0\.1 \(pid \d+, unit rel-orphan\.service\)",
        refused.message,
    )
    assert alive == "active", "the foreign process must not be killed"
    assert recovered.rc == 0, recovered.tail()
    assert healthy() and not lock_held()


SQUAT = f"""import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT:d}))
s.listen()
time.sleep(3600)
"""


def test_a_left_over_of_our_own_unit_holds_the_port() -> None:
    """A process left in the unit's own control group holds the port: it is ours, so it is stopped."""
    cgroup = unit_props("ControlGroup")["ControlGroup"]
    assert cgroup, "the unit is not running"
    sh(f"systemctl stop {UNIT}")
    # What systemd finds after an unclean stop (sglang #15165, #23627): a process of the unit's
    # own cgroup that outlived it and still holds the port. Made by hand: the same cgroup, again.
    dexec("sh", "-c", "cat > /tmp/rel-squat.py", stdin=SQUAT)
    pid = sh("python3 /tmp/rel-squat.py >/dev/null 2>&1 </dev/null & echo $!").strip()
    assert wait_for(lambda: sh(f"grep -c ':{PORT:04X} .* 0A ' /proc/net/tcp || true").strip() not in ("", "0"), 10)
    sh(
        "for h in systemd unified; do test -d /sys/fs/cgroup/$h || continue; "
        f"mkdir -p /sys/fs/cgroup/$h{cgroup}; echo {pid} > /sys/fs/cgroup/$h{cgroup}/cgroup.procs; done"
    )
    started = time.monotonic()
    dexec("systemctl", "start", UNIT, check=False)
    assert wait_for(healthy, 120)
    serving_after = round(time.monotonic() - started, 1)
    journal = sh(f"journalctl -u {UNIT} -n 40 --no-pager -o cat", check=False)
    left_over = next((line for line in journal.splitlines() if "left-over process" in line), "")
    guard = next((line for line in journal.splitlines() if line.startswith("port-guard:")), "")
    gone = sh(f"test -d /proc/{pid} && echo alive || echo gone").strip()
    record(
        "faults",
        id="orphan-own",
        fault="a left-over process of our own unit holds the port when the unit starts",
        how="the unit stopped; a process listening on the port moved into the unit's own control group (what "
        "systemd finds after an unclean stop), then `systemctl start`",
        happened=f"systemd: '{left_over}'",
        host_did=f"the port guard stopped it ('{guard}') and the engine started; serving "
        f"{serving_after} s after the start",
        recover_s=serving_after,
        rc=0,
    )
    assert "Found left-over process" in left_over, journal
    assert "a process left over in inference-server.service" in guard, journal
    assert gone == "gone"


def test_rsync_killed_mid_sync(deployer: Deployer, workdir: Path) -> None:
    """SIGKILL of the controller's rsync in the middle of a model push; the next run resumes."""
    src = workdir / "big-model"
    src.mkdir()
    shards, size = 4, 24 * 1024 * 1024
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        write_shard(src / name, size)
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": shards * size}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}})
    )
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "architectures": ["Tiny"]}))
    total = sum(p.stat().st_size for p in src.iterdir())
    play = workdir / "sync.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Sync a model only",
                    "hosts": "rel-molecule",
                    "gather_facts": False,
                    "roles": [{"role": "model_sync"}],
                }
            ]
        )
    )
    sync_vars = {
        "model_sync_root": "/srv/models",
        "model_sync_name": "rel-big",
        "model_sync_cli_path": "",
        "model_sync_disk_reserve_mib": 16,
        "model_sync_rsync_opts": ["--bwlimit=12m", "--stats"],
        "model_sync_source": {"type": "controller_dir", "path": str(src)},
    }
    incoming = "/srv/models/rel-big/.incoming"
    killed_at: dict[str, Any] = {}

    def kill_rsync(handle: RunHandle) -> None:
        assert wait_for(
            lambda: int(sh(f"du -sb {incoming} 2>/dev/null | cut -f1 || echo 0").strip() or 0) > total * 0.4, 120, 0.2
        )
        victims = [p for p in os.listdir("/proc") if p.isdigit() and _is_our_rsync(int(p), str(src))]
        for victim in victims:
            os.kill(int(victim), signal.SIGKILL)
        killed_at["pids"] = victims
        killed_at["t"] = handle.mark("rsync-killed")

    def watch(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, "Push the model from the controller into the incoming snapshot") and not killed_at:
            killed_at["started"] = True
            in_background(lambda: kill_rsync(handle))

    try:
        first = deployer.run(sync_vars, playbook=str(play), watch=watch, fast_gate=False)
        kept = int(sh(f"du -sb {incoming} | cut -f1").strip())
        listing = [
            line.rsplit(" ", 1)
            for line in sh(f"cd {incoming} && find . -type f -printf '%P %s\\n'").split("\n")
            if line.strip()
        ]
        partial = sum(int(size) for name, size in listing if name.startswith(".rsync-partial/"))
        complete = [name for name, size in listing if name.endswith(".safetensors") and "/" not in name]
        current_before = sh("readlink /srv/models/rel-big/current || true").strip()
        second = deployer.run(sync_vars, playbook=str(play), fast_gate=False)
        sent = rsync_sent_bytes(second)
        current_after = sh("readlink /srv/models/rel-big/current || true").strip()
    finally:
        sh("rm -rf /srv/models/rel-big /var/lib/model-sync/*rel-big*", check=False)
    record(
        "faults",
        id="rsync-killed",
        fault="rsync is killed mid-sync",
        how=f"a {total / 2**20:.0f} MiB model ({shards} shards) pushed at --bwlimit=12m; SIGKILL of the "
        "controller's rsync once 40 % had landed; then the same sync again",
        happened=f"the push failed; {kept / 2**20:.1f} MiB of {total / 2**20:.0f} MiB stayed in .incoming: "
        f"{len(complete)} complete shard(s) and {partial / 2**20:.1f} MiB of the in-flight one in "
        ".rsync-partial; `current` was not created",
        host_did=f"the rerun sent {sent / 2**20:.1f} MiB ({100 * sent / total:.0f} %) instead of "
        f"{total / 2**20:.0f} MiB, verified every file and switched `current`",
        recover_s=second.duration_s,
        rc=second.rc,
        kept_bytes=kept,
        sent_bytes=sent,
        total_bytes=total,
    )
    assert killed_at.get("pids"), "no rsync was killed"
    assert first.rc != 0 and current_before == ""
    assert second.rc == 0, second.tail()
    assert current_after.startswith("revisions/")
    assert 0 < sent < total, f"the rerun sent {sent} of {total} bytes"


def _is_our_rsync(pid: int, src: str) -> bool:
    """Whether a controller process is the rsync pushing ``src``."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmd) and os.path.basename(cmd[0].decode()) == "rsync" and any(src.encode() in c for c in cmd)


# What these rows prove, and what they cannot (issue 44, item 7): `docker restart --time 1` SIGKILLs every
# process of the container within a second (systemd stops nothing cleanly) and boots it again, but the host's
# page cache survives it, so a write that was never fsynced is still there after the "boot". The rows show
# the boot's side (no deploy lock left in /run, the unit on disk started by systemd, the rerun gates and
# records it); a write lost for want of an fsync is the record writers' write-order test's to catch.
UNCLEAN_STOP_LIMITS = (
    "every process SIGKILLed within 1 s and the container booted again; its page cache survives, so this "
    "row cannot show a write lost for want of an fsync (the record writers' write-order test does)"
)


def unclean_stop() -> float:
    """Stop the host container within a second (systemd gets no time to stop the server) and start it
    again, as a crash and a boot (not a power cut: the page cache survives); the monotonic time of the stop."""
    cut = time.monotonic()
    subprocess.run(["docker", "restart", "--time", "1", HOST], check=True, capture_output=True, timeout=120)
    return cut


def boots_serving(cut: float) -> float:
    """Seconds from the cut until the server answers /health again (started by systemd at boot)."""
    assert wait_for(
        lambda: dexec("systemctl", "is-system-running", check=False).strip() in ("running", "degraded"), 120
    )
    assert wait_for(healthy, 240), sh(f"journalctl -b -u {UNIT} --no-pager -n 60", check=False)
    return round(time.monotonic() - cut, 1)


def cut_run_outcome(run: Any) -> str:
    """What became of a deploy whose host stopped under it: each task is a new connection, so a
    host back within seconds lets the run go on (as with SSH), or the task in flight fails it."""
    if run.rc == 0:
        return "the run went on once the host was back and ended well (rc 0)"
    return f"the run failed (rc {run.rc}: {run.message[:160] or 'no message'})"


def test_the_host_stops_uncleanly_mid_deploy_and_after_a_deploy(deployer: Deployer) -> None:
    """An unclean stop and boot while a deploy restarts the server, and one after a deploy: the lock is gone at
    boot, the unit comes up by itself, and a rerun passes the gate with the last-known-good unit
    equal to the running one."""
    cut: dict[str, float] = {}

    def cut_at_restart(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, "Restart the server") and "at" not in cut:
            cut["at"] = 0.0
            in_background(lambda: cut.update(at=unclean_stop(), marked=handle.mark("unclean-stop")))

    mid = deployer.run(MARK_B, watch=cut_at_restart)
    assert wait_for(lambda: "marked" in cut, 120), "the host was never stopped"
    booted_mid = boots_serving(cut["at"])
    at_boot_mid = server_state()
    lock_after_mid = lock_held()
    # Either systemd started the unit the cut left on disk (the new one, not yet gated), or the cut
    # run's rescue reached the booted host and put the last-known-good unit back: both serve.
    booted_unit = (
        "the new unit"
        if "RELIABILITY_MARK=b" in environ_of(int(at_boot_mid["MainPID"]))
        else "the last-known-good unit"
    )
    rerun_mid = deployer.run(MARK_B)
    mid_recover = round(time.monotonic() - cut["at"], 1)
    unit_mid, lkg_mid = unit_sha_and_lkg()
    record(
        "faults",
        id="unclean-stop-mid-deploy",
        fault="the host stops without a clean shutdown while a deploy restarts the server",
        how="`docker restart --time 1` of the host container as the deploy's `Restart the server` task began "
        f"(a new Environment= line in the unit), then the same deploy again: {UNCLEAN_STOP_LIMITS}",
        happened=f"{cut_run_outcome(mid)}; at boot /run was empty (lock {'HELD' if lock_after_mid else 'gone'}) "
        f"and the server ran {booted_unit}, serving {booted_mid} s after the cut",
        host_did=f"the rerun (rc {rerun_mid.rc}) took the lock, deployed and gated the new unit and recorded it as "
        f"last-known-good: its unit's sha256 equals the running unit's ({'yes' if unit_mid == lkg_mid else 'NO'})",
        recover_s=mid_recover,
        rc=rerun_mid.rc,
    )

    cut_after = unclean_stop()
    booted_after = boots_serving(cut_after)
    at_boot_after = server_state()
    lock_after = lock_held()
    rerun_after = deployer.run(MARK_B)
    unit_after, lkg_after = unit_sha_and_lkg()
    record(
        "faults",
        id="unclean-stop-after-deploy",
        fault="the host stops without a clean shutdown after a deploy",
        how="`docker restart --time 1` of the host container once the deploy above had ended; then the same "
        f"deploy again (the nightly's view): {UNCLEAN_STOP_LIMITS}",
        happened=f"at boot the lock was {'HELD' if lock_after else 'gone'} and systemd started the gated unit: "
        f"serving {booted_after} s after the cut",
        host_did=f"the rerun (rc {rerun_after.rc}) kept the server booted "
        f"({'same' if main_pid() == int(at_boot_after['MainPID']) else 'ANOTHER'} process) and passed the gate; "
        f"changed tasks: {', '.join(rerun_after.changed_tasks()) or 'none'}; the last-known-good unit is the "
        f"running one ({'yes' if unit_after == lkg_after else 'NO'})",
        recover_s=booted_after,
        rc=rerun_after.rc,
    )

    assert not lock_after_mid and at_boot_mid["ActiveState"] == "active", at_boot_mid
    assert "RELIABILITY_MARK=b" in environ_of(main_pid()), "the rerun did not deploy the change"
    assert rerun_mid.rc == 0, rerun_mid.tail()
    assert unit_mid == lkg_mid, "the last-known-good unit is not the running one"
    assert not lock_after and at_boot_after["ActiveState"] == "active", at_boot_after
    assert rerun_after.rc == 0, rerun_after.tail()
    assert main_pid() == int(at_boot_after["MainPID"]), "the rerun restarted the server it found serving"
    assert unit_after == lkg_after == unit_mid
    assert healthy() and not lock_held()


# The controller killed at each phase of a deploy that changes the unit (its own new mark each),
# then the same deploy run again. (The unit write is test_controller_killed_mid_deploy_...'s and
# the model sync test_rsync_killed_mid_sync's.) The venv phase first takes the transformers
# package out of the running venv, so that the deploy's ml_env puts it back with pip. The
# rollback phase kills a deploy whose engine refuses to start while the rescue restarts the
# last-known-good server; its rerun is the previous phase's good deploy. (phase, task it is
# killed in, seconds after that task began, the killed run's variables, the rerun's variables)
MARK_VENV = {"inference_server_environment": {"RELIABILITY_MARK": "venv"}}
MARK_RESTART = {"inference_server_environment": {"RELIABILITY_MARK": "restart"}}
MARK_GATE = {"inference_server_environment": {"RELIABILITY_MARK": "gate"}}
MARK_RECORD = {"inference_server_environment": {"RELIABILITY_MARK": "record"}}
REFUSES_START = {**MARK_RECORD, "inference_server_overrides": {"--attn-implementation": "no_such_attention"}}
PHASES = [
    ("venv", "the venv build", "Install exactly the locked packages", 1.0, MARK_VENV, MARK_VENV),
    ("restart", "the drain and restart of the server", "Restart the server", 1.0, MARK_RESTART, MARK_RESTART),
    ("gate", "the gate", "Run the health gate on the host", 3.0, MARK_GATE, MARK_GATE),
    (
        "record",
        "the last-known-good record, as it is staged and put in place",
        "Record the last-known-good state, staged aside and put in place in one exchange of the directories",
        0.0,
        MARK_RECORD,
        MARK_RECORD,
    ),
    (
        "rollback",
        "a rollback's restart",
        "Restart the server on its last-known-good state",
        1.0,
        REFUSES_START,
        MARK_RECORD,
    ),
]

PHASE_SETUP = {
    "venv": " (the transformers package taken out of the running venv first)",
    "rollback": " (a deploy whose engine refuses to start, rolled back)",
}


@pytest.mark.parametrize(
    ("phase", "what", "task", "delay", "killed_vars", "rerun_vars"), PHASES, ids=[p[0] for p in PHASES]
)
def test_controller_killed_at_each_phase_then_run_again(
    deployer: Deployer,
    phase: str,
    what: str,
    task: str,
    delay: float,
    killed_vars: dict[str, Any],
    rerun_vars: dict[str, Any],
) -> None:
    """Kill the controller in one phase; the same (good) deploy again ends serving, gated, recorded."""
    killed_at: dict[str, float] = {}
    if phase == "venv":
        sh(f"rm -rf {VENV_SITE}/transformers {VENV_SITE}/transformers-*.dist-info")

    def kill_in_phase(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, task) and not killed_at:
            killed_at["started"] = handle.mark("phase")

            def later() -> None:
                time.sleep(delay)
                handle.kill()

            in_background(later)

    killed = deployer.run(killed_vars, watch=kill_in_phase)
    at_kill = server_state()
    rerun = deployer.run(rerun_vars)
    unit, lkg = unit_sha_and_lkg()
    pid = main_pid()
    mark = rerun_vars["inference_server_environment"]["RELIABILITY_MARK"]
    took_over = [w for w in rerun.warnings() if "Took over the deploy lock" in w]
    record(
        "faults",
        id=f"controller-killed-{phase}",
        fault=f"the controller is killed during {what}",
        how=f"SIGKILL to ansible-playbook and its workers {delay:g} s after the task `{task}` began"
        + PHASE_SETUP.get(phase, "")
        + "; then the good deploy again",
        happened=f"the run ended with rc {killed.rc}; the unit was {at_kill.get('ActiveState')}, the lock "
        f"{'held' if 'LOCK-HELD' in at_kill['files'] else 'gone'}",
        host_did=f"the rerun (rc {rerun.rc}) {'took over the dead run' + chr(39) + 's lock, ' if took_over else ''}"
        f"ended with the server running RELIABILITY_MARK={mark}, gated, with the last-known-good unit "
        f"equal to the running one ({'yes' if unit == lkg else 'NO'})",
        recover_s=rerun.duration_s,
        rc=rerun.rc,
    )
    assert killed.killed, f"the run ended before {task!r} ({killed.rc}):\n{killed.tail()}"
    assert rerun.rc == 0, rerun.tail()
    assert healthy() and not lock_held()
    assert f"RELIABILITY_MARK={mark}" in environ_of(pid)
    assert unit == lkg, "the last-known-good unit is not the running one"
    assert sh(f"test -e /var/lib/{UNIT}-deploy/last-known-good.staged && echo left || echo none").strip() == "none"
    if phase == "venv":
        assert sh(f"ls -d {VENV_SITE}/transformers-*.dist-info").strip(), "the rerun did not put transformers back"
