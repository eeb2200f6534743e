"""Shared pytest setup: the repository root and the controller cache locations."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

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
