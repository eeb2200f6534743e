"""The API key end to end where it can be proved without a GPU.

* the launch plan hands SGLang the key in a file (``--config``), never the key itself, and
  refuses the flags that would put a key in the unit file or argv;
* transformers serve (no API key support) refuses a key unless the operator says it knows;
* the health gate authenticates against a server that enforces a Bearer token the way
  SGLang 0.5.11 does (sglang/srt/utils/auth.py: every path but /health* and /metrics), and
  fails, naming the 401, without the key;
* tools/api-key-check (the check for the GPU acceptance run) passes against an enforcing
  server and fails against one that does not enforce, and never prints the key.

* with a key, SGLang logs through a configuration that keeps its start-up dump of the server
  arguments (the key among them) out of the journal; SGLang's own ``configure_logger``
  (real SGLang 0.5.11, the check venv) applies it.

SGLang's own enforcement needs a GPU to start: bench/results/gpu_api_key.md is that run
(tools/api-key-check against real SGLang started from the keyed plan, and the journal).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deploytools.launch_plan.errors import PlanError
from deploytools.launch_plan.plan import build_plan
from gate_fakes import base_options, llm_gate

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-unit-test-key-4f1c9a"
QWEN = json.loads((REPO / "files/models/qwen3.6-27b.config.json").read_text())
TINY = json.loads((REPO / "tests/launch_plan/fixtures/tiny-qwen3.5-flat.config.json").read_text())
GPUS = [{"index": i, "name": "NVIDIA RTX A6000", "memory_mib": 49140} for i in range(2)]
SGLANG = {"tensor_parallel_size": 2, "dtype": "bfloat16", "speculative_algorithm": "NEXTN"}
KEY_FILE = "/etc/inference-server/api-key.yaml"
LOG_FILE = "/etc/inference-server/sglang-logging.json"


def sglang_plan(**kw):
    """ct129's plan with keyword overrides."""
    # fmt: off
    args = dict(engine="sglang", engine_version="0.5.11", venv_dir="/root/ml-env.d/abc", model_path="/m",
                host="0.0.0.0", port=30000, gpus=GPUS, weights_bytes=55566139392, settings=SGLANG)
    # fmt: on
    args.update(kw)
    return build_plan(QWEN, **args)


def transformers_plan(**kw):
    """The rehearsal plan with keyword overrides."""
    # fmt: off
    args = dict(engine="transformers", engine_version="5.6.0", venv_dir="/opt/ml-env.d/abc", model_path="/m",
                host="127.0.0.1", port=8000, settings={"device": "cpu"})
    # fmt: on
    args.update(kw)
    return build_plan(TINY, **args)


def test_sglang_reads_the_key_from_a_file_named_by_config():
    plan = sglang_plan(api_key_file=KEY_FILE)
    assert plan["argv"][-2:] == ["--config", KEY_FILE]
    assert any(KEY_FILE in note and "--config" in note for note in plan["notes"])
    without = sglang_plan()
    assert "--config" not in without["argv"]
    assert plan["argv"][:-2] == without["argv"]


def test_with_a_key_sglang_logs_through_a_configuration_without_its_argument_dump():
    plan = sglang_plan(api_key_file=KEY_FILE, logging_config_file=LOG_FILE)
    assert plan["env"]["SGLANG_LOGGING_CONFIG_PATH"] == LOG_FILE
    config = plan["logging_config"]
    assert config["root"]["level"] == "INFO"
    assert config["loggers"]["sglang.srt.entrypoints.engine"] == {"level": "WARNING"}
    assert any(LOG_FILE in note and "API key" in note for note in plan["notes"])
    debug = sglang_plan(api_key_file=KEY_FILE, logging_config_file=LOG_FILE, overrides={"--log-level": "debug"})
    assert debug["logging_config"]["root"]["level"] == "DEBUG"
    for keyless in (sglang_plan(logging_config_file=LOG_FILE), sglang_plan(api_key_file=KEY_FILE)):
        assert "logging_config" not in keyless and "SGLANG_LOGGING_CONFIG_PATH" not in keyless["env"]
    assert any("will log" in note for note in sglang_plan(api_key_file=KEY_FILE)["notes"])


def test_an_operators_own_logging_configuration_is_kept_and_named():
    plan = sglang_plan(
        api_key_file=KEY_FILE,
        logging_config_file=LOG_FILE,
        environment={"SGLANG_LOGGING_CONFIG_PATH": "/etc/mine.json"},
    )
    assert plan["env"]["SGLANG_LOGGING_CONFIG_PATH"] == "/etc/mine.json"
    assert "logging_config" not in plan
    assert any("sglang.srt.entrypoints.engine" in note and "/etc/mine.json" not in note for note in plan["notes"])


