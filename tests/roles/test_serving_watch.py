"""The watchdog between deploys (files/watchdog.py), the unit's restart and boot directives.

The watchdog probes a REAL HTTP server here (a thread of this test: healthy, hung, busy with a
generation that outlasts the deadline while its /metrics counters advance or stay frozen, or
refusing a wrong key); systemd is a small stand-in ``systemctl`` on PATH that keeps the unit's
state in a file, logs each call and, when asked, holds the unit to a start limit as systemd does.
The molecule scenario ``reliability`` runs the same program against the real unit
(tests/test_5_between_deploys.py: a SIGSTOPped server, a crash loop).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import install
from role_files import import_file
from test_drain import directives, render_unit, template_run

REPO = Path(__file__).resolve().parents[2]
WATCHDOG = REPO / "roles" / "inference_server" / "files" / "watchdog.py"
VARS = REPO / "roles" / "inference_server" / "vars" / "main.yml"
KEY = "sk-watchdog-test-not-a-secret"
# systemctl as the watchdog uses it: show (the unit's properties), reset-failed, restart, start. With
# "start_limit_burst" in the state, a start beyond that many since the last reset-failed is refused as
# systemd refuses it: the unit fails with Result=start-limit-hit.
FAKE_SYSTEMCTL = r"""#!/usr/bin/env python3
import json, os, sys, time
path = os.environ["FAKE_UNIT_STATE"]
state = json.load(open(path))
with open(path + ".calls", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
if sys.argv[1] == "show":
    for key in ("ActiveState", "InvocationID", "InactiveEnterTimestampMonotonic", "Result", "NRestarts"):
        print(f"{key}={state.get(key, '')}")
elif sys.argv[1] == "reset-failed":
    state["starts"] = 0
    if state["ActiveState"] == "failed":
        state.update(ActiveState="inactive", Result="success")
    json.dump(state, open(path, "w"))
elif sys.argv[1] in ("restart", "start"):
    state["starts"] = state.get("starts", 0) + 1
    if state["starts"] > state.get("start_limit_burst", 1e9):
        state.update(ActiveState="failed", Result="start-limit-hit",
                     InactiveEnterTimestampMonotonic=int(time.monotonic() * 1e6))
    else:
        state.update(ActiveState=state.get("after_start", "active"), InvocationID=state["InvocationID"] + "x")
    json.dump(state, open(path, "w"))
"""
# SGLang's /metrics as 0.5.11 and 0.5.17 write it (bench/results/sglang-0.5.1*-metrics.txt): the series the
# watchdog reads, labelled as SGLang labels them, with others around them.
METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 4.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 1.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{engine_type="unified",is_streaming="false",model_name="/m"}} {finished}.0
sglang:generation_tokens_total{{engine_type="unified",is_streaming="true",model_name="/m"}} 12.0
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval).
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{{engine_type="unified",mode="prefill_compute",model_name="/m",tp_rank="0"}} 856.0
sglang:realtime_tokens_total{{engine_type="unified",mode="decode",model_name="/m",tp_rank="0"}} {decoded}.0
sglang:cache_hit_rate{{engine_type="unified",model_name="/m"}} 0.5
"""


class Handler(BaseHTTPRequestHandler):
    """/health, /metrics and a streamed /v1/chat/completions. ``server.mode``: ok, hang (nothing answers
    within 2 s), busy (/health and /metrics answer, a generation takes 2 s) or key; ``server.metrics``:
    None (no /metrics: 404, as transformers serve or SGLang without --enable-metrics), advancing (the
    token counters grow between two reads, as a server that generates) or frozen."""

    def log_message(self, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """/health: 200 unless hung; /metrics: SGLang's text, or 404."""
        if self.server.mode == "hang":  # type: ignore[attr-defined]
            time.sleep(2)
        if self.path == "/metrics":
            if self.server.metrics is None:  # type: ignore[attr-defined]
                self.send_response(404)
                self.end_headers()
                return
            if self.server.metrics == "advancing":  # type: ignore[attr-defined]
                self.server.reads += 1  # type: ignore[attr-defined]
            reads = self.server.reads  # type: ignore[attr-defined]
            body = METRICS.format(finished=100 + 3 * reads, decoded=6540 + 40 * reads).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        """One streamed chunk and [DONE]; 401 without the right key in key mode; 2 s late in busy mode."""
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.auth.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        if self.server.mode == "key" and self.headers.get("Authorization") != f"Bearer {KEY}":  # type: ignore[attr-defined]
            self.send_response(401)
            self.end_headers()
            return
        if self.server.mode == "busy":  # type: ignore[attr-defined]
            time.sleep(2)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"delta": {"content": "OK"}}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def server():
    """A local HTTP server in a thread; set ``.mode`` and ``.metrics``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.mode, httpd.auth, httpd.metrics, httpd.reads = "ok", [], None, 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


@pytest.fixture
def host(tmp_path, server):
    """The watchdog's configuration, its stand-in systemd and a runner: ``host.run(*args, **env)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    (tmp_path / "api-key.yaml").write_text(f"# key\napi-key: {json.dumps(KEY)}\n")
    port = server.server_address[1]
    config = {
        "unit": "llm",
        "health_url": f"http://127.0.0.1:{port}/health",
        "chat_url": f"http://127.0.0.1:{port}/v1/chat/completions",
        "metrics_url": f"http://127.0.0.1:{port}/metrics",
        "model": "/srv/models/m",
        "api_key_file": str(tmp_path / "api-key.yaml"),
        "deadline_s": 1,
        "failures": 2,
        "retry_failed_s": 120,
        "retry_failed_max_s": 1800,
        "stop_timeout_s": 1,
        "start_timeout_s": 1,
        "lock_path": str(tmp_path / "deploy.lock"),
        "lock_stale_after_s": 3600,
        "state_file": str(tmp_path / "deploy" / "watchdog.json"),
        "textfile": str(tmp_path / "textfile" / "llm_watchdog.prom"),
        "watchdog": True,
    }
    (tmp_path / "watchdog.json").write_text(json.dumps(config))
    unit_file = tmp_path / "unit.json"
    unit_file.write_text(
        json.dumps({"ActiveState": "active", "InvocationID": "a1", "InactiveEnterTimestampMonotonic": 0})
    )

    class Host:
        paths = config
        unit = str(unit_file)

        def run(
            self,
            *args: str,
            program: list[str] = (str(WATCHDOG),),
            interpreter: list[str] = (sys.executable,),
            **env: str,
        ) -> subprocess.CompletedProcess:
            environ = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_UNIT_STATE=str(unit_file), **env)
            cmd = [*interpreter, *program, *(args or ("probe",)), str(tmp_path / "watchdog.json")]
            return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=60)

        def metric(self, name: str) -> float:
            text = Path(config["textfile"]).read_text()
            return float(re.search(rf'^{name}{{unit="llm"}} (\S+)$', text, re.M).group(1))

        def calls(self) -> list[str]:
            log = Path(f"{unit_file}.calls")
            return [c for c in log.read_text().splitlines() if not c.startswith("show")] if log.exists() else []

        def set_unit(self, **values: Any) -> None:
            unit_file.write_text(json.dumps({**json.loads(unit_file.read_text()), **values}))

    return Host()


