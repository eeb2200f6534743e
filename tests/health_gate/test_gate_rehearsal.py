"""The gate against the REAL rehearsal server: ``transformers serve`` with the tiny model.

Finds the CPU venv and the model under ``$DEPLOY_CACHE_DIR`` (default ``<repo>/.cache``),
which ``make tools-venv model`` builds. Missing, these tests FAIL (they never skip):
the happy path must be proven against a real server.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from gate_fakes import CLI, HOST_PYTHON_ENV, REPO, free_port
from rehearsal_engine import MODEL, start_server, stop_server, wait_health
from test_gate_module import SYSTEM_PYTHON, ansible_env, tool


@pytest.fixture(scope="module")
def rehearsal_server():
    """One real server for the module's happy-path tests."""
    tmp = Path(tempfile.mkdtemp(prefix="gate-rehearsal-"))
    port = free_port()
    proc = start_server(tmp, port)
    url = f"http://127.0.0.1:{port:d}"
    try:
        wait_health(url, proc, tmp / "server.log")
        yield {"url": url, "proc": proc, "log": tmp / "server.log", "model": str(MODEL)}
    finally:
        stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SYSTEM_PYTHON, str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=HOST_PYTHON_ENV
    )


def test_cli_passes_against_the_real_server_with_usage_based_figures(rehearsal_server):
    srv = rehearsal_server
    proc = run_cli(
        "--url",
        srv["url"],
        "--model",
        srv["model"],
        "--pid",
        str(srv["proc"].pid),
        "--log",
        str(srv["log"]),
        "--engine",
        "transformers",
        "--warmup",
        "1",
        "--requests",
        "3",
        "--max-tokens",
        "24",
        "--min-decode-tps",
        "1",
        "--max-ttft",
        "60",
        "--correctness",
        "off",
        "--json",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["passed"] and report["engine"] == "transformers" and report["model"] == srv["model"]
    assert report["correctness"] is None and report["correctness_why"] == "the correctness probe is off"
    assert len(report["requests"]) == 3
    assert report["settings"]["fixed_output"] == "min_new_tokens"
    for req in report["requests"]:
        # tokens come from the server's usage: exactly max_tokens, the gate asked transformers serve for
        # min_new_tokens (the random model stops early at EOS otherwise)
        assert req["completion_tokens"] == 24 and req["finish_reason"] == "length"
        assert req["prompt_tokens"] > 50  # the shipped prompts are long coding prompts
        assert req["ttft_s"] > 0 and req["e2e_s"] >= req["ttft_s"]
    agg = report["aggregate"]
    assert agg["completion_tokens"] == sum(r["completion_tokens"] for r in report["requests"])
    assert agg["decode_tps_mean"] and agg["decode_tps_mean"] > 1
    assert report["speculative"]["accept_length"] is None  # transformers reports none: check not applied
    assert report["notes"] and "/v1/models lists no model" in report["notes"][0]


def test_cli_repeat_measures_the_gates_own_noise_on_the_real_server(rehearsal_server, tmp_path):
    """``--repeat``: whole gates of the one real server, each figure's spread against a third of the margin
    (one short prompt, so that it costs seconds of make test)."""
    srv = rehearsal_server
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["Write a haiku about a cache."]))
    proc = run_cli(
        *("--url", srv["url"], "--model", srv["model"], "--engine", "transformers", "--prompts", str(prompts)),
        *("--warmup", "1", "--requests", "1", "--max-tokens", "8", "--repeat", "2", "--max-regression-pct", "900"),
        *("--correctness", "off", "--json"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    block = result["concurrencies"]["1"]
    assert result["limit_pct"] == 300.0 and len(block["runs"]) == 2
    assert all(run["completion_tokens"] == [8] for run in block["runs"])  # exactly max_tokens (min_new_tokens)
    decode = block["repeatability"]["figures"]["decode_tps_mean"]
    assert all(v > 1 for v in decode["values"]) and decode["spread_pct"] >= 0 and decode["ok"]
    assert "accept_length" not in block["repeatability"]["figures"]  # transformers serve reports none


def probe_options(srv: dict, unit: str, **more: object) -> dict:
    """A short gate of the real server with the probe, judged by group_vars/rehearsal.yml's thresholds."""
    import yaml

    group = yaml.safe_load((REPO / "group_vars" / "rehearsal.yml").read_text())
    return {
        "url": srv["url"],
        "model": srv["model"],
        "engine": "transformers",
        "warmup_requests": 0,
        "requests": 1,
        "max_tokens": 8,
        "probe_set": str(REPO / "roles/health_gate/files/probes" / f"{group['health_gate_probe_set']}.json"),
        "min_eval_score": group["health_gate_min_eval_score"],
        "eval_margin_pct": group["health_gate_eval_margin_pct"],
        "metadata": {"unit_sha256": unit, "model_revision": "tiny"},
        **more,
    }


@pytest.fixture(scope="module")
def first_probe_gate(rehearsal_server) -> tuple[dict, dict]:
    """The first gate with the probe of the module's server (no last-known-good yet), and its options.

    One gate for the tests that hold later gates to its record (each costs seconds of a real server):
    test_the_rehearsal_model_answers_its_own_eval... checks this report itself.
    """
    from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate

    options = probe_options(rehearsal_server, "first")
    return llm_gate.run_gate(dict(options)), options


def test_the_rehearsal_model_answers_its_own_eval_and_the_same_tokens_every_time(first_probe_gate):
    """The correctness probe against the real CPU engine and the trained tiny model: it scores the
    rehearsal group's floor or more, its greedy outputs repeat exactly (consistency), and a second
    deploy of another unit gives the first one's golden outputs and score (group_vars/rehearsal.yml's
    thresholds, as a deploy judges it)."""
    import yaml
    from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate

    group = yaml.safe_load((REPO / "group_vars" / "rehearsal.yml").read_text())
    first, options = first_probe_gate
    assert first["passed"], first["reasons"]
    found = {check["name"]: check for check in first["checks"]}
    assert found["eval_score"]["value"] >= group["health_gate_min_eval_score"] > 0
    assert found["consistency"]["ok"] and all(
        row["repeat_differs_at"] is None for row in found["consistency"]["prompts"]
    )
    metadata = {"unit_sha256": "second", "model_revision": "tiny"}
    second = llm_gate.run_gate(dict(options, metadata=metadata, baseline=first["verdict"]["baseline"]))
    assert second["passed"], second["reasons"]
    golden = {check["name"]: check for check in second["checks"]}["golden_outputs"]
    assert golden["same"] == len(golden["prompts"]) == 5 and golden["value"] == 1.0
    assert {check["name"]: check for check in second["checks"]}["eval_score_vs_last_known_good"]["ok"]
    assert first["correctness"]["duration_s"] < 60, "the probe's cost on the CPU (bench/results/correctness_cpu.json)"


def test_gates_under_live_traffic_give_no_false_failure_and_still_refuse_other_outputs(
    rehearsal_server, first_probe_gate
):
    """Clients talk to the server while the gate runs (ct129's case): 2 streaming clients send chat
    requests all along, and 2 gates of the unchanged server against the first one's record (a gate
    without traffic, first_probe_gate) pass (golden outputs, consistency, the paired eval); a record
    whose golden output differs is refused under the same traffic (issue 50, item 4)."""
    import json as json_module
    import threading
    import urllib.request

    from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate

    srv = rehearsal_server
    first, options = first_probe_gate
    options = dict(options, correctness="always")
    assert first["passed"], first["reasons"]
    stop, answered, failed = threading.Event(), [], []

    def client(number: int) -> None:
        while not stop.is_set():
            question = f"What is {number} + {len(answered) % 50}?"
            body = {"model": srv["model"], "messages": [{"role": "user", "content": question}], "max_tokens": 16,
                    "stream": True, "temperature": 0}  # fmt: skip
            data, headers = json_module.dumps(body).encode(), {"Content-Type": "application/json"}
            request = urllib.request.Request(srv["url"] + "/v1/chat/completions", data, headers)
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    answer.read()
                answered.append(number)
            except OSError as exc:
                failed.append(repr(exc))

    clients = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(2)]
    for thread in clients:
        thread.start()
    try:
        reports = []
        for n in range(2):
            options.update(metadata={"unit_sha256": f"under-traffic-{n}", "model_revision": "tiny"})
            reports.append(llm_gate.run_gate(dict(options, baseline=first["verdict"]["baseline"])))
        other = json_module.loads(json_module.dumps(first["verdict"]["baseline"]))
        some = sorted(other["correctness"]["golden"])[0]
        other["correctness"]["golden"][some]["text"] = "something else entirely"
        refused = llm_gate.run_gate(dict(options, baseline=other))
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=150)
    assert len(answered) >= 4 and not failed, (len(answered), failed[:3])
    assert [r["reasons"] for r in reports] == [[], []], "a false failure under traffic"
    assert all({c["name"]: c for c in r["checks"]}["golden_outputs"]["same"] == 5 for r in reports)
    assert not refused["passed"] and any("golden outputs differ" in reason for reason in refused["reasons"])


