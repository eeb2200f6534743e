"""Time the stages of ``make test`` and print where the time went.

    tools/test-stages start                               # a new run (forgets the last one's stages)
    tools/test-stages run NAME -- COMMAND [ARG...]        # one stage, timed; exits with COMMAND's status
    tools/test-stages molecule [--lanes N] [--beside NAME=COMMAND] SCENARIO...
                                                          # molecule scenarios N at a time (other jobs beside)
    tools/test-stages report [--budget-s 2400] [--record FILE] [--label TEXT]

Each stage appends one JSON line to the run's file (``artifacts/make-test/stages.jsonl``, or
``$TEST_STAGES_FILE``): its name, start, end, seconds and exit status; a molecule scenario
also carries the seconds of each of its actions (create, prepare, converge, idempotence,
side_effect, verify, destroy, ...), read from the ``<scenario> ➜ <action>: Executing`` lines
that molecule prints when an action starts.

``molecule`` runs the scenarios in ``--lanes`` parallel lanes (the scenarios are independent:
each has its own containers, network and ephemeral directory). A scenario's output goes to
``artifacts/make-test/molecule-<scenario>.log``; with one lane it is also streamed to the
terminal. The console gets one line per action, and on failure the failing scenario's last
lines. The longest scenarios start first, by the durations of the last run recorded in
``bench/results/make_test_times.json`` (then the order given), so the lanes end together.

``--beside NAME=COMMAND`` runs another stage (``make test`` runs lint and pytest so) from the
start, beside the lanes and taking none of them, at the lowest CPU priority: the scenarios spend
part of their time waiting on servers and timers, and the job beside them fills that idle CPU
without taking it from them when they need it. The job and everything it starts run in a CPU
cgroup of the lowest weight (``test-stages-beside``: cgroup v1 ``cpu.shares`` 2, or v2
``cpu.weight`` 1) and at ``nice -n 19``. Nice alone does not hold: the kernel's autogroups give
each session (a server a test starts with setsid) a share of its own, whatever its nice value.
Where no cgroup can be made (not root, a read-only hierarchy), the job runs at nice 19 only
and the console says so. Its output goes to
``artifacts/make-test/NAME.log`` and its last lines to the console; its failure fails the run.

``start`` and ``report`` also note the machine (a ``machine`` record, no stage): its load average
and a **yardstick**, the seconds one core takes for a fixed small workload (:func:`yardstick`,
the best of three), so that runs on machines 1.5x apart can be compared: a run's stages divided
by its yardstick are in "yardsticks", comparable across machines as far as the work is CPU-bound.
Each stage also keeps the CPU seconds of its own process tree (``tree_cpu_s``, the table's "tree":
what the stage's command and every descendant it waited for used, read with ``wait4``: for a
scenario, molecule, ansible-playbook, the verifier's pytest and the docker clients; not the docker
daemon, nor what runs inside the containers). Each stage and the whole run also keep how **busy**
the machine was meanwhile (``/proc/stat``: the share of all cores' time not idle, machine-wide, so
stages that overlap in lanes share it) and the run its busy core-seconds: a run 95 % busy is bound
by its CPU work, and no order of lanes makes it shorter than its busy core-seconds over the cores;
one half idle waits on timers and servers.

``report`` prints the table (stages with the lane each ran in, then each scenario's actions) and ends with one line
that compares the run's wall time with the budget and names the three slowest stages; it is
a warning, never a failure (machines differ). ``--record FILE`` appends the run to FILE's
``runs`` list (``bench/results/make_test_times.json`` is committed from a fresh clone).

Runs on the controller's system python3 (stdlib only): the first stage builds the venv.
Exit status: ``run`` and ``molecule`` exit with the first failing command's status (0 when
all passed); ``report`` exits 0, or 2 when the run has no stages.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[2]
DEFAULT_STAGES_FILE = REPO / "artifacts" / "make-test" / "stages.jsonl"
DEFAULT_TIMES_FILE = REPO / "bench" / "results" / "make_test_times.json"
BUDGET_S = 2400.0
FAILED_TAIL_LINES = 150
# The last lines of a passed non-molecule job printed on the console (pytest's slowest tests and count).
JOB_SUMMARY_LINES = 14
# The CPU priority of a job beside the lanes (nice's lowest): it runs on the CPU they leave idle.
NICE_BESIDE = 19
# The cgroup a job beside the lanes runs in: (hierarchy, its weight file, the lowest weight).
BESIDE_CGROUP = "test-stages-beside"
BESIDE_CGROUP_HIERARCHIES = (
    (Path("/sys/fs/cgroup/cpu"), "cpu.shares", "2"),  # cgroup v1, the cpu controller's hierarchy
    (Path("/sys/fs/cgroup"), "cpu.weight", "1"),  # cgroup v2 (cpu enabled in the root's subtree_control)
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# molecule's section logger: "INFO     [fleet > converge] Executing" without a terminal,
# "INFO     fleet ➜ converge: Executing" on one (colours stripped).
_ACTION_START = re.compile(
    r"(?:\[(?P<scenario>[\w.-]+) > (?P<action>[\w-]+)\]|(?P<scenario2>[\w.-]+)\s+➜\s+(?P<action2>[\w-]+):)"
    r"\s+Executing\b"
)


def stages_file() -> Path:
    """Return the file that holds the current run's stages (one JSON object per line)."""
    return Path(os.environ.get("TEST_STAGES_FILE") or DEFAULT_STAGES_FILE)