def test_a_healthy_server_is_probed_with_the_key_and_left_alone(host, server):
    run = host.run()
    assert run.returncode == 0 and "healthy" in run.stdout, run.stdout + run.stderr
    assert server.auth == [f"Bearer {KEY}"]
    assert KEY not in run.stdout + run.stderr
    assert host.calls() == []
    assert host.metric("llm_watchdog_probe_success") == 1
    assert 0 < host.metric("llm_watchdog_probe_latency_seconds") < 1
    assert abs(host.metric("llm_watchdog_last_probe_timestamp_seconds") - time.time()) < 30
    assert host.metric("llm_watchdog_restarts_total") == 0


def test_a_wrong_key_is_a_failed_probe_named_without_the_key(host, server):
    server.mode = "key"
    Path(host.paths["api_key_file"]).write_text('api-key: "sk-other"\n')
    run = host.run()
    assert "probe failed (1 of 2 in a row): HTTP 401 from /v1/chat/completions" in run.stdout, run.stdout
    assert "sk-other" not in run.stdout + run.stderr and host.metric("llm_watchdog_probe_success") == 0


def test_a_hung_server_is_restarted_after_the_failures_in_a_row(host, server):
    server.mode = "hang"
    first = host.run()
    assert "probe failed (1 of 2 in a row): no answer within 1 s" in first.stdout, first.stdout
    assert host.calls() == [] and host.metric("llm_watchdog_consecutive_failures") == 1
    second = host.run()
    assert "does not answer: restarting it" in second.stdout and "is active after" in second.stdout, second.stdout
    # The deploy's way, a restart that does not block (the drain), but the start limit is not cleared:
    # a server that hangs again after each restart must reach it (test_..._hits_the_start_limit...).
    assert host.calls() == ["restart --no-block llm.service"]
    assert host.metric("llm_watchdog_restarts_total") == 1
    assert host.metric("llm_watchdog_consecutive_failures") == 0


