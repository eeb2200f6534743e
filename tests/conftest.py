"""Shared pytest setup: the repository root and the controller cache locations."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# Filter plugins and the tools' package (tools/lib/deploytools) are plain Python modules:
# make them importable.
for sub in ("filter_plugins", "tools/lib"):
    sys.path.insert(0, str(REPO / sub))


def load_tool(name: str) -> ModuleType:
    """Import the executable ``tools/<name>`` (a script without .py) as a module.

    For the tools whose logic still lives in the executable; the others are imported from
    ``deploytools``. One module object per tool, so its classes compare equal across tests.
    """
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(REPO / "tools" / name))
    if loader.name in sys.modules:
        return sys.modules[loader.name]
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The controller cache (DEPLOY_CACHE_DIR, default <repo>/.cache) built by make."""
    return Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))


# The health gate tests' fakes (tests/test_gate_support.py) as fixtures, shared by name.
@pytest.fixture
def fake_server():
    """Factory: ``fake_server(**scenario)`` returns a started :class:`FakeLLMServer`."""
    from test_gate_support import FakeLLMServer

    servers: list[FakeLLMServer] = []

    def make(**scenario: Any) -> FakeLLMServer:
        server = FakeLLMServer(**scenario).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """Fake systemd tools first on PATH (only for this test)."""
    from test_gate_support import FakeSystemd

    fake = FakeSystemd(tmp_path / "systemd")
    monkeypatch.setenv("FAKE_SYSTEMD", str(fake.root))
    monkeypatch.setenv("PATH", "{}:{}".format(fake.bin, os.environ.get("PATH", "")))
    return fake
