"""GPU acceptance on the GPU host: the state folder, receive and check."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

from .common import (
    MANIFEST,
    MULTICAST_OFF,
    AcceptanceError,
    Plan,
    flag_value,
    nvidia_smi,
    say,
    write_json,
)

# --------------------------------------------------------------------------------------
# Device state
# --------------------------------------------------------------------------------------


class Device:
    """The state folder on the GPU machine: stage/, logs/, state.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stage = root / "stage"
        self.logs = root / "logs"
        self.state_path = root / "state.json"
        for folder in (self.stage, self.logs):
            folder.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict[str, Any]:
        """The recorded state (empty at first)."""
        return json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}

    def update(self, key: str, value: Any) -> None:
        """Record one step's result under ``key``."""
        state = self.load()
        state[key] = value
        write_json(self.state_path, state)

    def manifest(self) -> dict[str, Any]:
        """The manifest received with the first folder."""
        path = self.stage / MANIFEST
        if not path.is_file():
            raise AcceptanceError(f"no {MANIFEST} in {self.stage}: receive a prepared folder first")
        return json.loads(path.read_text())

    def plan(self, rendered: Path | None = None) -> Plan:
        """The launch plan: a rendered plan file when given (``--plan``), else the manifest's."""
        return Plan.from_file(rendered) if rendered else Plan.from_dict(self.manifest()["plan"])

    def server(self, name: str) -> dict[str, Any]:
        """The record of a launched server."""
        servers = self.load().get("servers", {})
        if name not in servers:
            raise AcceptanceError(f"no server named '{name}' was launched")
        return servers[name]

    def set_server(self, name: str, record: dict[str, Any]) -> None:
        """Store a server's record."""
        state = self.load()
        state.setdefault("servers", {})[name] = record
        write_json(self.state_path, state)


def expected_files(manifest: dict[str, Any]) -> dict[str, str]:
    """``{file name: sha256}`` of everything that travels."""
    files = {p["name"]: p["sha256"] for p in manifest["bundle"]["parts"]}
    files[manifest["model"]["archive"]] = manifest["model"]["sha256"]
    return files


def cmd_receive(args: argparse.Namespace, dev: Device) -> int:
    """Copy a bundle folder into the stage, checking each file against the manifest."""
    folder: Path = args.folder
    if not (folder / MANIFEST).is_file():
        raise AcceptanceError(f"{folder} holds no {MANIFEST}; is it a folder that prepare wrote?")
    manifest = json.loads((folder / MANIFEST).read_text())
    expected = expected_files(manifest)
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST:
            continue
        if path.name not in expected:
            raise AcceptanceError(f"{path.name} is not in the manifest")
        bundle.verify_part(path, expected[path.name])
        shutil.copyfile(path, dev.stage / path.name)
    shutil.copyfile(folder / MANIFEST, dev.stage / MANIFEST)
    present = [n for n in expected if (dev.stage / n).is_file()]
    missing = [n for n in expected if n not in present]
    free = shutil.disk_usage(dev.root).free / 2**30
    say(
        f"received {folder}: {len(present)}/{len(expected)} files staged"
        + (f"; still missing {', '.join(missing)}" if missing else "; complete")
        + f"; {free:.0f} GiB free"
    )
    return 0


def cmd_check(args: argparse.Namespace, dev: Device) -> int:
    """Fail fast before the big transfers: Python version, GPUs for the plan's TP, tools, disk."""
    manifest, plan = dev.manifest(), dev.plan()
    want = manifest["bundle"].get("python_version")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    tp = int(flag_value(plan.argv, "--tensor-parallel-size") or flag_value(plan.argv, "--tp-size") or 1)
    gpus = device_info().get("gpus", [])
    facts = {
        "python": have,
        "gpus": gpus,
        "xz": bool(shutil.which("xz")),
        "tar": bool(shutil.which("tar")),
        "free_gib": round(shutil.disk_usage(dev.root).free / 2**30),
        "multicast_env": {k: os.environ.get(k) for k in MULTICAST_OFF},
    }
    dev.update("check", facts)
    say(f"machine: {json.dumps(facts)}")
    if want and want != have:
        raise AcceptanceError(f"the bundle is for Python {want} but python3 here is {have}")
    if len(gpus) < tp:
        raise AcceptanceError(f"the plan needs {tp} GPUs (tensor parallelism) but nvidia-smi shows {len(gpus)}")
    return 0


def device_info() -> dict[str, Any]:
    """GPU names and driver (nvidia-smi), Python version."""
    info: dict[str, Any] = {"python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        out = nvidia_smi("name,driver_version,memory.total")
        info["gpus"] = [line.strip() for line in out.splitlines() if line.strip()]
    return info