def test_as_installed_the_watchdog_restarts_through_the_restart_program_beside_it(host, server, tmp_path):
    """On the host the watchdog is /usr/local/lib/<unit>/watchdog, beside the modules of llm_host_lib that
    inference_server installs (its vars list them): the restart it runs is that program's (no site-packages:
    -S, so nothing else could have provided it)."""
    helpers = tmp_path / "usr-local-lib-llm"
    install.install(str(helpers), yaml.safe_load(VARS.read_text())["_inference_server_helper_lib_files"])
    (helpers / "watchdog").write_bytes(WATCHDOG.read_bytes())
    server.mode = "hang"
    installed = ["-S", str(helpers / "watchdog")]
    assert "probe failed (1 of 2 in a row)" in host.run(program=installed).stdout
    second = host.run(program=installed)
    assert "llm.service is active after the watchdog's restart" in second.stdout, second.stdout + second.stderr
    assert host.calls() == ["restart --no-block llm.service"]


def test_nothing_is_probed_while_a_deploy_holds_the_lock_or_the_unit_is_starting(host, server):
    server.mode = "hang"
    lock = Path(host.paths["lock_path"])
    host.run()
    before = host.metric("llm_watchdog_consecutive_failures")
    lock.write_text("{}")
    assert "skipped: a deploy holds" in host.run().stdout
    os.utime(lock, (time.time() - 7200, time.time() - 7200))  # older than lock_stale_after_s
    assert "probe failed (2 of 2 in a row)" in host.run().stdout
    assert before == 1 and host.calls() == ["restart --no-block llm.service"]
    lock.unlink()
    host.set_unit(ActiveState="activating")
    assert "skipped: llm.service is activating" in host.run().stdout
    assert host.metric("llm_watchdog_consecutive_failures") == 0 and len(host.calls()) == 1


def test_a_unit_systemd_gave_up_on_is_started_again_with_a_back_off(host):
    now = time.monotonic()
    host.set_unit(ActiveState="failed", Result="start-limit-hit", InactiveEnterTimestampMonotonic=int(now * 1e6))
    run = host.run("gave-up")
    assert "systemd gave up (time 1)" in run.stdout and host.metric("llm_server_gave_up_total") == 1
    assert re.search(r"gave up \d+ s ago \(Result=start-limit-hit\); retry in 1\d\d s", host.run().stdout)
    assert host.calls() == []
    # Failed for longer than the first wait: started; it fails again (after_start), so the next wait doubles.
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 150) * 1e6), after_start="failed")
    assert "is failed after the retry" in host.run().stdout
    assert host.calls() == ["reset-failed llm.service", "start --no-block llm.service"]
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 150) * 1e6))
    assert re.search(r"retry in (8\d|9\d) s", host.run().stdout)  # 240 s wait, 150 s gone
    host.set_unit(InactiveEnterTimestampMonotonic=int((now - 250) * 1e6), after_start="active")
    assert "is active after the retry" in host.run().stdout
    assert host.metric("llm_watchdog_restarts_total") == 2


def test_a_busy_server_whose_tokens_advance_is_not_restarted(host, server):
    """ct129 under load: the probe waits behind running requests past its deadline, but the engine's
    token counters grow meanwhile. That is a busy server, not a hung one: no failure, no restart."""
    server.mode, server.metrics = "busy", "advancing"
    for _ in range(3):
        run = host.run()
        assert run.returncode == 0, run.stdout + run.stderr
        assert re.search(
            r"busy: the generation took longer than 1 s while the engine generated \d+ tokens", run.stdout
        ), run.stdout
        assert "4 running, 1 queued" in run.stdout
    assert host.calls() == []
    assert host.metric("llm_watchdog_consecutive_failures") == 0
    assert host.metric("llm_watchdog_probe_busy") == 1 and host.metric("llm_watchdog_busy_probes_total") == 3
    assert host.metric("llm_watchdog_probe_success") == 0 and host.metric("llm_watchdog_restarts_total") == 0


def test_a_server_whose_counters_stay_frozen_is_hung_and_restarted(host, server):
    """The same missed deadline with the token counters still: no progress, so a failure."""
    server.mode, server.metrics = "busy", "frozen"
    first = host.run()
    assert "probe failed (1 of 2 in a row): the generation took longer than 1 s" in first.stdout, first.stdout
    assert "the engine generated no token meanwhile (4 running, 1 queued)" in first.stdout
    second = host.run()
    assert "does not answer: restarting it" in second.stdout, second.stdout
    assert host.calls() == ["restart --no-block llm.service"]
    assert host.metric("llm_watchdog_probe_busy") == 0 and host.metric("llm_watchdog_busy_probes_total") == 0


