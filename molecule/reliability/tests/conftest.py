"""Harness of the reliability scenario: run deploy.yml against the container, watch it, judge it.

Every case runs the real ``ansible-playbook deploy.yml`` (the repository's ansible.cfg, the
``ansible.posix.jsonl`` stdout callback so events can be read while the run goes on) against
the molecule container, through an inventory of this session that names it three times:
``rel-molecule`` (rehearsal group), ``rel-gpu`` (sglang_servers group, for the launch plan's
GPU rules) and ``rel-noprofile`` (no group). The state of the running server (MainPID, its
start time, the unit file, the venv and model links) is read before and after each case.

Each test records a row with :func:`record`; at the end of the session the rows are written
to ``$RELIABILITY_RESULTS`` (default ``<repo>/artifacts/reliability/results.json``), which
``tools/reliability-report`` renders as docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from result_rows import check_rows, write_results

# molecule/shared/verify_plugin.py: the hooks and fixtures every scenario's verifier shares
# (each phase's report on the item as rep_setup, rep_call, which journal_on_failure reads).
pytest_plugins = ["verify_plugin"]

REPO = Path(__file__).resolve().parents[3]
HOST = os.environ.get("RELIABILITY_HOST", "rel-molecule")
UNIT = "inference-server"
PORT = 8000
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("DEPLOY_CACHE_DIR") or REPO / ".cache")
RESULTS = Path(os.environ.get("RELIABILITY_RESULTS") or REPO / "artifacts" / "reliability" / "results.json")
# Small gate settings for the many deploys of the scenario (the thresholds stay those of the
# rehearsal profile); a failing case never reaches the gate.
FAST_GATE = {
    "health_gate_warmup_requests": 1,
    "health_gate_requests": 2,
    "health_gate_max_tokens": 32,
    "health_gate_request_timeout_s": 20,
    "health_gate_health_timeout_s": 5,
    "health_gate_ready_timeout_s": 120,
}
# Known fake secrets: set 0 is vaulted in the inventory from the start (the first changing
# deploy renders it); set 1 is rotated in by the deploy that crashes, and rolled back. Every
# output and file is searched for both.
# The name of the sample secret in inference_server_secrets.
ENGINE_SECRET = "ENGINE_LICENSE_KEY"
SECRETS = [
    {
        "hf_token": f"hf_RelFakeToken{i}x7Qz9wLk2Pq4",
        "api_key": f"sk-rel-fake-key-{i}-9f3b7c1d5e",
        "engine_secret": f"rel-fake-engine-secret-{i}-4c8e2a6b",
    }
    for i in range(2)
]
ROWS: list[dict[str, Any]] = []
STARTED = time.time()


# --------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------


def dexec(*argv: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
    """Run a command in the container; its stdout."""
    proc = subprocess.run(
        ["docker", "exec", "-i", HOST, *argv], capture_output=True, text=True, timeout=timeout, input=stdin
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"docker exec {' '.join(argv)} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
    return proc.stdout


def sh(script: str, check: bool = True, timeout: float = 120) -> str:
    """Run a shell script in the container."""
    return dexec("sh", "-c", script, check=check, timeout=timeout)


def put(path: str, content: str, mode: str = "0644") -> None:
    """Write a file in the container."""
    dexec("sh", "-c", f'mkdir -p "$(dirname {path})" && cat > {path} && chmod {mode} {path}', stdin=content)


def unit_props(*names: str) -> dict[str, str]:
    """systemctl show of the server's unit."""
    out = dexec("systemctl", "show", UNIT, *[f"-p{n}" for n in names])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def server_state() -> dict[str, Any]:
    """What 'the host still serves, untouched' means here: the same process, unit, venv and model."""
    props = unit_props("MainPID", "ExecMainStartTimestamp", "ActiveState", "NRestarts")
    files = sh(
        f"sha256sum /etc/systemd/system/{UNIT}.service /etc/{UNIT}/secrets.env | cut -c1-16; "
        "readlink /opt/ml-env; readlink /srv/models/tiny-qwen3.5/current; "
        "test -e /run/llm-deploy/deploy.lock && echo LOCK-HELD || echo no-lock",
        check=False,
    ).split()
    return {**props, "files": files}


def write_shard(path: Path, nbytes: int) -> None:
    """A safetensors file with one U8 tensor of ``nbytes`` random bytes."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as handle:
        handle.write(len(header).to_bytes(8, "little") + header)
        handle.write(os.urandom(nbytes))


def unit_sha_and_lkg() -> tuple[str, str]:
    """sha256 of the unit on disk and of the last-known-good record's copy."""
    out = sh(
        f"sha256sum /etc/systemd/system/{UNIT}.service /var/lib/{UNIT}-deploy/last-known-good/unit.service | cut -c1-64"
    ).split()
    return out[0], out[1]