def _now() -> float:
    return time.time()


def yardstick(rounds: int = 3) -> float:
    """The seconds one core takes for a fixed workload (integer arithmetic, then sha256 over 64 MiB,
    the interpreter's own work as pytest's and Ansible's is), the best of ``rounds``."""
    block = bytes(range(256)) * 4096
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        sum(i * i % 7 for i in range(6_000_000))
        digest = hashlib.sha256()
        for _ in range(64):
            digest.update(block)
        best = min(best, time.perf_counter() - started)
    return round(best, 3)


def cpu_seconds(stat_file: str = "/proc/stat") -> list[float]:
    """[busy, all] core-seconds of the whole machine since boot (``/proc/stat``'s first line; busy is all but
    idle and iowait); [0, 0] where there is no such file. Two readings give how busy the machine was between."""
    try:
        with open(stat_file, encoding="ascii") as handle:
            ticks = [int(value) for value in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return [0.0, 0.0]
    hertz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return [round((sum(ticks) - idle) / hertz, 1), round(sum(ticks) / hertz, 1)]


def busy_between(before: Sequence[float], after: Sequence[float]) -> float | None:
    """The machine's busy share between two :func:`cpu_seconds` readings (0-1; None without readings)."""
    spent = after[1] - before[1]
    return round((after[0] - before[0]) / spent, 3) if spent > 0 else None


# Where a container's CPU time is counted: cgroup v1 (cpuacct.usage, nanoseconds; docker's cgroupfs driver)
# and v2 (cpu.stat's usage_usec; the cgroupfs and systemd drivers).
CONTAINER_CPU_FILES = (
    "/sys/fs/cgroup/cpuacct/docker/*/cpuacct.usage",
    "/sys/fs/cgroup/cpu,cpuacct/docker/*/cpuacct.usage",
    "/sys/fs/cgroup/docker/*/cpu.stat",
    "/sys/fs/cgroup/system.slice/docker-*.scope/cpu.stat",
)


def container_cpu_seconds(patterns: Sequence[str] = CONTAINER_CPU_FILES) -> dict[str, float]:
    """CPU seconds each running container has used so far, by its cgroup folder (empty without any)."""
    found: dict[str, float] = {}
    for path in (Path(name) for pattern in patterns for name in glob.glob(pattern)):
        try:
            text = path.read_text(encoding="ascii")
        except OSError:
            continue
        if path.name == "cpuacct.usage":
            found[str(path.parent)] = int(text.strip() or 0) / 1e9
        else:
            usage = re.search(r"^usage_usec (\d+)", text, re.MULTILINE)
            found[str(path.parent)] = int(usage.group(1)) / 1e6 if usage else 0.0
    return found


class ContainerMeter:
    """Samples the containers' CPU counters every ``interval`` s while the lanes run; a container's last
    sample before it is removed is (within one interval) all it used. ``total`` sums them."""

    def __init__(self, interval: float = 5.0, patterns: Sequence[str] = CONTAINER_CPU_FILES) -> None:
        """Not started yet (:meth:`start`)."""
        self.interval, self.patterns = interval, patterns
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="container-meter", daemon=True)

    def _sample(self) -> None:
        for folder, seconds in container_cpu_seconds(self.patterns).items():
            self.seen[folder] = max(seconds, self.seen.get(folder, 0.0))

    def _loop(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def start(self) -> ContainerMeter:
        """Begin sampling (the containers that exist already count from zero: only what they use from now)."""
        self.base = container_cpu_seconds(self.patterns)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop, and return ``{"containers", "cpu_s"}``: how many containers ran and the core-seconds they used."""
        self._stop.set()
        self._thread.join()
        self._sample()
        used = {k: v - self.base.get(k, 0.0) for k, v in self.seen.items()}
        return {"containers": len(used), "cpu_s": round(sum(used.values()), 1)}


def wait_with_cpu(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for ``proc``; its exit status and the CPU seconds of its whole process tree (every descendant
    that was waited for: ansible-playbook, its workers, pytest, the docker clients; not the docker daemon,
    nor what runs inside a container)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # interrupted: the command does not outlive the run (as subprocess.call)
        proc.kill()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, round(usage.ru_utime + usage.ru_stime, 1)


def note_machine(when: str) -> dict[str, Any]:
    """Record the machine's load average, yardstick and CPU counters now (``when``: start or end) in the run's file."""
    record_ = {"kind": "machine", "name": f"machine at {when}", "when": when, "at": _now(),
               "load_avg": [round(x, 2) for x in os.getloadavg()], "cpu": cpu_seconds(),
               "yardstick_s": yardstick()}  # fmt: skip
    _append(record_)
    return record_


def _append(record: dict[str, Any]) -> None:
    path = stages_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def read_records(path: Path | None = None) -> list[dict[str, Any]]:
    """Return what the run's file holds so far: its stages, in the order they ended, and its machine notes."""
    path = path or stages_file()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_stages(path: Path | None = None) -> list[dict[str, Any]]:
    """Return the stages recorded so far, in the order they ended."""
    return [r for r in read_records(path) if r.get("kind") not in ("machine", "containers")]


def read_containers(path: Path | None = None) -> dict[str, Any] | None:
    """The CPU of the lanes (:class:`ContainerMeter`), summed over the run's ``molecule`` commands; None without."""
    found = [r for r in read_records(path) if r.get("kind") == "containers"]
    if not found:
        return None
    return {key: round(sum(r[key] for r in found), 1) for key in ("busy_cpu_s", "cpu_s", "containers")}


def read_machine(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The machine's notes of the run (:func:`note_machine`), by when (start, end): the last of each."""
    return {r["when"]: r for r in read_records(path) if r.get("kind") == "machine"}


@dataclass
class ActionClock:
    """Turn a molecule scenario's output lines into the seconds each action took."""

    actions: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, line: str, at: float) -> str | None:
        """Note the line seen at ``at``; return the action's name when one starts here."""
        match = _ACTION_START.search(_ANSI.sub("", line))
        if not match:
            return None
        action = match.group("action") or match.group("action2")
        if self.actions and self.actions[-1]["action"] == action and "seconds" not in self.actions[-1]:
            return None  # verify says Executing twice (the command, then its verifier)
        self.close(at)
        self.actions.append({"action": action, "start": at})
        return action

    def close(self, at: float) -> None:
        """End the action that is running (if any) at ``at``."""
        if self.actions and "seconds" not in self.actions[-1]:
            self.actions[-1]["seconds"] = round(at - self.actions[-1]["start"], 1)

    def summary(self) -> list[dict[str, Any]]:
        """Return ``[{action, seconds}]``; an action that appears twice (destroy) keeps both."""
        return [{"action": a["action"], "seconds": a.get("seconds", 0.0)} for a in self.actions]


def beside_cgroup(hierarchies: Sequence[tuple[Path, str, str]] = BESIDE_CGROUP_HIERARCHIES) -> Path | None:
    """The ``cgroup.procs`` of a CPU cgroup at the lowest weight for jobs beside the lanes (made
    if need be), or None where none can be made."""
    for root, weight_file, lowest in hierarchies:
        group = root / BESIDE_CGROUP
        try:
            group.mkdir(exist_ok=True)
            (group / weight_file).write_text(lowest, encoding="ascii")
        except OSError:
            continue
        return group / "cgroup.procs"
    return None


def run_stage(name: str, command: Sequence[str]) -> int:
    """Run one stage, streaming its output, and record it; return its exit status."""
    print(f"==> [{time.strftime('%H:%M:%S')}] stage {name}: {' '.join(command)}", flush=True)
    start, cpu, tree_cpu = _now(), cpu_seconds(), None
    try:
        rc, tree_cpu = wait_with_cpu(subprocess.Popen(list(command)))
    except OSError as exc:
        print(f"test-stages: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        rc = 127
    end = _now()
    _append({"kind": "stage", "name": name, "start": start, "end": end, "seconds": round(end - start, 1), "rc": rc,
             "busy": busy_between(cpu, cpu_seconds()), "tree_cpu_s": tree_cpu})  # fmt: skip
    print(
        f"==> [{time.strftime('%H:%M:%S')}] stage {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
        f"in {end - start:.0f} s",
        flush=True,
    )
    return rc


def beside_job(spec: str) -> tuple[str, list[str]]:
    """``--beside``'s ``NAME=COMMAND``: (NAME, COMMAND split as a shell would); argparse refuses anything else."""
    name, sep, command = spec.partition("=")
    try:
        argv = shlex.split(command)
    except ValueError as exc:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{spec!r}: {exc}") from None
    if not sep or not name.strip() or not argv:
        raise argparse.ArgumentTypeError(f"{spec!r}: write it as NAME=COMMAND, e.g. 'pytest=make pytest'")
    return name.strip(), argv


@dataclass
class LaneJob:
    """One job of a lane (a molecule scenario, or a stage such as pytest): its process, log and clock."""

    name: str
    command: list[str]
    log_path: Path
    stream: bool
    scenario: bool = True
    # The job's CPU priority (nice): 0 for the lanes, NICE_BESIDE for a job beside them.
    nice: int = 0
    # The cgroup.procs file the job moves itself into before it runs (a job beside the lanes).
    cgroup_procs: Path | None = None
    clock: ActionClock = field(default_factory=ActionClock)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=FAILED_TAIL_LINES))
    start: float = 0.0
    end: float = 0.0
    rc: int | None = None
    tree_cpu: float | None = None
    lane: str = ""

    @classmethod
    def molecule(cls, scenario: str, log_dir: Path, stream: bool) -> LaneJob:
        """``molecule test -s SCENARIO``, recorded as stage ``molecule SCENARIO`` with its actions."""
        return cls(
            f"molecule {scenario}", ["molecule", "test", "-s", scenario], log_dir / f"molecule-{scenario}.log", stream
        )

    @classmethod
    def beside(cls, name: str, command: list[str], log_dir: Path) -> LaneJob:
        """A plain stage beside the lanes, niced (``--beside NAME=COMMAND``, read by :func:`beside_job`)."""
        return cls(name, command, log_dir / f"{name}.log", False, scenario=False, nice=NICE_BESIDE)

    def argv(self) -> list[str]:
        """The command, niced and in its cgroup where the job has them (the shell moves itself in
        before it execs, so every process the job starts is in it)."""
        argv = ["nice", "-n", str(self.nice), *self.command] if self.nice else list(self.command)
        if self.cgroup_procs:
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroup_procs), *argv]
        return argv

    def run(self, lock: threading.Lock) -> None:
        """Run the command; keep its output, note each molecule action as it starts."""
        self.start, cpu = _now(), cpu_seconds()
        env = dict(os.environ, PY_COLORS="0", NO_COLOR="1", ANSIBLE_FORCE_COLOR="0")
        with self.log_path.open("w", encoding="utf-8", buffering=1) as log:
            try:
                proc = subprocess.Popen(
                    self.argv(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    text=True,
                    errors="replace",
                    bufsize=1,
                )
            except OSError as exc:
                message = f"test-stages: cannot run {self.command[0]}: {exc}\n"
                log.write(message)
                self.tail.append(message)
                self.rc = 127
            else:
                assert proc.stdout is not None
                for line in proc.stdout:
                    at = _now()
                    log.write(line)
                    self.tail.append(line)
                    action = self.clock.feed(line, at) if self.scenario else None
                    with lock:
                        if self.stream:
                            sys.stdout.write(line)
                        if action:
                            print(
                                f"==> [{time.strftime('%H:%M:%S')}] {self.name.removeprefix('molecule ')} ➜ {action}",
                                flush=True,
                            )
                self.rc, self.tree_cpu = wait_with_cpu(proc)
        self.end = _now()
        self.clock.close(self.end)
        record_ = {
            "kind": "scenario" if self.scenario else "stage",
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "seconds": round(self.end - self.start, 1),
            "rc": self.rc,
            "busy": busy_between(cpu, cpu_seconds()),
            "tree_cpu_s": self.tree_cpu,
        }
        if self.lane:
            record_["lane"] = self.lane
        if self.scenario:
            record_["actions"] = self.clock.summary()
        _append(record_)
        with lock:
            verdict = "ok" if self.rc == 0 else f"FAILED (exit {self.rc}), log {self.log_path}"
            print(
                f"==> [{time.strftime('%H:%M:%S')}] {self.name}: {verdict} in {self.end - self.start:.0f} s", flush=True
            )
            if self.rc != 0 and not self.stream:
                print(f"---- last {len(self.tail)} lines of {self.log_path} ----")
                sys.stdout.write("".join(self.tail))
                print(f"---- end of {self.name} ----", flush=True)
            elif not self.scenario and not self.stream:
                # A stage's own last words (pytest's slowest tests and its count) on the console.
                print("".join(list(self.tail)[-JOB_SUMMARY_LINES:]), end="", flush=True)


def last_durations(times_file: Path = DEFAULT_TIMES_FILE) -> dict[str, float]:
    """Return each stage's seconds in the last recorded run (empty when none is recorded)."""
    try:
        runs = json.loads(times_file.read_text(encoding="utf-8")).get("runs", [])
    except (OSError, ValueError):
        return {}
    if not runs:
        return {}
    return {stage["name"]: float(stage["seconds"]) for stage in runs[-1].get("stages", [])}


def schedule(jobs: Sequence[str], known: dict[str, float]) -> list[str]:
    """Order the jobs (stage names) longest first by ``known`` seconds; unknown ones keep their order, first."""
    unknown = [j for j in jobs if j not in known]
    timed = sorted((j for j in jobs if j in known), key=lambda j: -known[j])
    return unknown + timed


def run_lanes(scenarios: Sequence[str], lanes: int, beside_jobs: Sequence[tuple[str, list[str]]] = ()) -> int:
    """Run the scenarios ``lanes`` at a time and the (name, command) jobs beside them; return the
    first failure's status."""
    log_dir = stages_file().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    beside = [LaneJob.beside(name, command, log_dir) for name, command in beside_jobs]
    cgroup_procs = beside_cgroup() if beside else None
    for job in beside:
        job.cgroup_procs = cgroup_procs
    lanes = max(1, min(lanes, len(scenarios)))
    stream = lanes == 1 and not beside
    jobs = {job.name: job for job in (LaneJob.molecule(s, log_dir, stream) for s in scenarios)}
    order = schedule(list(jobs), last_durations())
    print(
        f"==> [{time.strftime('%H:%M:%S')}] {len(order)} scenarios in {lanes} lane(s), in this order: "
        f"{', '.join(order) or 'none'}"
        + (
            f"; beside them at nice {NICE_BESIDE}, "
            + (
                f"in the cgroup {cgroup_procs.parent}"
                if cgroup_procs
                else "in no cgroup of their own (none could be made)"
            )
            + f": {', '.join(job.name for job in beside)}"
            if beside
            else ""
        ),
        flush=True,
    )
    queue = deque(jobs[name] for name in order)
    done: list[LaneJob] = []
    lock = threading.Lock()

    def run_beside(job: LaneJob) -> None:
        job.lane = "beside"
        job.run(lock)
        with lock:
            done.append(job)

    def lane(number: int) -> None:
        while True:
            with lock:
                if not queue:
                    return
                job = queue.popleft()
            job.lane = f"lane {number}"
            job.run(lock)
            with lock:
                done.append(job)

    threads = [threading.Thread(target=run_beside, args=(job,), name=job.name) for job in beside]
    threads += [
        threading.Thread(target=lane, args=(i + 1,), name=f"lane-{i + 1}") for i in range(lanes if order else 0)
    ]
    meter, cpu = ContainerMeter().start(), cpu_seconds()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _append({"kind": "containers", "name": "the lanes' containers", "busy_cpu_s": round(cpu_seconds()[0] - cpu[0], 1),
             **meter.stop()})  # fmt: skip
    failed = [j for j in done if j.rc != 0]
    for job in failed:
        print(f"==> {job.name} FAILED (exit {job.rc}); its log: {job.log_path}")
    if len(done) != len(order) + len(beside):  # a thread died before its job ended: never a pass
        print(f"==> {len(order) + len(beside) - len(done)} job(s) did not run to the end", flush=True)
        return 1
    if failed:
        return failed[0].rc or 1
    return 0


def _fmt(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def build_run(
    stages: list[dict[str, Any]],
    label: str,
    machine: dict[str, dict[str, Any]] | None = None,
    containers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the run as recorded in make_test_times.json: wall time, each stage (its lane and its
    start in the run), the machine (load average and yardstick at the start and at the end)."""
    machine = machine or {}
    start = min(s["start"] for s in stages)
    end = max(s["end"] for s in stages)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "label": label,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "commit": commit or None,
        "cpus": os.cpu_count(),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "load_avg": {when: m["load_avg"] for when, m in machine.items()},
        "yardstick_s": {when: m["yardstick_s"] for when, m in machine.items()},
        # Busy core-seconds of the whole machine from start to end, and their share of cores x wall.
        **_cpu_of_run(machine),
        # While the lanes ran: the machine's busy core-seconds and those of the scenarios' containers.
        **({"lanes_cpu": containers} if containers else {}),
        "total_s": round(end - start, 1),
        "passed": all(s["rc"] == 0 for s in stages),
        "stages": [
            {**{k: s[k] for k in ("name", "seconds", "rc", "lane", "busy", "tree_cpu_s", "actions") if k in s},
             "start_s": round(s["start"] - start, 1)}
            for s in stages
        ],
    }  # fmt: skip


def _cpu_of_run(machine: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``cpu_busy_s`` and ``busy`` of the run, from the CPU counters of its start and end (none without both)."""
    if not all(machine.get(when, {}).get("cpu", [0, 0])[1] > 0 for when in ("start", "end")):
        return {}
    before, after = machine["start"]["cpu"], machine["end"]["cpu"]
    return {"cpu_busy_s": round(after[0] - before[0], 1), "busy": busy_between(before, after)}


def render(run: dict[str, Any], budget_s: float) -> str:
    """Return the timing table and the budget line."""
    lines = [
        "",
        f"make test: where the time went ({run['date']}, {run['cpus']} CPUs, commit {run['commit']})",
        f"{'stage':<34} {'time':>7} {'s':>7} {'from':>7}  {'lane':<8} {'busy':>5} {'tree':>6}  result",
    ]
    for stage in run["stages"]:
        result = "ok" if stage["rc"] == 0 else f"FAILED ({stage['rc']})"
        busy = f"{100 * stage['busy']:.0f} %" if stage.get("busy") is not None else ""
        tree = f"{stage['tree_cpu_s']:.0f}" if stage.get("tree_cpu_s") is not None else ""
        lines.append(
            f"{stage['name']:<34} {_fmt(stage['seconds']):>7} {stage['seconds']:>7.0f} "
            f"{_fmt(stage.get('start_s', 0.0)):>7}  {stage.get('lane', ''):<8} {busy:>5} {tree:>6}  {result}"
        )
        for action in stage.get("actions", []):
            lines.append(f"  {action['action']:<32} {_fmt(action['seconds']):>7} {action['seconds']:>7.0f}")
    stage_sum = sum(s["seconds"] for s in run["stages"])
    lines.append(f"{'sum of stages':<34} {_fmt(stage_sum):>7} {stage_sum:>7.0f}  (more than wall when lanes overlap)")
    lines.append(f"{'wall':<34} {_fmt(run['total_s']):>7} {run['total_s']:>7.0f}")
    for when in ("start", "end"):
        if when in run.get("yardstick_s", {}):
            load = "/".join(f"{x:g}" for x in run["load_avg"][when])
            lines.append(f"machine at the {when}: load {load} (1, 5, 15 min), yardstick {run['yardstick_s'][when]} s")
    if run.get("cpu_busy_s") is not None:
        lines.append(
            f"CPU: {run['cpu_busy_s']:.0f} core-seconds busy, {100 * run['busy']:.0f} % of {run['cpus']} cores x wall; "
            f"the same work takes at least {run['cpu_busy_s'] / run['cpus']:.0f} s on {run['cpus']} such cores"
        )
    lanes = run.get("lanes_cpu")
    if lanes and lanes["busy_cpu_s"] > 0:
        lines.append(
            f"lanes: {lanes['busy_cpu_s']:.0f} core-seconds busy, {lanes['cpu_s']:.0f} of them "
            f"({100 * lanes['cpu_s'] / lanes['busy_cpu_s']:.0f} %) inside the {lanes['containers']:.0f} containers "
            "(servers, modules), the rest on the controller (ansible, molecule, pytest, docker)"
        )
    slowest = sorted(run["stages"], key=lambda s: -s["seconds"])[:3]
    named = ", ".join(f"{s['name']} {s['seconds']:.0f} s" for s in slowest)
    share = 100.0 * run["total_s"] / budget_s
    if run["total_s"] <= budget_s:
        lines.append(f"budget: {run['total_s']:.0f} s of {budget_s:.0f} s ({share:.0f} %); slowest: {named}")
    else:
        lines.append(
            f"WARNING budget: {run['total_s']:.0f} s is over the {budget_s:.0f} s budget ({share:.0f} %); "
            f"slowest: {named}"
        )
    return "\n".join(lines)


def record(run: dict[str, Any], path: Path) -> None:
    """Append the run to ``path``'s ``runs`` list (the file is created when missing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data.setdefault("command", "make test (stages timed by tools/test-stages)")
    data["budget_s"] = BUDGET_S
    data.setdefault("runs", []).append(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _report(args: argparse.Namespace, out: TextIO) -> int:
    stages = read_stages()
    machine = read_machine()
    if stages and "end" not in machine:  # once, when the run has ended: a later report keeps that note
        machine["end"] = note_machine("end")
    if not stages:
        print(f"test-stages: no stages recorded in {stages_file()}", file=sys.stderr)
        return 2
    run = build_run(stages, args.label, machine, read_containers())
    print(render(run, args.budget_s), file=out, flush=True)
    if args.record:
        record(run, Path(args.record))
        print(f"recorded in {args.record}", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="test-stages", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="begin a new run")
    run = sub.add_parser("run", help="run and time one stage")
    run.add_argument("name")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    mol = sub.add_parser("molecule", help="run molecule scenarios (and other jobs) in lanes, each action timed")
    mol.add_argument("--lanes", type=int, default=1)
    mol.add_argument(
        "--beside",
        action="append",
        type=beside_job,
        default=[],
        metavar="NAME=COMMAND",
        help=f"another stage, run beside the lanes at nice {NICE_BESIDE} (e.g. 'pytest=make pytest'); repeatable",
    )
    mol.add_argument("scenarios", nargs="*")
    rep = sub.add_parser("report", help="print the table and the budget line")
    rep.add_argument("--budget-s", type=float, default=BUDGET_S)
    rep.add_argument("--record", help="append the run to this JSON file's runs")
    rep.add_argument("--label", default="make test")
    args = parser.parse_args(argv)

    if args.command == "start":
        stages_file().parent.mkdir(parents=True, exist_ok=True)
        stages_file().write_text("", encoding="utf-8")
        note_machine("start")
        return 0
    if args.command == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            parser.error("run needs a command after --")
        return run_stage(args.name, cmd)
    if args.command == "molecule":
        if not args.scenarios and not args.beside:
            parser.error("molecule needs a scenario or a --beside job")
        return run_lanes(args.scenarios, args.lanes, args.beside)
    return _report(args, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
