"""Faults between deploys: a hung server, a crash loop, and a disk that really fills.

The watchdog's service is started by hand (`systemctl start inference-server-watchdog.service`,
what its timer does every inference_server_watchdog_interval_s) with a short deadline from
/run/inference-server-watchdog.env; its timer is stopped meanwhile so that it cannot fire in
the middle of a case. The disk cases put a model root and a venv directory on small tmpfs
mounts inside the host and fill them while the sync or the venv build is under way.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    CACHE,
    UNIT,
    Deployer,
    RunHandle,
    healthy,
    record,
    rsync_sent_bytes,
    sh,
    task_started,
    unit_props,
    unit_sha_and_lkg,
    wait_for,
    write_shard,
)

WATCHDOG = f"{UNIT}-watchdog"
PROM_DIR = "/var/lib/node_exporter/textfile_collector"
ENV_FILE = f"/run/{WATCHDOG}.env"
CRASH_DROPIN = f"/run/systemd/system/{UNIT}.service.d/crash-loop.conf"


@pytest.fixture(autouse=True)
def watchdog_timer_stopped() -> Iterator[None]:
    """Stop the watchdog's timer for one case and start it again after."""
    sh(f"systemctl stop {WATCHDOG}.timer")
    yield
    sh(f"systemctl start {WATCHDOG}.timer")