def test_an_engine_without_metrics_keeps_the_missed_deadline_a_failure(host, server):
    """transformers serve (or SGLang without --enable-metrics): /metrics is 404, so a missed deadline is a
    failure, as before."""
    server.mode = "busy"
    assert "probe failed (1 of 2 in a row): the generation took longer than 1 s" in host.run().stdout
    assert "does not answer: restarting it" in host.run().stdout
    assert host.calls() == ["restart --no-block llm.service"]


def test_a_server_that_hangs_after_every_restart_hits_the_start_limit_and_backs_off(host, server):
    """The watchdog's restarts of a hung server count against the unit's start limit (systemd's 3 starts in
    600 s): after the third, systemd refuses the fourth and the unit is failed; from then on the give-up
    path's back-off decides (it alone clears the limit, once per retry). Clearing it before every restart,
    as before, restarted a server that hangs for good every two probes, for ever."""
    server.mode = "hang"
    host.set_unit(start_limit_burst=3)
    for _ in range(4):
        host.run()
        host.run()
    assert host.calls() == ["restart --no-block llm.service"] * 4
    state = json.loads(Path(host.unit).read_text())
    assert (state["ActiveState"], state["Result"]) == ("failed", "start-limit-hit")
    # The give-up path: it waits its back-off, then clears the limit and starts the unit once.
    assert re.search(r"gave up \d+ s ago \(Result=start-limit-hit\); retry in 1\d\d s", host.run().stdout)
    host.set_unit(InactiveEnterTimestampMonotonic=int((time.monotonic() - 150) * 1e6))
    assert "is active after the retry" in host.run().stdout
    assert host.calls()[-2:] == ["reset-failed llm.service", "start --no-block llm.service"]


def test_the_textfile_is_written_through_a_fresh_file_that_follows_no_link(tmp_path, monkeypatch):
    """The textfile directory is node_exporter's, not root's own: a link planted where the watchdog writes
    its textfile aside (formerly the predictable .llm_watchdog.prom.<pid>) must not lead root's write and
    chmod to another file; a link at the textfile's own name is replaced, not followed."""
    watchdog = import_file(WATCHDOG, "watchdog_under_test")
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    (textfile_dir / ".llm_watchdog.prom.4242").symlink_to(victim)
    (textfile_dir / "llm_watchdog.prom").symlink_to(victim)
    config = {"unit": "llm", "state_file": str(tmp_path / "deploy" / "watchdog.json"),
              "textfile": str(textfile_dir / "llm_watchdog.prom")}  # fmt: skip
    watchdog.publish(config, lambda st: st.update(llm_watchdog_restarts_total=1))
    assert victim.read_text() == "root's file\n" and victim.stat().st_mode & 0o777 == 0o600
    written = textfile_dir / "llm_watchdog.prom"
    assert not written.is_symlink() and written.stat().st_mode & 0o777 == 0o644
    assert 'llm_watchdog_restarts_total{unit="llm"} 1' in written.read_text()
    state = Path(config["state_file"])
    assert state.stat().st_mode & 0o777 == 0o600 and json.loads(state.read_text())["llm_watchdog_restarts_total"] == 1
    # Nothing left aside but the planted link.
    assert sorted(p.name for p in textfile_dir.iterdir()) == [".llm_watchdog.prom.4242", "llm_watchdog.prom"]