def rsync_sent_bytes(run: Any) -> int:
    """'Literal data' of rsync --stats in the push task's result (bytes really sent)."""
    for event in run.events:
        if event.get("_event") == "v2_runner_on_ok" and event["task"]["name"].endswith(
            "Push the model from the controller into the incoming snapshot"
        ):
            for result in event["hosts"].values():
                text = str(result.get("msg", "")) + "\n".join(result.get("stdout_lines") or [])
                found = re.search(r"Literal data: ([\d,]+) bytes", text)
                if found:
                    return int(found.group(1).replace(",", ""))
    raise AssertionError("no rsync --stats in the push's result")


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll until ``predicate()`` or the timeout; whether it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def healthy() -> bool:
    """/health of the server answers 200 (asked from inside the container)."""
    out = dexec(
        "python3",
        "-c",
        "import urllib.request,sys\ntry:\n print(urllib.request.urlopen("
        f"'http://127.0.0.1:{PORT}/health', timeout=3).status)\nexcept Exception as e:\n print(e)",
        check=False,
        timeout=30,
    )
    return out.strip() == "200"


# --------------------------------------------------------------------------------------
# Running deploy.yml
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    """One ansible-playbook run: exit status, events, the final failure, timings."""

    rc: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str
    duration_s: float
    killed: bool = False
    marks: dict[str, float] = field(default_factory=dict)

    def failures(self) -> list[dict[str, Any]]:
        """(task name, result) of every failed, non-ignored task result, in order."""
        out = []
        for event in self.events:
            if event.get("_event") != "v2_runner_on_failed":
                continue
            for result in (event.get("hosts") or {}).values():
                if not result.get("ignore_errors"):
                    out.append({"task": event["task"]["name"], "msg": str(result.get("msg", ""))})
        return out

    @property
    def message(self) -> str:
        """The message that stopped the host (the last failure), whitespace-normalised."""
        failures = self.failures()
        return " ".join(failures[-1]["msg"].split()) if failures else ""

    @property
    def failed_task(self) -> str:
        """Name of the task whose failure stopped the host."""
        failures = self.failures()
        return failures[-1]["task"] if failures else ""

    def stats(self) -> dict[str, Any]:
        """The recap of the first host."""
        for event in self.events:
            if event.get("_event") == "v2_playbook_on_stats":
                return next(iter(event["stats"].values()), {})
        return {}

    def changed_tasks(self) -> list[str]:
        """Names of the tasks that reported a change."""
        return [
            e["task"]["name"]
            for e in self.events
            if e.get("_event") == "v2_runner_on_ok"
            and any(isinstance(r, dict) and r.get("changed") for r in (e.get("hosts") or {}).values())
        ]

    def messages(self, task: str) -> list[str]:
        """The ``msg`` of every successful result of the task named ``task`` (suffix match), whitespace-normalised."""
        return [
            " ".join(str(r.get("msg", "")).split())
            for e in self.events
            if e.get("_event") == "v2_runner_on_ok" and e["task"]["name"].endswith(task)
            for r in (e.get("hosts") or {}).values()
            if isinstance(r, dict)
        ]

    def warnings(self) -> list[str]:
        """Warnings returned by modules."""
        found = []
        for event in self.events:
            for result in (event.get("hosts") or {}).values():
                if isinstance(result, dict):
                    found.extend(result.get("warnings") or [])
        return found

    def tail(self, n: int = 4000) -> str:
        """The end of the raw output, for assertion messages."""
        return (self.stdout + self.stderr)[-n:]


