"""Fixtures of the launch-plan tests (tests/launch_plan: deploytools.launch_plan and its filters, the engines' own
checks, the API key, the systemd rendering).

The engine venvs are real: ``sglang_check_venv`` builds ``$DEPLOY_CACHE_DIR/venvs/sglang-check-0.5.11``
(the version ct129 runs) with tools/build-sglang-check-venv (a no-op once built), ``sglang_venv``
is the check venv of each SGLang version with a lock, one test per version, and
``transformers_venv`` uses the CPU profile's venv from ``make tools-venv`` and builds it when it is
missing. A test that needs one of them fails when it cannot be built; it never skips.

Versions: the ones tools/build-sglang-check-venv builds by default (SGLANG_CHECK_VERSIONS, which
make test checks) run always; the others (SGLANG_NEWEST_VERSIONS: 0.5.23, whose venv make test
does not build) carry the marker ``sglang_newest`` and are deselected (reported as deselected,
never as passed) unless ``-m`` names the marker, as ``make sglang-check-newest`` does.

The check venvs' inputs, tests/locks/sglang-check-VERSION.txt and tests/sglang_check/, stay at the
top of tests/: tools/build-sglang-check-venv reads them there, and its stamp hashes the script itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from deploytools.launch_plan import plan as plan_module
from launch_plan_cases import (
    BUILD_CHECK_VENV,
    CHECK_SCRIPT,
    QWEN_CONFIG,
    REPO,
    SGLANG_CHECK_VERSIONS,
    SGLANG_NEWEST_VERSIONS,
    TINY_CONFIG,
    cache_dir,
    load_yaml,
    profile_settings,
)

NEWEST_MARKER = "sglang_newest"
CHECK_FORKSERVER = Path(__file__).with_name("check_forkserver.py")


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker of the tests that need a check venv make test does not build."""
    config.addinivalue_line(
        "markers",
        f"{NEWEST_MARKER}: needs the check venv of an SGLang version make test does not build "
        "(SGLANG_NEWEST_VERSIONS); deselected unless -m names it (make sglang-check-newest)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the sglang_newest tests unless ``-m`` names the marker: deselected, not skipped or passed."""
    if NEWEST_MARKER in (config.option.markexpr or ""):
        return
    dropped = [item for item in items if item.get_closest_marker(NEWEST_MARKER)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker(NEWEST_MARKER)]


@pytest.fixture(scope="session")
def launch_plan() -> ModuleType:
    """The plan's entry point, deploytools.launch_plan.plan (build_plan, PlanError, its parts)."""
    return plan_module


@pytest.fixture(scope="session")
def plan_filters() -> dict[str, Callable[..., Any]]:
    """The Ansible filters of filter_plugins/launch_plan.py, loaded from the file as Ansible does."""
    spec = importlib.util.spec_from_file_location(
        "ansible_launch_plan_filters", REPO / "filter_plugins" / "launch_plan.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


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
        "settings": profile_settings(group),
        "overrides": {},
        "cache_dir": "/var/cache/inference-server",
    }


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)


def build_sglang_check_venv(version: str) -> Path:
    """The check venv with real SGLang ``version`` (built once by tools/build-sglang-check-venv, then cached)."""
    proc = _run([str(BUILD_CHECK_VENV), version], env={**os.environ, "DEPLOY_CACHE_DIR": str(cache_dir())})
    assert proc.returncode == 0, f"tools/build-sglang-check-venv {version} failed:\n{proc.stdout}\n{proc.stderr}"
    venv = cache_dir() / "venvs" / f"sglang-check-{version}"
    assert (venv / "bin" / "python").exists()
    return venv


@dataclass(frozen=True)
class SGLangVenv:
    """One SGLang version's check venv."""

    version: str
    path: Path


@pytest.fixture(scope="session")
def sglang_check_venv() -> Path:
    """The venv with real SGLang 0.5.11, the version ct129 runs (built once, then cached)."""
    return build_sglang_check_venv("0.5.11")