def test_sglangs_own_logger_setup_drops_the_argument_dump_and_keeps_the_rest(sglang_check_venv, tmp_path):
    """SGLang 0.5.11 still dumps its arguments from sglang.srt.entrypoints.engine at INFO, and
    its configure_logger, given the plan's file, drops exactly that."""
    engine_py = next((sglang_check_venv / "lib").glob("python3*/site-packages/sglang/srt/entrypoints/engine.py"))
    source = engine_py.read_text()
    assert 'logger.info(f"{server_args=}")' in source and "logger = logging.getLogger(__name__)" in source
    config = tmp_path / "sglang-logging.json"
    config.write_text(json.dumps(sglang_plan(api_key_file=KEY_FILE, logging_config_file=str(config))["logging_config"]))
    script = (
        "import logging, types\n"
        "from sglang.srt.utils.common import configure_logger\n"
        "configure_logger(types.SimpleNamespace(log_level='info'))\n"
        f"logging.getLogger('sglang.srt.entrypoints.engine').info(\"server_args=ServerArgs(api_key='{KEY}')\")\n"
        "logging.getLogger('sglang.srt.managers.scheduler').info('scheduler line at info')\n"
        "logging.getLogger('sglang.srt.entrypoints.engine').warning('engine line at warning')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    done = subprocess.run(
        [str(sglang_check_venv / "bin/python"), "-c", script],
        capture_output=True,
        text=True,
        env={**env, "SGLANG_LOGGING_CONFIG_PATH": str(config)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert KEY not in done.stderr + done.stdout
    assert "scheduler line at info" in done.stderr and "engine line at warning" in done.stderr
    # Without the configuration SGLang's default setup prints the dump, key and all.
    bare = subprocess.run(
        [str(sglang_check_venv / "bin/python"), "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert KEY in bare.stderr


@pytest.mark.parametrize(
    "flag, expected",
    [
        (
            "--api-key",
            "inference_server_overrides['--api-key'] would put a secret in the unit file and in the server's "
            "argv, which every user of the host can read: remove it and set inference_server_api_key "
            "(vaulted) instead.",
        ),
        (
            "--admin-api-key",
            "inference_server_overrides['--admin-api-key'] would put a secret in the unit file and in "
            "the server's argv, which every user of the host can read: remove it and set "
            "inference_server_admin_api_key (vaulted) instead.",
        ),
        (
            "--config",
            "inference_server_overrides['--config']: the plan passes the API key file with --config, and "
            "SGLang takes only one: remove it and give those flags through their inference_server_<setting> "
            "variables or inference_server_overrides.",
        ),
    ],
)
def test_overrides_that_would_carry_a_key_are_refused(flag, expected):
    with pytest.raises(PlanError) as err:
        sglang_plan(overrides={flag: KEY})
    assert str(err.value) == expected
    assert KEY not in str(err.value)


def test_transformers_refuses_a_key_it_cannot_enforce():
    with pytest.raises(PlanError) as err:
        transformers_plan(api_key_file=KEY_FILE)
    assert str(err.value) == (
        "inference_server_api_key is set, but transformers serve has no API key support and would leave /v1/* "
        "open: leave it empty for this engine, or set inference_server_allow_unenforced_api_key to true to "
        "rehearse the key's path unenforced."
    )
    plan = transformers_plan(api_key_file=KEY_FILE, allow_unenforced_api_key=True)
    assert "--config" not in plan["argv"]
    assert any("NOT protected" in note for note in plan["notes"])


def test_the_gate_authenticates_and_fails_without_the_key(fake_server):
    server = fake_server(api_key=KEY)
    passed = llm_gate.run_gate(base_options(server.url, api_key=KEY, min_decode_tps=1))
    assert passed["passed"] is True, passed["reasons"]
    chats = server.chat_requests()
    assert chats and all(r["headers"].get("Authorization") == f"Bearer {KEY}" for r in chats)
    assert KEY not in json.dumps(passed)

    refused = llm_gate.run_gate(base_options(server.url, min_decode_tps=1))
    assert refused["passed"] is False
    assert refused["reasons"] == [
        "the server refused /v1/models with HTTP 401 without an API key: set health_gate_api_key (it defaults to "
        "inference_server_api_key) to the server's API key"
    ], refused["reasons"]
    wrong = llm_gate.run_gate(base_options(server.url, api_key=KEY + "-old", min_decode_tps=1))
    assert "HTTP 401 with the API key the gate sent" in wrong["reasons"][0]
    assert KEY not in json.dumps(wrong)
    health = [r for r in server.requests if r["path"] == "/health"]
    assert health, "the gate never asked /health"


def run_check(url: str, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess:
    """tools/api-key-check with the key in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "HEALTH_GATE_API_KEY"}
    if key is not None:
        env["HEALTH_GATE_API_KEY"] = key
    return subprocess.run(
        [sys.executable, str(REPO / "tools/api-key-check"), "--url", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_api_key_check_passes_where_the_key_is_enforced(fake_server):
    server = fake_server(api_key=KEY)
    proc = run_check(server.url, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert [c["status"] for c in result["checks"]] == [401, 401, 200, 200]
    assert KEY not in proc.stdout + proc.stderr


def test_api_key_check_fails_where_the_key_is_not_enforced(fake_server):
    server = fake_server()
    proc = run_check(server.url)
    assert proc.returncode == 1
    assert "FAIL GET /v1/models without a key is refused: HTTP 200 (expected 401 or 403)" in proc.stdout
    assert "api key NOT as expected" in proc.stdout
    assert KEY not in proc.stdout + proc.stderr


def test_api_key_check_reads_the_roles_key_file(fake_server, tmp_path):
    server = fake_server(api_key=KEY)
    key_file = tmp_path / "api-key.yaml"
    key_file.write_text(f'# Managed by Ansible\napi-key: "{KEY}"\n')
    assert run_check(server.url, "--api-key-file", str(key_file), key=None).returncode == 0
    assert run_check(server.url, key=None).returncode == 2
