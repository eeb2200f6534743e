"""node_exporter's sandbox: Debian's unit has none, the role's drop-in gives it one (docs/security.md).

``systemd-analyze security --offline=true`` rates Debian's own prometheus-node-exporter.service, from the
package tools/fetch-prometheus pins, with and without the drop-in the role installs beside it. It runs in
the Debian 12 base image of the test hosts (systemd 252, as on the hosts; Ubuntu 22.04's 249 has no
--offline). molecule/fleet rates the running unit on the serving hosts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from monitoring_support import CACHE, ROLE, promtool

UNIT = "prometheus-node-exporter.service"
SANDBOX = ROLE / "files" / "node-exporter-sandbox.conf"
# The overall exposure (0 best, 10 worst) the drop-in must keep node_exporter at, as for the other units.
MAX_EXPOSURE = 2.0
# The test hosts' base image (make image), which has Debian 12's systemd.
IMAGE = os.environ.get("BASE_IMAGE", "local/bookworm-systemd")


def debian_unit() -> Path:
    """Debian 12's prometheus-node-exporter.service, from the pinned package under the cache."""
    promtool()  # tools/fetch-prometheus unpacks every pinned package, node_exporter's among them
    (unit,) = (CACHE / "debs").glob(f"prometheus-node-exporter_*/lib/systemd/system/{UNIT}")
    return unit


def exposure(root: Path) -> tuple[float, str]:
    """systemd-analyze's overall exposure of the unit under ``root``, and its table."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--network=none", "-v", f"{root}:/unit-root:ro", IMAGE,
         "systemd-analyze", "security", "--offline=true", "--root=/unit-root", "--no-pager", UNIT],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    match = re.search(rf"Overall exposure level for {re.escape(UNIT)}: ([0-9.]+)", out.stdout)
    assert match, out.stdout + out.stderr
    return float(match.group(1)), out.stdout


def host_root(tmp_path: Path, with_sandbox: bool) -> Path:
    """A root with Debian's unit in /lib/systemd/system, and the role's drop-in when ``with_sandbox``."""
    root = tmp_path / ("with" if with_sandbox else "without")
    (root / "lib/systemd/system").mkdir(parents=True)
    shutil.copy(debian_unit(), root / "lib/systemd/system" / UNIT)
    if with_sandbox:
        drop_ins = root / "etc/systemd/system" / f"{UNIT}.d"
        drop_ins.mkdir(parents=True)
        shutil.copy(SANDBOX, drop_ins / "llm-deploy-sandbox.conf")
    return root


def test_the_drop_in_brings_node_exporter_under_the_threshold(tmp_path):
    bare, _ = exposure(host_root(tmp_path, with_sandbox=False))
    score, table = exposure(host_root(tmp_path, with_sandbox=True))
    assert bare > 9.0, f"Debian's unit alone rates {bare}: is the drop-in still needed?"
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE} with the drop-in:\n{table}"
