"""A container of the test hosts' base image with systemd as PID 1, for tests that need the real systemd 252.

This machine's own PID 1 is not systemd; the base image (make image) is Debian 12's, with systemd 252, as
the molecule scenarios' hosts. Needs docker (as ``make test`` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

BASE_IMAGE = os.environ.get("BASE_IMAGE", "local/bookworm-systemd")
# docker's lowest CPU weight (--cpu-shares): under contention the container gets the CPU last.
LOWEST_CPU_SHARES = 2


@contextmanager
def systemd_container(prefix: str, image: str = BASE_IMAGE, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Start ``image`` with systemd as PID 1, wait until it runs, yield the container's name; remove it after.

    The container runs at this test run's CPU priority: a container's processes do not inherit a nice value,
    and make test runs pytest at nice 19 beside the molecule lanes (tools/test-stages --beside), whose
    containers would otherwise share the CPU with this one as equals. ``extra``: more ``docker run`` options.
    """
    if not shutil.which("docker"):
        pytest.fail("docker is needed for the tests that run systemd")
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cpu_shares = ["--cpu-shares", str(LOWEST_CPU_SHARES)] if os.nice(0) > 0 else []
    # fmt: off
    run = subprocess.run(
        ["docker", "run", "-d", "--name", name, *cpu_shares, "--cap-add", "SYS_ADMIN",
         "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
         "-e", "container=docker", *extra, image, "/lib/systemd/systemd"],
        capture_output=True, text=True, timeout=120)
    # fmt: on
    assert run.returncode == 0, run.stderr
    try:
        deadline = time.monotonic() + 120
        while True:  # the bus appears a moment after PID 1 starts
            state = subprocess.run(
                ["docker", "exec", name, "systemctl", "is-system-running", "--wait"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if state.stdout.strip() in ("running", "degraded") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert state.stdout.strip() in ("running", "degraded"), state
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