class Deployer:
    """Runs deploy.yml (or another playbook) against the container with extra variables."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.inventory = workdir / "inventory" / "hosts.yml"
        self.inventory.parent.mkdir(parents=True, exist_ok=True)
        docker = {"ansible_connection": "community.docker.docker", "ansible_host": HOST}
        self.inventory.write_text(
            yaml.safe_dump(
                {
                    "all": {
                        "hosts": {"rel-noprofile": docker},
                        "children": {
                            "rehearsal": {"hosts": {"rel-molecule": docker}},
                            "sglang_servers": {"hosts": {"rel-gpu": docker}},
                        },
                    }
                }
            )
        )
        self.count = 0
        # Every run's output, for the secrets test: (label, text).
        self.outputs: list[Any] = []
        # Fake secrets, vaulted in the inventory's host_vars as an operator would keep them.
        self.vault_password = workdir / "vault-password"
        self.vault_password.write_text("reliability-scenario-vault-password\n")
        self.vault_password.chmod(0o600)
        self.set_secrets(SECRETS[0])

    def env(self, callback: str = "ansible.posix.jsonl") -> dict[str, str]:
        """The environment of a run: the repository's ansible.cfg, nothing of molecule's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
        env.update(
            {
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_STDOUT_CALLBACK": callback,
                "ANSIBLE_DEPRECATION_WARNINGS": "False",
                "PYTHONUNBUFFERED": "1",
                "PATH": f"{BIN}:{env.get('PATH', '')}",
                "DEPLOY_CACHE_DIR": str(CACHE),
            }
        )
        return env

    def command(
        self,
        limit: str,
        extra: dict[str, Any] | None,
        args: list[str],
        playbook: str,
        fast_gate: bool,
        verbose: bool = False,
    ) -> list[str]:
        """The ansible-playbook command line; extra variables go in a file of this session.

        ``verbose`` adds ``-vvvv --diff``: the output is then part of what the secrets test greps.
        """
        self.count += 1
        variables = dict(FAST_GATE if fast_gate else {}, **(extra or {}))
        varfile = self.workdir / f"vars-{self.count}.json"
        varfile.write_text(json.dumps(variables))
        return [
            str(BIN / "ansible-playbook"),
            "-i",
            str(self.inventory),
            str(REPO / playbook),
            "-l",
            limit,
            "-e",
            f"@{varfile}",
            "--vault-password-file",
            str(self.vault_password),
            *(["-vvvv", "--diff"] if verbose else []),
            *args,
        ]

    def run(
        self,
        extra: dict[str, Any] | None = None,
        limit: str = "rel-molecule",
        args: list[str] | None = None,
        playbook: str = "deploy.yml",
        watch: Callable[[dict[str, Any], RunHandle], None] | None = None,
        timeout: float = 600,
        fast_gate: bool = True,
        callback: str = "ansible.posix.jsonl",
        verbose: bool = False,
    ) -> Run:
        """Run to the end; ``watch(event, handle)`` sees each event as it comes (it may kill the run)."""
        handle = RunHandle(
            self.command(limit, extra, list(args or []), playbook, fast_gate, verbose), self.env(callback)
        )
        run = handle.wait(watch, timeout)
        self.outputs.append(
            (
                ("-vvvv --diff " if verbose else "") + " ".join(args or []) + f" run {self.count}",
                run.stdout + run.stderr,
            )
        )
        return run

    def start(
        self,
        extra: dict[str, Any] | None = None,
        limit: str = "rel-molecule",
        args: list[str] | None = None,
        fast_gate: bool = True,
        verbose: bool = False,
    ) -> RunHandle:
        """Start a run in the background (its output is kept for the secrets test when it ends)."""
        handle = RunHandle(self.command(limit, extra, list(args or []), "deploy.yml", fast_gate, verbose), self.env())
        handle.background()
        label = ("-vvvv --diff " if verbose else "") + f"background run {self.count}"
        handle.on_end = lambda run: self.outputs.append((label, run.stdout + run.stderr))
        return handle

    def set_secrets(self, values: dict[str, str]) -> None:
        """Vault ``values`` (hf_token, api_key, engine_secret) into this session's host_vars/rel-molecule."""
        host_vars = self.inventory.parent / "host_vars" / "rel-molecule"
        host_vars.mkdir(parents=True, exist_ok=True)
        (host_vars / "settings.yml").write_text(
            yaml.safe_dump(
                {
                    # transformers serve cannot enforce a key; the scenario rehearses the key's path.
                    "inference_server_allow_unenforced_api_key": True
                }
            )
        )
        vault = host_vars / "secrets.yml"
        vault.write_text(
            yaml.safe_dump(
                {
                    "model_sync_hf_token": values["hf_token"],
                    "inference_server_api_key": values["api_key"],
                    # A secret the engine reads from its environment (the Hub token is model_sync's alone).
                    "inference_server_secrets": {ENGINE_SECRET: values["engine_secret"]},
                }
            )
        )
        subprocess.run(
            [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(self.vault_password), str(vault)],
            check=True,
            capture_output=True,
            env=self.env(),
        )
        assert values["api_key"].encode() not in vault.read_bytes()


