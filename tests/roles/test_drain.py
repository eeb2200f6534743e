"""A stop that drains: SIGTERM to the engine's main process lets the streams in flight finish.

The unit stops the server with ``KillMode=mixed``: systemd sends SIGTERM to the main process
only, and SIGKILLs what is left of the control group once it has exited or after
TimeoutStopSec (``inference_server_drain_timeout_s`` plus a margin). These tests send
exactly those signals to the REAL rehearsal engine (``transformers serve`` with the tiny
model, from ``$DEPLOY_CACHE_DIR``; missing, they fail) while streaming chat completions are
in flight, and render the role's unit to check that it says so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gate_fakes import free_port
from rehearsal_engine import MODEL, start_server, wait_health
from role_files import ansible_env, task_results

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_server"
BIN = Path(sys.executable).parent

STREAMS = 3
# Tokens per stream. transformers serve (without --continuous-batching) generates on one
# inference thread, one request after the other: when the signal comes the first stream is
# generating and the others wait their turn, all of them in flight for the client. Three of
# 128 tokens take about 5 s on an idle 2-core machine. min_new_tokens = max_new_tokens
# makes the tiny random model ignore its end-of-sequence token, so a complete stream has
# exactly this many.
TOKENS = 128
# The server must exit within the role's default drain bound (inference_server_drain_timeout_s;
# the unit adds 30 s before SIGKILL), and within a few seconds of its last stream's end.
DRAIN_BOUND_S = 120
EXIT_AFTER_LAST_S = 10


def stream(url: str, tokens: int, out: dict[str, Any]) -> None:
    """One streaming chat completion; fills ``out`` with what arrived and when."""
    body = {
        "model": str(MODEL),
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": "Count slowly."}],
        "generation_config": json.dumps({"min_new_tokens": tokens, "max_new_tokens": tokens, "do_sample": False}),
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    out.update(chunks=0, first=None, last=None, finish=None, usage=None, done=False, error=None)
    try:
        with urllib.request.urlopen(request, timeout=180) as resp:  # silence allowed per read: a busy 2-core machine
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    out["done"] = True
                    continue
                chunk = json.loads(data)
                out["usage"] = chunk.get("usage") or out["usage"]
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        out["chunks"] += 1
                        out["last"] = time.monotonic()
                        out["first"] = out["first"] or out["last"]
                    out["finish"] = choice.get("finish_reason") or out["finish"]
    except Exception as exc:  # noqa: BLE001 - whatever cut the stream is the finding
        out["error"] = repr(exc)
    out["ended"] = time.monotonic()


def complete(result: dict[str, Any]) -> bool:
    """True when the stream ended normally with all its tokens."""
    return (
        result.get("error") is None
        and result.get("finish") == "length"
        and (result.get("usage") or {}).get("completion_tokens") == TOKENS
    )


def port_refuses(port: int) -> bool:
    """True when nothing accepts a connection on the port any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


def received(tmp_path: Path) -> int:
    """How many chat requests the server has taken (its log says so for each)."""
    return (tmp_path / "server.log").read_text(errors="replace").count("[Request received]")