@pytest.fixture(
    scope="session",
    params=[
        *SGLANG_CHECK_VERSIONS,
        *(pytest.param(v, marks=getattr(pytest.mark, NEWEST_MARKER)) for v in SGLANG_NEWEST_VERSIONS),
    ],
)
def sglang_venv(request: pytest.FixtureRequest) -> SGLangVenv:
    """The check venv of every SGLang version with a lock, one test per version (its id is the version)."""
    return SGLangVenv(request.param, build_sglang_check_venv(request.param))


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


class CheckServers:
    """One check_forkserver.py per (venv, engine, environment): the engine imported once, each check forked."""

    def __init__(self) -> None:
        self.servers: dict[tuple[str, str, tuple[tuple[str, str], ...]], subprocess.Popen[str]] = {}

    def run(self, venv: Path, engine: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
        """Run check-launch-args.py with ``args`` in a fork of the matching server: rc, stdout, stderr."""
        key = (str(venv), engine, tuple(sorted(env.items())))
        server = self.servers.get(key)
        if server is None or server.poll() is not None:
            server = subprocess.Popen(
                [str(venv / "bin" / "python"), str(CHECK_FORKSERVER), str(CHECK_SCRIPT), engine],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            self.servers[key] = server
        assert server.stdin and server.stdout
        server.stdin.write(json.dumps({"argv": args}) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        assert answer, f"check_forkserver.py in {venv} ended without answering (exit {server.wait()})"
        return json.loads(answer)

    def close(self) -> None:
        """Stop every server (each ends when its stdin closes)."""
        for server in self.servers.values():
            if server.stdin:
                server.stdin.close()
            server.wait(timeout=60)


@pytest.fixture(scope="session")
def check_servers() -> Iterator[CheckServers]:
    """The session's check servers, stopped at its end."""
    servers = CheckServers()
    yield servers
    servers.close()


ScriptRunner = Callable[..., "dict[str, Any]"]


@pytest.fixture(scope="session")
def check_script(check_servers: CheckServers) -> ScriptRunner:
    """Run check-launch-args.py in a venv: ``check_script(venv, engine, args, env=)`` -> {rc, stdout, stderr}.

    The script runs whole in a process of its own, with the venv's python and the test process's
    environment less SGLANG_*, HF_* and PYTEST_* plus ``env``, forked from a server that imported the
    engine once with that same environment (check_forkserver.py).
    """

    def run(venv: Path, engine: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        # PYTEST_CURRENT_TEST names each test: left out, one server answers every test of an environment.
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "HF_", "PYTEST_"))}
        full_env.update(env or {})
        return check_servers.run(venv, engine, args, full_env)

    return run


@pytest.fixture(scope="session")
def run_check(check_script: ScriptRunner) -> CheckRunner:
    """Check a plan's argv in a venv: ``run_check(venv, engine, argv, env=, gpus=)`` -> (exit status, result)."""

    def run(
        venv: Path, engine: str, argv: list[str], env: dict[str, str] | None = None, gpus: int = 0
    ) -> tuple[int, dict[str, Any]]:
        proc = check_script(venv, engine, ["--engine", engine, "--gpus", str(gpus), "--", *argv], env)
        lines = proc["stdout"].strip().splitlines()
        tail = proc["stderr"][-3000:]
        assert len(lines) == 1, f"expected one JSON line on stdout, got:\n{proc['stdout']}\nstderr:\n{tail}"
        return proc["rc"], json.loads(lines[0])

    return run


@pytest.fixture()
def plan_for(
    launch_plan: ModuleType, ct129_kwargs: dict[str, Any], model_dir: Callable[..., Path]
) -> Callable[..., Any]:
    """The ct129 plan, with the check venv as its venv and a directory holding the real config.json.

    ``plan_for(venv, config=None, **changes)``: the plan is for the SGLang version of the check venv
    (``.../sglang-check-VERSION``) unless ``engine_version`` is among the changes.
    """

    def make(venv: Path, config: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
        config = config or json.loads(QWEN_CONFIG.read_text())
        if Path(venv).name.startswith("sglang-check-"):
            changes.setdefault("engine_version", Path(venv).name.removeprefix("sglang-check-"))
        kwargs = dict(ct129_kwargs, venv_dir=str(venv), model_path=str(model_dir(config)), **changes)
        return launch_plan.build_plan(config, **kwargs)

    return make


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
