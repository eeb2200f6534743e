"""tools/health-gate: --json output and exit codes 0 pass / 1 fail / 2 usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gate_fakes import CLI

# The fake server streams "tok tok ..." and has no completions endpoint: the correctness probe is
# tested against fakes of its own (test_gate_correctness.py) and the real CPU engine (test_gate_rehearsal.py).
FAST = [
    "--correctness",
    "off",
    "--warmup",
    "1",
    "--requests",
    "2",
    "--max-tokens",
    "16",
    "--poll-interval",
    "0.2",
    "--request-timeout",
    "5",
    "--health-timeout",
    "2",
    "--quiet",
]


def run_cli(*args: str, env: dict = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.pop("HEALTH_GATE_API_KEY", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(CLI), *args], capture_output=True, text=True, timeout=120, env=full_env)


def test_pass_prints_the_report_and_exits_0(fake_server, tmp_path):
    server = fake_server()
    proc = run_cli(
        "--url",
        server.url,
        *FAST,
        "--json",
        "--min-decode-tps",
        "1",
        "--max-ttft",
        "5",
        "--report-dir",
        str(tmp_path / "gate"),
        "--meta",
        "model_revision=abc123",
        "--meta",
        "unit_sha256=0f0f",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is True
    assert report["metadata"] == {"model_revision": "abc123", "unit_sha256": "0f0f"}
    assert report["settings"]["prompts"][0] == "py-log-top-errors"  # the role's prompts by default
    stored = sorted(os.listdir(tmp_path / "gate"))
    assert len(stored) == 2 and "latest.json" in stored
    assert report["report_path"].startswith(str(tmp_path / "gate"))


def test_threshold_miss_exits_1_with_the_reason(fake_server):
    server = fake_server()
    proc = run_cli("--url", server.url, *FAST, "--json", "--min-decode-tps", "100000")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is False
    assert "is below min_decode_tps 100000" in report["reasons"][0]


def test_text_mode_prints_the_summary_and_evidence(fake_server):
    server = fake_server(health=503)
    proc = run_cli("--url", server.url, *FAST, "--ready-timeout", "1")
    assert proc.returncode == 1
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"gate FAIL (warming): server at {server.url} not ready after 1 s")


def test_progress_goes_to_stderr_not_stdout(fake_server):
    server = fake_server()
    args = [a for a in FAST if a != "--quiet"]
    proc = run_cli("--url", server.url, *args, "--json")
    assert proc.returncode == 0
    json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert "ready" in proc.stderr and "measuring: 2 requests" in proc.stderr


def test_bad_thresholds_are_usage_errors_exit_2_before_any_request(fake_server):
    server = fake_server()
    proc = run_cli("--url", server.url, *FAST, "--json", "--min-decode-tps", "-3", "--requests", "0")
    assert proc.returncode == 2
    out = json.loads(proc.stdout)
    assert out["usage"] is True
    assert "min_decode_tps must be 0 (no check) or positive" in out["error"]
    assert "requests must be at least 1" in out["error"]
    assert server.requests == []


def test_argparse_errors_exit_2_and_stay_json():
    proc = run_cli("--requests", "many", "--json")
    assert proc.returncode == 2
    assert "invalid int value" in json.loads(proc.stdout)["error"]
    proc = run_cli("--unit", "x", "--pid", "3")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_api_key_comes_from_the_environment_and_is_never_printed(fake_server, tmp_path):
    server = fake_server()
    proc = run_cli("--url", server.url, *FAST, "--json", env={"HEALTH_GATE_API_KEY": "sk-env-999"})
    assert proc.returncode == 0
    assert server.chat_requests()[0]["headers"]["Authorization"] == "Bearer sk-env-999"
    assert "sk-env-999" not in proc.stdout + proc.stderr
    key_file = tmp_path / "key"
    key_file.write_text("sk-file-777\n")
    proc = run_cli("--url", server.url, *FAST, "--json", "--api-key-file", str(key_file))
    assert proc.returncode == 0
    assert server.chat_requests()[-1]["headers"]["Authorization"] == "Bearer sk-file-777"
    assert json.loads(proc.stdout)["settings"]["api_key_set"] is True
