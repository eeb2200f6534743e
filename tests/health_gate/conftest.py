"""Fixtures of the health gate tests (tests/health_gate: roles/health_gate, tools/health-gate).

The fakes themselves are in tests/shared/gate_fakes.py (the API key's and the drain's tests
use them too); ``fake_server`` is a fixture of the root conftest. The rehearsal tests need
the CPU venv and the tiny model under ``$DEPLOY_CACHE_DIR`` (``make tools-venv model``).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """Fake systemd tools first on PATH (only for this test)."""
    from gate_fakes import FakeSystemd

    fake = FakeSystemd(tmp_path / "systemd")
    monkeypatch.setenv("FAKE_SYSTEMD", str(fake.root))
    monkeypatch.setenv("PATH", "{}:{}".format(fake.bin, os.environ.get("PATH", "")))
    return fake
