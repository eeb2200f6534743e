"""Keep the payloads Ansible builds for its modules from one run to the next (test suites only).

Before each module runs, ansible-playbook builds its payload: it parses the module and every
module_utils file it imports (recursively) and zips them. It keeps what it built in a directory of
its own run, which goes when the run ends, so every ansible-playbook run builds each module it uses
again: 3 to 4 of a changed deploy's 18 controller CPU-seconds on the 2-core machine
(docs/performance.md), and make test runs a few hundred playbooks.

This callback (it prints nothing) points that directory at one that outlives the run, one per
module source, path and module_utils state: the key is the sha256 of the module's bytes and path,
of the Ansible versions, and of every file in the module_utils directories and collections outside
the installed packages. An edited module or module_utils file gets a new key, so a payload is never
older than its sources (tests/tools/test_ansiballz_controller_cache.py edits one and shows it). What
runs on the host is the payload Ansible would build; only the building is skipped.

Enabled where ``ANSIBALLZ_CONTROLLER_CACHE`` names the directory, with
``ANSIBLE_CALLBACK_PLUGINS`` naming this folder and ``ANSIBLE_CALLBACKS_ENABLED=ansiballz_cache``:
the Makefile's test targets set the three. ``make demo`` and the benchmarks run a stock Ansible.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from ansible import constants
from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import module_utils_loader
from ansible.release import __version__ as ANSIBLE_CORE_VERSION
from ansible.utils.collection_loader import AnsibleCollectionConfig

DOCUMENTATION = """
name: ansiballz_cache
type: aggregate
short_description: keep the payloads Ansible builds for its modules across runs (test suites)
description:
  - Points the run's module payload cache at a directory that outlives the run, one per module source,
    path and module_utils state, when ANSIBALLZ_CONTROLLER_CACHE names it. Prints nothing.
requirements:
  - ansible-core 2.19 (it wraps ansible.executor.module_common._find_module_utils)
"""

CACHE_ENV = "ANSIBALLZ_CONTROLLER_CACHE"
# Where pip installs packages: their files change only with their versions, which the key holds.
INSTALLED = tuple({str(Path(sysconfig.get_path(name)).resolve()) for name in ("purelib", "platlib")})


def _versions() -> bytes:
    """ansible-core's version and the ansible package's (its collections), if installed."""
    try:
        collections = metadata.version("ansible")
    except metadata.PackageNotFoundError:
        collections = "none"
    return f"{ANSIBLE_CORE_VERSION}\0{collections}\0{sys.version_info[:2]}".encode()


def _outside_installed(paths: list[str]) -> Iterator[Path]:
    """The existing directories of ``paths`` that are not inside an installed package."""
    for path in paths:
        resolved = Path(path).resolve()
        if resolved.is_dir() and not str(resolved).startswith(INSTALLED):
            yield resolved


def _module_utils_dirs() -> list[Path]:
    """The module_utils directories a payload can take files from, outside the installed packages."""
    dirs = list(_outside_installed(module_utils_loader._get_paths()))
    for root in _outside_installed(list(AnsibleCollectionConfig.collection_paths)):
        dirs.extend(sorted(root.glob("ansible_collections/*/*/plugins/module_utils")))
    return dirs


def module_utils_fingerprint() -> str:
    """The sha256 of the versions and of every file (name and bytes) in the module_utils directories."""
    digest = hashlib.sha256(_versions())
    for directory in _module_utils_dirs():
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cached(find_module_utils: Callable[..., Any], root: str, fingerprint: str) -> Callable[..., Any]:
    """``find_module_utils`` with Ansible's per-run payload directory replaced by one under ``root``
    keyed by the module's source, its path and ``fingerprint`` (module_utils_fingerprint's)."""

    def find_module_utils_cached(**kwargs: Any) -> Any:
        key = hashlib.sha256(
            fingerprint.encode() + b"\0" + str(kwargs["module_path"]).encode() + b"\0" + kwargs["b_module_data"]
        ).hexdigest()
        run_tmp = constants.DEFAULT_LOCAL_TMP
        constants.DEFAULT_LOCAL_TMP = os.path.join(root, key[:2], key)
        try:
            return find_module_utils(**kwargs)
        finally:
            constants.DEFAULT_LOCAL_TMP = run_tmp

    find_module_utils_cached.wrapped = find_module_utils  # type: ignore[attr-defined]
    return find_module_utils_cached


class CallbackModule(CallbackBase):
    """Wraps the payload builder once per ansible-playbook run, before any task is queued."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        root = os.environ.get(CACHE_ENV)
        if root and not hasattr(module_common._find_module_utils, "wrapped"):
            os.makedirs(root, exist_ok=True)
            # Once, here: the workers are forked from this process for each task. The playbook and the
            # roles it imports are loaded by now (their module_utils directories with them).
            build = module_common._find_module_utils
            module_common._find_module_utils = cached(build, root, module_utils_fingerprint())
