"""Tests of the ml_env role's install step (tests/ml_env): hashed locks and pip's
``--require-hashes``. ``make_wheel`` builds tiny pure-Python wheels offline, so pip's hash
check runs against files whose sha256 the test knows."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any", body: str = "") -> Path:
    """A minimal valid wheel ``<name>-<version>-<tag>.whl`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n{body}".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for member, data in files.items():
            whl.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), data)
    return path


@pytest.fixture
def make_wheel() -> Callable[..., Path]:
    """``make_wheel(folder, name, version[, tag])`` -> the wheel's path."""
    return build_wheel
