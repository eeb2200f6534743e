"""Paths and shared test data of the launch-plan tests (plain module, not a pytest plugin)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from deploytools.launch_plan.common import SETTINGS

REPO = Path(__file__).resolve().parents[2]
CHECK_SCRIPT = REPO / "roles" / "inference_server" / "files" / "check-launch-args.py"
BUILD_CHECK_VENV = REPO / "tools" / "build-sglang-check-venv"
FLAG_TABLES = REPO / "tools" / "deploytools" / "launch_plan" / "flags"


def _default_check_versions() -> tuple[str, ...]:
    """The SGLang versions make test checks: tools/build-sglang-check-venv's ``default_versions=(...)``."""
    match = re.search(r"^default_versions=\(([^)]*)\)$", BUILD_CHECK_VENV.read_text(), re.MULTILINE)
    assert match, f"{BUILD_CHECK_VENV} has no default_versions=(...) line"
    return tuple(match.group(1).split())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# Every SGLang version with a check venv lock (tests/locks/sglang-check-VERSION.txt); make test
# checks SGLANG_CHECK_VERSIONS, `make sglang-check-newest` the rest (pytest marker sglang_newest).
SGLANG_LOCKED_VERSIONS = tuple(
    sorted(
        (p.stem.removeprefix("sglang-check-") for p in (REPO / "tests" / "locks").glob("sglang-check-*.txt")),
        key=_version_key,
    )
)
SGLANG_CHECK_VERSIONS = _default_check_versions()
SGLANG_NEWEST_VERSIONS = tuple(v for v in SGLANG_LOCKED_VERSIONS if v not in SGLANG_CHECK_VERSIONS)
QWEN_CONFIG = REPO / "files" / "models" / "qwen3.6-27b.config.json"
TINY_CONFIG = REPO / "tests" / "launch_plan" / "fixtures" / "tiny-qwen3.5-flat.config.json"

# The origin story's by-hand launch (docs/launch-plan.md, the flags below), without --model-path:
#   python3 -m sglang.launch_server --model-path ... --speculative-algorithm NEXTN
#   --speculative-num-draft-tokens 1 --tensor-parallel-size 2 --port 30000 --host 0.0.0.0
#   --trust-remote-code --dtype bfloat16
# fmt: off
ORIGIN_FLAGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "1",
                "--tensor-parallel-size", "2", "--port", "30000", "--host", "0.0.0.0", "--trust-remote-code",
                "--dtype", "bfloat16"]
# fmt: on
# The same flags given to the plan as inference_server_overrides (host and port have their own variables).
ORIGIN_OVERRIDES = {
    "--speculative-algorithm": "NEXTN",
    "--speculative-num-draft-tokens": 1,
    "--tensor-parallel-size": 2,
    "--trust-remote-code": True,
    "--dtype": "bfloat16",
}
# What the plan says about them, before anything reaches a host.
ORIGIN_REFUSAL = (
    "speculative decoding (inference_server_overrides['--speculative-algorithm']: NEXTN) on the hybrid model "
    "Qwen3_5ForConditionalGeneration with the radix cache needs --mamba-scheduler-strategy extra_buffer and "
    "SGLANG_ENABLE_SPEC_V2=1, not no_buffer (the default auto), and SGLang refuses it at start-up: set "
    "inference_server_speculative_algorithm rather than inference_server_overrides so the plan derives "
    "extra_buffer, or add '--mamba-scheduler-strategy: extra_buffer' to inference_server_overrides, or set "
    "inference_server_disable_radix_cache to true."
)


def cache_dir() -> Path:
    """``$DEPLOY_CACHE_DIR`` as the Makefile exports it, else ``<repo>/.cache``."""
    return Path(os.environ.get("DEPLOY_CACHE_DIR") or REPO / ".cache")


def load_yaml(relpath: str) -> Any:
    """A YAML file of the repository."""
    return yaml.safe_load((REPO / relpath).read_text())


def setting_variables(group: Mapping[str, Any]) -> dict[str, Any]:
    """The settings' role variables a group_vars file sets (``inference_server_<setting>: value``)."""
    return {s.variable: group[s.variable] for s in SETTINGS if s.variable in group}


def profile_settings(group: Mapping[str, Any]) -> dict[str, Any]:
    """The same by setting, as the launch_plan filter gets them (the role's vars/main.yml composes them)."""
    return {s.key: group[s.variable] for s in SETTINGS if s.variable in group}


def launch_plan_tool(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run tools/launch-plan with ``args`` (``cache``: its DEPLOY_CACHE_DIR)."""
    env = dict(os.environ)
    if cache is not None:
        env["DEPLOY_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [str(REPO / "tools" / "launch-plan"), *args], capture_output=True, text=True, env=env, check=False
    )