def signal_during_streams(tmp_path: Path, send) -> dict[str, Any]:
    """Start the real server, open STREAMS streams, call ``send(proc)`` once one has its first
    token and the server took them all, and report the streams, when the port stopped taking
    connections and how the server exited."""
    port = free_port()
    url = f"http://127.0.0.1:{port:d}"
    proc = start_server(tmp_path, port)
    try:
        wait_health(url, proc, tmp_path / "server.log")
        results: list[dict[str, Any]] = [{} for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream, args=(url, TOKENS, r)) for r in results]
        for thread in threads:
            thread.start()
        # In flight: the server took every request and the first one is streaming tokens.
        deadline = time.monotonic() + 60
        while not (any(r.get("first") for r in results) and received(tmp_path) >= STREAMS):
            assert time.monotonic() < deadline, f"the streams never started: {results}"
            time.sleep(0.05)
        assert not any(r.get("ended") for r in results), f"a stream ended before the signal: {results}"
        signalled = time.monotonic()
        send(proc)
        refused_at = None
        while any(t.is_alive() for t in threads) or refused_at is None:
            if refused_at is None and port_refuses(port):
                refused_at = time.monotonic()
            if time.monotonic() - signalled > 90:
                break
            time.sleep(0.05)
        for thread in threads:
            thread.join(timeout=60)
        try:
            returncode = proc.wait(timeout=DRAIN_BOUND_S)
        except subprocess.TimeoutExpired:
            returncode = None
        exited = time.monotonic()
        return {
            "streams": results,
            "signalled": signalled,
            "refused_at": refused_at,
            "returncode": returncode,
            "exit_s": exited - signalled,
            "exit_after_last_s": exited - max(r.get("ended", exited) for r in results),
            "log": (tmp_path / "server.log").read_text(errors="replace"),
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def summary(run: dict[str, Any]) -> str:
    """The streams and the exit, for a failure message and the test log."""
    rows = [
        "stream {:d}: {} tokens, finish {}, error {}, last token {:.2f} s after the signal".format(
            i,
            (r.get("usage") or {}).get("completion_tokens"),
            r.get("finish"),
            r.get("error"),
            (r["last"] - run["signalled"]) if r.get("last") else float("nan"),
        )
        for i, r in enumerate(run["streams"])
    ]
    rows.append(
        "exit {}, {:.2f} s after the signal, {:.2f} s after the last stream ended".format(
            run["returncode"], run["exit_s"], run["exit_after_last_s"]
        )
    )
    return "\n".join(rows) + "\n--- server log ---\n" + run["log"][-2000:]


def test_sigterm_to_the_main_process_lets_every_stream_in_flight_finish(tmp_path):
    """What KillMode=mixed sends first: the streams complete, the port closes, the server exits."""
    run = signal_during_streams(tmp_path, lambda proc: os.kill(proc.pid, signal.SIGTERM))
    print(summary(run))
    assert all(complete(r) for r in run["streams"]), summary(run)
    # Every stream was still running when the signal came.
    assert all(r["ended"] > run["signalled"] for r in run["streams"]), summary(run)
    # New connections are refused during the drain (uvicorn closes its socket at once).
    last_token = max(r["last"] for r in run["streams"])
    assert run["refused_at"] is not None and run["refused_at"] < last_token, summary(run)
    # uvicorn finishes its shutdown, then re-raises the SIGTERM: systemd counts that as a clean stop.
    assert run["returncode"] == -signal.SIGTERM, summary(run)
    assert run["exit_s"] < DRAIN_BOUND_S and run["exit_after_last_s"] < EXIT_AFTER_LAST_S, summary(run)
    assert "Waiting for connections to close" in run["log"], summary(run)


def test_sigkill_cuts_the_streams_which_is_what_the_drain_avoids(tmp_path):
    """The contrast: SIGKILL (what systemd sends after TimeoutStopSec) cuts every stream."""
    run = signal_during_streams(tmp_path, lambda proc: os.kill(proc.pid, signal.SIGKILL))
    print(summary(run))
    assert not any(complete(r) for r in run["streams"]), summary(run)
    assert run["returncode"] == -signal.SIGKILL


def render_unit(tmp_path: Path, **extra: Any) -> str:
    """Render the role's unit template with its defaults and vars (and ``extra``) on localhost."""
    proc = template_run(tmp_path, **extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (tmp_path / "unit").read_text()


def localhost_play(
    tmp_path: Path,
    task: dict[str, Any] | list[dict[str, Any]],
    variables: dict[str, Any],
    vars_files: list[Path] = (),
    json_out: bool = False,
) -> subprocess.CompletedProcess:
    """ansible-playbook with one ``task`` (or a list of tasks) on localhost, as the repository's configuration
    runs it (its filters and roles), with ``variables`` as extra vars and the play's ``vars_files``;
    ``json_out`` prints the json callback's report instead of the default output."""
    tasks = task if isinstance(task, list) else [task]
    play = [{"hosts": "localhost", "gather_facts": False, "vars_files": [str(f) for f in vars_files], "tasks": tasks}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = ansible_env(PATH=f"{BIN}:{os.environ['PATH']}", **({"ANSIBLE_STDOUT_CALLBACK": "json"} if json_out else {}))
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"@{tmp_path / 'vars.json'}"]
    return subprocess.run([*argv, str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path)


def localhost_values(
    tmp_path: Path, queries: list[tuple[str, dict[str, Any]]], vars_files: list[Path] = ()
) -> list[Any]:
    """Each Jinja ``expression`` of ``queries`` (expression, variables), as one ansible-playbook run on
    localhost evaluates it: one debug task per query, its variables as the task's vars (above the play's
    ``vars_files``, as extra vars would be), so that tens of values cost one run instead of tens."""
    tasks = [
        {"name": f"Query {index}", "ansible.builtin.debug": {"msg": f"{{{{ {expression} }}}}"}, "vars": variables}
        for index, (expression, variables) in enumerate(queries)
    ]
    proc = localhost_play(tmp_path, tasks, {}, vars_files, json_out=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [result["msg"] for _, result in task_results(proc)]


# What every render of a template of the server's role is given besides the case's own variables: the
# launch plan and the model revision the unit names.
TEMPLATE_BASE = {
    "inference_server_plan": {
        "argv": ["/opt/ml-env/bin/transformers", "serve", "/srv/models/m", "--port", "8000"],
        "env": {"HF_HOME": "/var/cache/inference-server/huggingface"},
        "notes": [],
    },
    "model_sync_model_dir": "/srv/models/m/revisions/r1",
    "inference_server_engine": "transformers",
}


def template_run(
    tmp_path: Path, template: str = "inference-server.service.j2", role: str = "inference_server", **extra: Any
) -> subprocess.CompletedProcess:
    """The ansible-playbook run that renders a template of ``role`` (the server's unit unless told) with the
    role's defaults and vars (and ``extra``) to ``tmp_path / "unit"``, by the template module."""
    source, dest = template_path(role, template), tmp_path / "unit"
    task = {"name": "Render the template", "ansible.builtin.template": {"src": str(source), "dest": str(dest)}}
    return localhost_play(tmp_path, task, {**TEMPLATE_BASE, **extra}, role_vars_files(role))


def template_results(
    tmp_path: Path,
    variants: list[dict[str, Any]],
    template: str = "inference-server.service.j2",
    role: str = "inference_server",
) -> list[tuple[dict[str, Any], Path]]:
    """Each of ``variants`` rendered by the template module as template_run renders it, all in one
    ansible-playbook run whose tasks go on past a refusal: (the task's result, where it was to write)."""
    source = template_path(role, template)
    dests = [tmp_path / f"render-{index}" for index in range(len(variants))]
    tasks = [
        {
            "name": f"Render {index}",
            "ansible.builtin.template": {"src": str(source), "dest": str(dest)},
            "vars": {**TEMPLATE_BASE, **variant},
            "ignore_errors": True,
        }
        for index, (variant, dest) in enumerate(zip(variants, dests, strict=True))
    ]
    proc = localhost_play(tmp_path, tasks, {}, role_vars_files(role), json_out=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [(result, dest) for (_, result), dest in zip(task_results(proc), dests, strict=True)]


def template_path(role: str, template: str) -> Path:
    """Where ``role``'s ``template`` is."""
    return REPO / "roles" / role / "templates" / template


def role_vars_files(role: str) -> list[Path]:
    """The files of ``role``'s defaults and vars, as a play's vars_files."""
    return [REPO / "roles" / role / "defaults" / "main.yml", REPO / "roles" / role / "vars" / "main.yml"]


def rendered(
    tmp_path: Path,
    variants: list[dict[str, Any]],
    template: str = "inference-server.service.j2",
    role: str = "inference_server",
) -> list[str]:
    """The text of a template of ``role`` for each of ``variants`` (variables beside TEMPLATE_BASE), all in one
    ansible-playbook run: Ansible's template lookup, which renders as the template module does (the same
    templating of the same file; tests/roles/test_probe_url.py compares the two), without a module run each."""
    source = template_path(role, template)
    lookup = f"lookup('ansible.builtin.template', {str(source)!r}, convert_data=False)"
    queries = [(lookup, {**TEMPLATE_BASE, **variant}) for variant in variants]
    return localhost_values(tmp_path, queries, role_vars_files(role))


def directives(unit: str, name: str) -> list[str]:
    """The values of every ``name=`` line of the unit."""
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(name + "=")]


@pytest.mark.parametrize("drain, stop_timeout", [(None, 150), (600, 630), (0, 30)])
def test_the_unit_signals_the_main_process_and_waits_the_drain_bound(tmp_path, drain, stop_timeout):
    unit = render_unit(tmp_path, **({} if drain is None else {"inference_server_drain_timeout_s": drain}))
    assert directives(unit, "KillMode") == ["mixed"]
    assert directives(unit, "TimeoutStopSec") == [str(stop_timeout)]
    # The stop is systemd's own signal: no ExecStop would run before it and eat the timeout.
    assert directives(unit, "ExecStop") == []
    assert len(directives(unit, "ExecStartPre")) == 1 and "port-guard" in directives(unit, "ExecStartPre")[0]
    assert directives(unit, "SendSIGKILL") in ([], ["yes"])


def test_the_converged_fingerprint_follows_the_drain_bound(tmp_path):
    """A documented variable of inference_server: changing it leaves the fast path."""

    def fingerprint(value: int) -> dict:
        play = [
            {
                "hosts": "localhost",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": "Fingerprint",
                        "converged_fingerprint": {
                            "roles_dir": str(REPO / "roles"),
                            "roles": ["inference_server"],
                            "paths": [],
                            "facts": {},
                        },
                        "register": "fp",
                    },
                    {"name": "Show", "ansible.builtin.debug": {"var": "fp.fingerprint"}},
                ],
            }
        ]
        # fmt: off
        (tmp_path / "fp.yml").write_text(json.dumps(play))
        env = dict(os.environ, ANSIBLE_ACTION_PLUGINS=str(REPO / "roles/converged/action_plugins"),
                   ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
                   ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
                   PATH=f"{BIN}:{os.environ['PATH']}")
        # fmt: on
        proc = subprocess.run(
            [
                str(BIN / "ansible-playbook"),
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
                "-e",
                json.dumps({"inference_server_drain_timeout_s": value}),
                str(tmp_path / "fp.yml"),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return task_results(proc)[-1][1]["fp.fingerprint"]

    first, second = fingerprint(120), fingerprint(300)
    assert [k for k in first if first[k] != second.get(k)] == ["variables of role inference_server"]