def metric(name: str) -> float:
    """A value from the watchdog's textfile (``llm_watchdog.prom``), 0 when it is not there yet."""
    text = sh(f"cat {PROM_DIR}/llm_watchdog.prom 2>/dev/null || true")
    found = re.search(rf'^{name}{{unit="{UNIT}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def run_watchdog(**env: str) -> tuple[float, int, str]:
    """Run the watchdog's service once with ``env`` overrides: its seconds, exit status and journal."""
    sh(f"printf '%s\\n' {' '.join(f'{k}={v}' for k, v in env.items())} > {ENV_FILE}")
    started = time.monotonic()
    try:
        rc = int(sh(f"systemctl start {WATCHDOG}.service; echo $?", timeout=600).strip().splitlines()[-1])
    finally:
        sh(f"rm -f {ENV_FILE}")
    took = round(time.monotonic() - started, 1)
    invocation = sh(f"systemctl show -p InvocationID --value {WATCHDOG}.service").strip()
    journal = sh(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --no-pager -o cat", check=False)
    return took, rc, journal


def first_line(journal: str, needle: str) -> str:
    """The journal line that holds ``needle`` (for the page), or "" when none does."""
    return next((line for line in journal.splitlines() if needle in line), "")


def test_the_server_hangs_between_deploys_and_the_watchdog_restarts_it() -> None:
    """SIGSTOP of the engine: the watchdog's probe misses its deadline, it restarts through the drain."""
    before = unit_props("MainPID", "InvocationID")
    restarts = metric("llm_watchdog_restarts_total")
    sh(f"kill -STOP {before['MainPID']}")
    hung = time.monotonic()
    try:
        took, rc, journal = run_watchdog(LLM_WATCHDOG_DEADLINE_S="3", LLM_WATCHDOG_FAILURES="1")
    finally:
        sh(f"kill -CONT {before['MainPID']} 2>/dev/null || true")
    serving = wait_for(healthy, 120)
    recover_s = round(time.monotonic() - hung, 1)
    after = unit_props("MainPID", "InvocationID", "ActiveState")
    counted = metric("llm_watchdog_restarts_total") - restarts
    unit, lkg = unit_sha_and_lkg()
    record(
        "faults",
        id="hang-between-deploys",
        fault="the server hangs between deploys",
        how="SIGSTOP of the engine's main process; then the watchdog's service, as its timer starts it "
        "(deadline 3 s, one failed probe is enough here; 30 s and 2 by default)",
        happened=f"/health and the probe's generation did not answer: {first_line(journal, 'does not answer')}",
        host_did=f"the watchdog (rc {rc}) restarted the unit through the drain path (new main PID: "
        f"{'yes' if after['MainPID'] != before['MainPID'] else 'NO'}), the server answers /health, "
        f"llm_watchdog_restarts_total went up by {counted:g}; the unit is still the last-known-good one "
        f"({'yes' if unit == lkg else 'NO'})",
        recover_s=recover_s,
        rc=rc,
        watchdog_s=took,
    )
    assert rc == 0, journal
    assert "does not answer: restarting it" in journal, journal
    assert f"{UNIT}.service is active after the watchdog's restart" in journal, journal
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"], after
    assert after["InvocationID"] != before["InvocationID"]
    assert serving
    assert counted == 1
    assert unit == lkg, "the watchdog changed the unit"
    assert metric("llm_watchdog_probe_success") == 0


def test_the_server_crash_loops_until_systemd_gives_up_and_the_watchdog_brings_it_back() -> None:
    """A start that fails every time (a runtime drop-in): systemd gives up, OnFailure= records it,
    the watchdog waits its back-off, then starts the unit again once the cause is gone."""
    gave_up = metric("llm_server_gave_up_total")
    sh(
        f"mkdir -p {CRASH_DROPIN.rsplit('/', 1)[0]} && "
        f"printf '[Service]\\nExecStartPre=/bin/false\\nRestartSec=1\\n' > {CRASH_DROPIN} && systemctl daemon-reload"
    )
    started = time.monotonic()
    try:
        sh(f"systemctl reset-failed {UNIT}; systemctl restart --no-block {UNIT}")
        failed = wait_for(lambda: unit_props("ActiveState")["ActiveState"] == "failed", 300, 0.5)
        state = unit_props("ActiveState", "Result", "NRestarts")
        recorded = wait_for(lambda: metric("llm_server_gave_up_total") > gave_up, 60, 0.5)
        gave_up_s = round(time.monotonic() - started, 1)
        # Not yet due: the first retry waits inference_server_watchdog_retry_failed_s (120 s here).
        _, early_rc, early = run_watchdog()
        still_failed = unit_props("ActiveState")["ActiveState"]
    finally:
        sh(f"rm -f {CRASH_DROPIN} && systemctl daemon-reload")
    took, rc, journal = run_watchdog(LLM_WATCHDOG_RETRY_FAILED_S="0")
    serving = wait_for(healthy, 120)
    recover_s = round(time.monotonic() - started, 1)
    journal_gave_up = sh(f"journalctl -u {UNIT}-gave-up --no-pager -o cat", check=False)
    unit, lkg = unit_sha_and_lkg()
    record(
        "faults",
        id="crash-loop",
        fault="the server crash-loops until systemd gives up",
        how="a runtime drop-in whose ExecStartPre= fails (RestartSec=1), then a restart; the drop-in "
        "removed once systemd had given up; then the watchdog's service, with its back-off elapsed",
        happened=f"systemd restarted it {state.get('NRestarts')} times and gave up after {gave_up_s:g} s "
        f"({state.get('ActiveState')}, result {state.get('Result')}); OnFailure= recorded it "
        f"(llm_server_gave_up_total +1, journal: {first_line(journal_gave_up, 'systemd gave up')[:140]})",
        host_did=f"the watchdog first left it for its back-off ({first_line(early, 'retry in')[:120]}), "
        f"then (rc {rc}) started it again: {first_line(journal, 'is active after the retry')}; the unit is "
        f"the last-known-good one ({'yes' if unit == lkg else 'NO'})",
        recover_s=recover_s,
        rc=rc,
        watchdog_s=took,
    )
    assert failed, state
    assert state["Result"] in ("exit-code", "start-limit-hit"), state
    assert recorded and "systemd gave up" in journal_gave_up, journal_gave_up
    assert early_rc == 0 and re.search(r"gave up \d+ s ago .*; retry in \d+ s", early), early
    assert still_failed == "failed"
    assert rc == 0 and f"{UNIT}.service is active after the retry" in journal, journal
    assert serving and unit_props("ActiveState")["ActiveState"] == "active"
    assert unit == lkg, "the unit is not the last-known-good one"


# --------------------------------------------------------------------------------------
# A disk that really fills: a small tmpfs (molecule.yml) filled by another writer the moment
# the copy starts, after the free-space check passed.
# --------------------------------------------------------------------------------------

SMALL_DISK = "/srv/small-disk"


def free_mib(path: str = SMALL_DISK) -> float:
    """MiB free on the disk of ``path`` in the host."""
    return int(sh(f"df -B1 --output=avail {path} | tail -n 1").strip()) / 2**20


def fill_disk(leave_mib: int) -> None:
    """Another writer takes all of the small disk's free space but ``leave_mib``."""
    sh(
        f"fallocate -l $(( $(df -B1 --output=avail {SMALL_DISK} | tail -n 1) - {leave_mib} * 1048576 )) "
        f"{SMALL_DISK}/filler"
    )


def free_the_disk() -> None:
    """The operator frees the space the other writer took."""
    sh(f"rm -f {SMALL_DISK}/filler")


def role_play(workdir: Path, role: str) -> str:
    """A playbook (relative to the repository) that runs one role on the host."""
    play = workdir / f"only-{role}.yml"
    play.write_text(
        yaml.safe_dump([{"name": f"Run {role} only", "hosts": "rel-molecule", "gather_facts": False, "roles": [role]}])
    )
    return str(play)


def filled_when(task: str, leave_mib: int, seen: dict[str, Any]) -> Any:
    """A watch that fills the small disk (leaving ``leave_mib``) as ``task`` starts."""

    def watch(event: dict[str, Any], handle: RunHandle) -> None:
        if task_started(event, task) and "filled" not in seen:
            fill_disk(leave_mib)
            seen["filled"] = handle.mark("disk-filled")

    return watch


@pytest.fixture
def small_disk() -> Iterator[None]:
    """The small disk, empty before and after a case."""
    assert sh(f"findmnt -n -o FSTYPE {SMALL_DISK}").strip() == "tmpfs"
    sh(f"rm -rf {SMALL_DISK}/*")
    yield
    sh(f"rm -rf {SMALL_DISK}/* /var/lib/model-sync/*rel-full*", check=False)


def test_the_disk_fills_up_during_a_model_sync(deployer: Deployer, workdir: Path, small_disk: None) -> None:
    """The model root's disk fills while the model is pushed: one sentence, nothing switched, resumed."""
    src = workdir / "full-model"
    src.mkdir()
    shards, size = 4, 12 * 2**20
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        write_shard(src / name, size)
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": shards * size}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}})
    )
    (src / "config.json").write_text('{"model_type": "tiny", "architectures": ["Tiny"]}')
    total = sum(p.stat().st_size for p in src.iterdir())
    sync_vars = {
        "model_sync_root": SMALL_DISK,
        "model_sync_name": "rel-full",
        "model_sync_cli_path": "",
        "model_sync_disk_reserve_mib": 8,
        "model_sync_rsync_opts": ["--bwlimit=12m", "--stats"],
        "model_sync_source": {"type": "controller_dir", "path": str(src)},
    }
    play = role_play(workdir, "model_sync")
    dest = f"{SMALL_DISK}/rel-full"
    seen: dict[str, Any] = {}
    leave = 16
    first = deployer.run(
        sync_vars,
        playbook=play,
        watch=filled_when("Push the model from the controller into the incoming snapshot", leave, seen),
        fast_gate=False,
    )
    landed = int(sh(f"du -sb {dest}/.incoming 2>/dev/null | cut -f1").strip() or 0) / 2**20
    current_before = sh(f"readlink {dest}/current || true").strip()
    free_the_disk()
    second = deployer.run(sync_vars, playbook=play, fast_gate=False)
    current_after = sh(f"readlink {dest}/current || true").strip()
    sent = rsync_sent_bytes(second) if second.rc == 0 else total
    record(
        "faults",
        id="disk-full-sync",
        fault="the model's disk fills up during a sync",
        how=f"a {total / 2**20:.0f} MiB model pushed at --bwlimit=12m onto a 256 MiB tmpfs (model_sync_root); "
        f"the free-space check passed, then another writer took all but {leave} MiB as the push began; "
        "then that file removed and the same sync again",
        happened=f"rsync ran out of space with {landed:.1f} MiB in .incoming; the run failed with one sentence, "
        f"`current` was not created. Message: `{first.message}`",
        host_did=f"the rerun (rc {second.rc}) resumed from what had landed: it sent {sent / 2**20:.1f} MiB of "
        f"{total / 2**20:.0f}, verified every file and switched `current` to {current_after or 'NOTHING'}",
        recover_s=second.duration_s,
        rc=second.rc,
    )
    assert "filled" in seen, f"the push never started: {first.message or first.tail()}"
    assert first.rc != 0 and current_before == ""
    assert first.failed_task.endswith("Fail when the push did not complete"), first.failed_task
    assert re.fullmatch(
        rf"The disk of {dest} on rel-molecule filled up while the model was pushed \(rsync: No space left on "
        rf"device; [\d.]+ MiB free now\): free space there or set model_sync_root to a larger disk, and run again; "
        rf"what landed stays in {dest}/\.incoming, the next push resumes from it, and `current` was not switched\.",
        first.message,
    ), first.message
    assert 0 < landed < total / 2**20
    assert second.rc == 0, second.tail()
    assert current_after.startswith("revisions/")
    assert 0 < sent < total, f"the rerun sent {sent} of {total} bytes"


def test_the_disk_fills_up_during_a_venv_build(deployer: Deployer, workdir: Path, small_disk: None) -> None:
    """The venv's disk: too small is refused before pip starts; filled during pip, one sentence,
    nothing switched; the next run completes the venv where pip stopped."""
    wheels = CACHE / "wheelhouse" / "smg-1.13.0"
    wheels_mib = sum(p.stat().st_size for p in wheels.glob("*.whl")) / 2**20
    venv_vars = {
        "ml_env_path": f"{SMALL_DISK}/ml-env",
        "ml_env_lock": "smg-1.13.0",
        "ml_env_engine_package": "smg",
        "ml_env_wheelhouse": str(wheels),
        "ml_env_disk_reserve_mib": 8,
        "ml_env_import_timeout_s": 120,
    }
    play = role_play(workdir, "ml_env")
    # 1. Too small from the start: the check from the wheels' sizes refuses before pip starts.
    fill_disk(64)
    refused = deployer.run(venv_vars, playbook=play, fast_gate=False)
    pip_ran = sh(f"ls {SMALL_DISK}/ml-env.d/*/lib/python3*/site-packages 2>/dev/null | wc -l").strip()
    free_the_disk()
    # 2. Room enough at the check, then another writer fills the disk as pip starts.
    seen: dict[str, Any] = {}
    leave = 40
    filled = deployer.run(
        venv_vars, playbook=play, watch=filled_when("Install exactly the locked packages", leave, seen), fast_gate=False
    )
    link_after_fill = sh(f"readlink {SMALL_DISK}/ml-env || true").strip()
    partial_mib = int(sh(f"du -sb {SMALL_DISK}/ml-env.d 2>/dev/null | cut -f1").strip() or 0) / 2**20
    free_the_disk()
    # 3. Space freed: the same run completes the venv and points ml_env_path at it.
    resumed = deployer.run(venv_vars, playbook=play, fast_gate=False)
    link = sh(f"readlink {SMALL_DISK}/ml-env || true").strip()
    imported = sh(f"{SMALL_DISK}/ml-env/bin/python -c 'import smg; print(\"ok\")'", check=False).strip()
    record(
        "faults",
        id="disk-full-venv",
        fault="the venv's disk fills up during a venv build",
        how=f"the gateway's lock (smg-1.13.0, {wheels_mib:.0f} MiB of wheels) built onto a 256 MiB tmpfs "
        f"(ml_env_path): first with 64 MiB free, then with room at the check and all but {leave} MiB taken by "
        "another writer as pip began; then that file removed and the same build again",
        happened=f"with 64 MiB free the build was refused before pip started: `{refused.message}`; "
        f"filled during pip, the run failed with {partial_mib:.0f} MiB of the venv written and ml_env_path not "
        f"switched: `{filled.message}`",
        host_did=f"the rerun (rc {resumed.rc}) completed the venv where pip stopped, imported smg ({imported}) and "
        f"pointed ml_env_path at it ({link})",
        recover_s=resumed.duration_s,
        rc=resumed.rc,
    )
    assert refused.rc != 0 and refused.failed_task.endswith("Refuse a disk too small for the venv"), refused.tail()
    assert re.fullmatch(
        rf"ml_env_lock 'smg-1\.13\.0' needs \d+ MiB free on the disk of {SMALL_DISK}/ml-env\.d/[0-9a-f]{{12}} "
        rf"\({SMALL_DISK}\) on rel-molecule \(its wheels, [\d.]+ MiB in ml_env_wheelhouse, times "
        rf"ml_env_unpack_factor 4, plus ml_env_disk_reserve_mib 8\), but [\d.]+ MiB are free: free \d+ MiB there "
        r"or set ml_env_path to a larger disk\.",
        refused.message,
    ), refused.message
    assert pip_ran == "0", "pip ran although the check refused"
    assert "filled" in seen, f"pip never started: {filled.message or filled.tail()}"
    assert filled.rc != 0 and filled.failed_task.endswith("Refuse wheels that are not the files the lock pins")
    assert re.fullmatch(
        rf"The disk of {SMALL_DISK}/ml-env\.d/[0-9a-f]{{12}} on rel-molecule filled up while pip installed "
        rf"ml_env_lock 'smg-1\.13\.0' \(No space left on device\): free space there or set ml_env_path to a larger "
        rf"disk, and run again; {SMALL_DISK}/ml-env was not switched to this venv, and the next run completes it "
        r"where pip stopped\.",
        filled.message,
    ), filled.message
    assert link_after_fill == ""
    assert resumed.rc == 0, resumed.tail()
    assert link.startswith(f"{SMALL_DISK}/ml-env.d/") and imported == "ok"