class RunHandle:
    """A running ansible-playbook: its events as they come, and a way to kill it like a crash."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
        self.events: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.killed = False
        self.marks: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self.on_end: Callable[[Run], None] | None = None
        self._stderr: list[str] = []
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def mark(self, name: str) -> float:
        """Record a moment of the run (seconds since it started)."""
        self.marks[name] = round(time.monotonic() - self.started, 2)
        return self.marks[name]

    def kill(self) -> None:
        """SIGKILL the whole controller run (ansible-playbook and its workers), as a crash would."""
        self.killed = True
        self.mark("killed")
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _read(self, watch: Callable[[dict[str, Any], RunHandle], None] | None) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.append(event)
            if watch is not None and not self.killed:
                watch(event, self)

    def background(self) -> None:
        """Read the events in a thread."""
        self._thread = threading.Thread(target=self._read, args=(None,), daemon=True)
        self._thread.start()

    def wait(self, watch: Callable[[dict[str, Any], RunHandle], None] | None = None, timeout: float = 600) -> Run:
        """Read (unless in the background) and wait for the end."""
        timer = threading.Timer(timeout, self.kill)
        timer.start()
        try:
            if self._thread is None:
                self._read(watch)
            else:
                self._thread.join(timeout)
            rc = self.proc.wait()
        finally:
            timer.cancel()
        time.sleep(0.1)
        run = Run(
            rc=rc,
            events=self.events,
            stdout="".join(self.lines),
            stderr="".join(self._stderr),
            duration_s=round(time.monotonic() - self.started, 1),
            killed=self.killed,
            marks=self.marks,
        )
        if self.on_end is not None:
            self.on_end(run)
        return run


def task_started(event: dict[str, Any], name: str) -> bool:
    """Whether ``event`` is the start of the task (or handler) named ``name`` (suffix match)."""
    if event.get("_event") not in ("v2_playbook_on_task_start", "v2_playbook_on_handler_task_start"):
        return False
    return event["task"]["name"].endswith(name)


# --------------------------------------------------------------------------------------
# Fixtures and the record
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This session's controller-side files (inventory, variables, model copies)."""
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def deployer(workdir: Path) -> Deployer:
    """Runs deploy.yml against the container."""
    for tool in ("docker",):
        assert shutil.which(tool), f"{tool} is needed to run the reliability cases"
    assert (BIN / "ansible-playbook").exists(), f"no ansible-playbook beside {sys.executable}"
    return Deployer(workdir)


@pytest.fixture(scope="session")
def nightly_dir(workdir: Path) -> Path:
    """Artifacts of the tools/nightly-deploy run (the hang case), searched by the secrets test."""
    path = workdir / "nightly"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def good_state(deployer: Deployer) -> dict[str, Any]:
    """The state converge left: active, serving, no lock; the cases start from it."""
    assert wait_for(healthy, 120), "the server converge deployed does not answer /health"
    state = server_state()
    assert state["ActiveState"] == "active", state
    return state


def record(table: str, **row: Any) -> None:
    """Add a row to one of the tables of docs/reliability.md, naming the test that records it.

    Its ``outcome`` is set when that test has ended (:func:`pytest_runtest_makereport`): a row
    recorded before a failing assert renders as not as expected.
    """
    ROWS.append({"table": table, **row, "test": CURRENT_TEST[0], "outcome": None})


# The node id of the test running now (rows recorded by a fixture belong to the test it serves).
CURRENT_TEST: list[str] = [""]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note the test whose rows :func:`record` adds from now on."""
    CURRENT_TEST[0] = item.nodeid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the rows (also after failures: a failed case is a row too)."""
    if not ROWS:
        return
    write_results(
        RESULTS,
        ROWS,
        image=os.environ.get("MLENV_IMAGE", ""),
        duration_s=round(time.time() - STARTED, 1),
        pytest_exit_status=int(exitstatus),
    )
    # A whole run (no -k or -m, nothing deselected) must give the committed page's rows and
    # outcomes: otherwise the verify fails, and with it make test. `make reliability`, which
    # regenerates the page, sets RELIABILITY_CHECK_ROWS=0.
    options = session.config.option
    if options.keyword or options.markexpr or session.testscollected != len(session.items):
        return
    if os.environ.get("RELIABILITY_CHECK_ROWS") == "0":
        return
    same, said = check_rows(RESULTS, REPO / "docs" / "reliability-results.json")
    sys.stderr.write(said)
    if not same:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def same_server(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Same main process started at the same time, same unit/secrets, same venv and model links, no lock left."""
    keys = ("MainPID", "ExecMainStartTimestamp", "ActiveState", "files")
    return all(before.get(k) == after.get(k) for k in keys)


def normalise(text: str) -> str:
    """Whitespace-normalised text."""
    return " ".join(text.split())


def full_match(pattern: str, text: str) -> bool:
    """Whether the whole (normalised) text matches the (normalised) regex."""
    return re.fullmatch(normalise(pattern), normalise(text), re.S) is not None


@pytest.fixture(autouse=True)
def journal_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the unit's journal when a case fails."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(sh(f"journalctl -u {UNIT} --no-pager -n 80", check=False))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """The rows this test recorded take its outcome: passed only when every phase passed."""
    outcome = yield
    report = outcome.get_result()
    for row in ROWS:
        if row["test"] == item.nodeid and row["outcome"] != "failed" and (report.when == "call" or report.failed):
            row["outcome"] = "failed" if report.failed else report.outcome
