"""Shared pytest setup: the repository root and the controller cache locations."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Filter plugins and role helpers are plain Python modules: make them importable.
for sub in ("filter_plugins",):
    sys.path.insert(0, str(REPO / sub))


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The controller cache (DEPLOY_CACHE_DIR, default <repo>/.cache) built by make."""
    return Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))