# The engine's own port behind the API front of the "::" bind (docs/security.md, "The API front").
@pytest.mark.parametrize("argv, metrics_url", [(["--enable-metrics"], "http://[::1]:30001/metrics"), ([], "")])
def test_the_watchdog_reads_the_engines_metrics_where_the_plan_turns_them_on(tmp_path, argv, metrics_url):
    plan = {"argv": ["/opt/ml-env/bin/sglang", "serve", *argv], "env": {}, "notes": []}
    proc = template_run(
        tmp_path,
        template="watchdog.json.j2",
        inference_server_plan=plan,
        inference_server_host="::",
        inference_server_port=30000,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert json.loads((tmp_path / "unit").read_text())["metrics_url"] == metrics_url


@pytest.mark.parametrize(
    "template, network",
    [("inference-server-watchdog.service.j2", True), ("inference-server-gave-up.service.j2", False)],
)
def test_the_watchdogs_units_run_without_capabilities_on_a_read_only_system(tmp_path, template, network):
    """Issue 44, item 6: root with ProtectSystem=full and every capability before; now what their work
    needs (systemctl on systemd's private socket, the key file and the state as root's own files)."""
    proc = template_run(tmp_path, template=template, inference_server_host="10.0.4.17")
    assert proc.returncode == 0, proc.stdout[-2000:]
    unit = (tmp_path / "unit").read_text()
    assert directives(unit, "ProtectSystem") == ["strict"] and directives(unit, "CapabilityBoundingSet") == [""]
    assert directives(unit, "ReadWritePaths") == [
        "/var/lib/inference-server-deploy /var/lib/node_exporter/textfile_collector"
    ]
    for name in ("NoNewPrivileges", "PrivateDevices", "PrivateTmp", "PrivateIPC", "ProtectKernelTunables"):
        assert directives(unit, name) == ["yes"], name
    assert directives(unit, "IPAddressDeny") == ["any"]
    if network:
        assert directives(unit, "RestrictAddressFamilies") == ["AF_UNIX AF_INET AF_INET6"]
        assert directives(unit, "IPAddressAllow") == ["localhost"]
    else:
        assert directives(unit, "RestrictAddressFamilies") == ["AF_UNIX"] and directives(unit, "PrivateNetwork") == [
            "yes"
        ]


@pytest.mark.parametrize("engine, after", [("sglang", ["nvidia-persistenced.service"]), ("transformers", [])])
def test_the_unit_waits_for_its_mounts_and_the_gpu_daemon_and_records_a_give_up(tmp_path, engine, after):
    unit = render_unit(
        tmp_path,
        inference_server_engine=engine,
        ml_env_path="/opt/ml-env",
        ml_env_venv_dir="/opt/ml-env.d/0123456789ab",
    )
    assert directives(unit, "After") == [" ".join(["network-online.target", *after])]
    assert directives(unit, "Wants") == [" ".join(["network-online.target", *after])]
    assert directives(unit, "RequiresMountsFor") == [
        "/opt/ml-env /opt/ml-env.d/0123456789ab /srv/models/m/revisions/r1"
    ]
    assert directives(unit, "OnFailure") == ["inference-server-gave-up.service"]
    assert (directives(unit, "Restart"), directives(unit, "StartLimitBurst")) == (["on-failure"], ["3"])
    assert directives(unit, "StartLimitIntervalSec") == ["600"]


@pytest.mark.parametrize("template", ["inference-server-watchdog.service.j2", "inference-server-gave-up.service.j2"])
def test_the_watchdog_as_its_unit_runs_it_imports_nothing_a_site_directory_planted(tmp_path, template, host):
    """Issue 51, item 6: root runs the watchdog with the host's python3; its package beside it is a namespace
    package (no __init__.py), which a regular package of the same name anywhere on sys.path shadows (Debian's
    /usr/local/lib/python3*/dist-packages is group staff's). The unit's own command line, run here with a
    site directory (the user site of HOME) and PYTHONPATH that each hold such a package: nothing of it runs,
    and the watchdog does its work."""
    proc = template_run(tmp_path, template=template)
    assert proc.returncode == 0, proc.stdout[-2000:]
    [command] = directives((tmp_path / "unit").read_text(), "ExecStart")
    words = command.split()
    [program] = [word for word in words if word.endswith("/watchdog")]
    interpreter, subcommand = words[: words.index(program)], words[words.index(program) + 1]
    helpers = tmp_path / "usr-local-lib-llm"
    install.install(str(helpers), yaml.safe_load(VARS.read_text())["_inference_server_helper_lib_files"])
    (helpers / "watchdog").write_bytes(WATCHDOG.read_bytes())
    canary, home = tmp_path / "canary", tmp_path / "home"
    where = [interpreter[0], "-c", "import site; print(site.getusersitepackages())"]
    user_site = subprocess.run(where, env={"HOME": str(home)}, capture_output=True, text=True, check=True).stdout
    for planted in (Path(user_site.strip()), tmp_path / "pythonpath"):
        shadow = planted / "ansible_collections"
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text(f"open({str(canary)!r}, 'a').write({str(planted)!r} + '\\n')\n")
    run = host.run(
        subcommand, interpreter=interpreter, program=[str(helpers / "watchdog")], HOME=str(home),
        PYTHONPATH=str(tmp_path / "pythonpath"),
    )  # fmt: skip
    assert not canary.exists(), f"root ran {canary.read_text()} through {' '.join(interpreter)}"
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