def test_role_passes_on_localhost_records_metadata_and_changes_nothing(rehearsal_server, tmp_path):
    srv = rehearsal_server
    unit_file = tmp_path / "inference-server.service"
    unit_file.write_text("[Service]\nExecStart=/bin/true\n")
    report_dir = tmp_path / "reports"
    textfile_dir = tmp_path / "textfile_collector"
    textfile_dir.mkdir(mode=0o755)  # as node_exporter's package leaves it: the role changes nothing there
    textfile_dir.chmod(0o755)
    playbook = tmp_path / "gate.yml"
    playbook.write_text(
        "- name: Gate the rehearsal server\n  hosts: localhost\n  connection: local\n"
        "  gather_facts: false\n  roles:\n    - role: health_gate\n"
    )
    extra = {
        "health_gate_textfile_dir": str(textfile_dir),
        "health_gate_url": srv["url"],
        "health_gate_unit": "",
        "health_gate_model": srv["model"],
        "health_gate_engine": "transformers",
        "health_gate_warmup_requests": 1,
        "health_gate_requests": 2,
        "health_gate_max_tokens": 16,
        "health_gate_min_decode_tps": 1,
        "health_gate_max_ttft_s": 60,
        "health_gate_report_dir": str(report_dir),
        "health_gate_unit_file": str(unit_file),
        "health_gate_metadata": {"venv_lock_sha256": "feed"},
        "model_sync_revision": "tiny-r1",
        # The rehearsal group's probe set and floor (the trained tiny model answers it).
        "health_gate_probe_set": "tiny-rehearsal",
        "health_gate_min_eval_score": 0.8,
        "ansible_python_interpreter": SYSTEM_PYTHON,
    }
    env = ansible_env()
    env.pop("ANSIBLE_STDOUT_CALLBACK")
    proc = subprocess.run(
        [tool("ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "gate PASS: " in proc.stdout
    assert "changed=0" in proc.stdout.split("PLAY RECAP")[1]
    latest = json.loads((report_dir / "latest.json").read_text())
    meta = latest["metadata"]
    assert meta["unit_sha256"] == hashlib.sha256(unit_file.read_bytes()).hexdigest()
    assert meta["env_sha256"] is None  # no such file on this machine
    assert meta["model_revision"] == "tiny-r1" and meta["venv_lock_sha256"] == "feed"
    assert latest["settings"]["prompts"][0] == "py-log-top-errors"
    assert latest["correctness"]["probe"]["name"] == "tiny-rehearsal" and latest["correctness"]["eval"]["score"] >= 0.8
    assert "right: consistency 3/3, eval 20/20 (min 0.8)" in latest["summary"]
    prom = (textfile_dir / "llm_gate.prom").read_text()
    assert 'llm_gate_eval_score{host="localhost"}' in prom and 'llm_gate_min_eval_score{host="localhost"} 0.8' in prom
    assert "llm_gate_passed" in prom and 'host="localhost"' in prom


def test_role_failure_prints_the_summary_fails_and_keeps_the_report(rehearsal_server, tmp_path):
    srv = rehearsal_server
    report_dir = tmp_path / "reports"
    playbook = tmp_path / "gate.yml"
    playbook.write_text(
        "- name: Gate the rehearsal server\n  hosts: localhost\n  connection: local\n"
        "  gather_facts: false\n  roles:\n    - role: health_gate\n"
    )
    extra = {
        "health_gate_url": srv["url"],
        "health_gate_unit": "",
        "health_gate_model": srv["model"],
        "health_gate_warmup_requests": 0,
        "health_gate_requests": 1,
        "health_gate_max_tokens": 8,
        "health_gate_min_decode_tps": 100000,
        "health_gate_correctness": "off",
        "health_gate_report_dir": str(report_dir),
        "health_gate_textfile_dir": "",  # not this machine's node_exporter directory
        "ansible_python_interpreter": SYSTEM_PYTHON,
    }
    env = ansible_env()
    env.pop("ANSIBLE_STDOUT_CALLBACK")
    proc = subprocess.run(
        [tool("ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=str(REPO),
    )
    assert proc.returncode != 0
    out = proc.stdout
    assert "gate FAIL: " in out and "is below min_decode_tps 100000" in out
    assert out.index("Show the gate's verdict") < out.index("Fail when the gate failed")
    assert json.loads((report_dir / "latest.json").read_text())["passed"] is False


def test_a_real_server_killed_while_loading_fails_the_gate_within_seconds(tmp_path):
    port = free_port()
    server = start_server(tmp_path, port)
    try:
        gate = subprocess.Popen(
            [
                SYSTEM_PYTHON,
                str(CLI),
                "--url",
                f"http://127.0.0.1:{port:d}",
                "--pid",
                str(server.pid),
                "--log",
                str(tmp_path / "server.log"),
                "--model",
                str(MODEL),
                "--ready-timeout",
                "300",
                "--json",
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=HOST_PYTHON_ENV,
        )
        time.sleep(2.0)  # transformers serve needs about 6 s to load: it is still loading
        assert server.poll() is None
        os.killpg(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = gate.communicate(timeout=60)
        detected = time.monotonic() - killed
    finally:
        stop_server(server)
    assert gate.returncode == 1, out + err
    report = json.loads(out)
    assert report["phase"] == "loading"
    assert report["reasons"][0].startswith(f"process {server.pid:d} exited")
    assert detected < 3.0, f"crash noticed after {detected:.1f} s"
