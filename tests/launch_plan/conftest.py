"""Fixtures of the launch-plan tests (tests/launch_plan: filter_plugins/launch_plan*.py, the engines' own
checks, the API key, the systemd rendering).

The engine venvs are real: ``sglang_check_venv`` builds ``$DEPLOY_CACHE_DIR/venvs/sglang-check``
with tools/build-sglang-check-venv (a no-op once built), ``transformers_venv`` uses the CPU
profile's venv from ``make tools-venv`` and builds it when it is missing. A test that needs
one of them fails when it cannot be built; it never skips.

The check venv's inputs, tests/locks/sglang-check.txt and tests/sglang_check/, stay at the top of
tests/: tools/build-sglang-check-venv reads them there, and its stamp hashes the script itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from launch_plan_cases import CHECK_SCRIPT, QWEN_CONFIG, REPO, TINY_CONFIG, cache_dir, load_yaml


@pytest.fixture(scope="session")
def launch_plan() -> ModuleType:
    """filter_plugins/launch_plan.py, imported as a module."""
    path = REPO / "filter_plugins" / "launch_plan.py"
    spec = importlib.util.spec_from_file_location("launch_plan", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["launch_plan"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def qwen_config() -> dict[str, Any]:
    """Qwen3.6-27B's real config.json (nested: text_config + vision_config)."""
    return json.loads(QWEN_CONFIG.read_text())


@pytest.fixture(scope="session")
def tiny_config() -> dict[str, Any]:
    """The flat config.json of the CPU rehearsal model."""
    return json.loads(TINY_CONFIG.read_text())


@pytest.fixture(scope="session")
def ct129() -> dict[str, Any]:
    """What is known about ct129 offline, and its profile's settings, from the repository."""
    offline = load_yaml("host_vars/ct129.yml")["offline_plan"]
    group = load_yaml("group_vars/sglang_servers.yml")
    return {"offline": offline, "group": group}


@pytest.fixture()
def ct129_kwargs(ct129: dict[str, Any]) -> dict[str, Any]:
    """launch_plan keyword arguments for ct129 as a deploy would pass them."""
    group, offline = ct129["group"], ct129["offline"]
    return {
        "engine": group["inference_server_engine"],
        "engine_version": offline["engine_version"],
        "venv_dir": "/root/ml-env.d/0123456789ab",
        "model_path": "/root/models/Qwen3.6-27B",
        "host": group["inference_server_host"],
        "port": group["inference_server_port"],
        "gpus": offline["gpus"],
        "weights_bytes": offline["weights_bytes"],
        "settings": dict(group["inference_server_settings"]),
        "overrides": {},
        "cache_dir": "/var/cache/inference-server",
    }


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)


@pytest.fixture(scope="session")
def sglang_check_venv() -> Path:
    """The venv with real SGLang 0.5.11 (built once, then cached)."""
    proc = _run(
        [str(REPO / "tools" / "build-sglang-check-venv")], env={**os.environ, "DEPLOY_CACHE_DIR": str(cache_dir())}
    )
    assert proc.returncode == 0, f"tools/build-sglang-check-venv failed:\n{proc.stdout}\n{proc.stderr}"
    venv = cache_dir() / "venvs" / "sglang-check"
    assert (venv / "bin" / "python").exists()
    return venv


@pytest.fixture(scope="session")
def transformers_venv() -> Path:
    """The CPU profile's venv (transformers 5.6.0), from ``make tools-venv``."""
    venv = cache_dir() / "venvs" / "transformers-cpu"
    if not (venv / ".installed").exists():
        make = shutil.which("make")
        assert make, "make is needed to build the transformers-cpu venv"
        proc = _run([make, "-C", str(REPO), "tools-venv", f"CACHE={cache_dir()}"])
        assert proc.returncode == 0, f"make tools-venv failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (venv / "bin" / "python").exists()
    return venv


CheckRunner = Callable[..., "tuple[int, dict[str, Any]]"]


@pytest.fixture(scope="session")
def run_check() -> CheckRunner:
    """Run check-launch-args.py with a venv's python: ``run_check(venv, engine, argv, env=, gpus=)``."""

    def run(
        venv: Path, engine: str, argv: list[str], env: dict[str, str] | None = None, gpus: int = 0
    ) -> tuple[int, dict[str, Any]]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "HF_"))}
        full_env.update(env or {})
        proc = _run(
            [str(venv / "bin" / "python"), str(CHECK_SCRIPT), "--engine", engine, "--gpus", str(gpus), "--", *argv],
            env=full_env,
        )
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, f"expected one JSON line on stdout, got:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
        return proc.returncode, json.loads(lines[0])

    return run


@pytest.fixture()
def model_dir(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Make a model directory holding ``config.json`` (what SGLang's validation reads)."""

    made: list[Path] = []

    def make(config: dict[str, Any]) -> Path:
        path = tmp_path / f"model-{len(made)}"
        path.mkdir()
        made.append(path)
        (path / "config.json").write_text(json.dumps(config, indent=1))
        return path

    return make
