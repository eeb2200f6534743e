"""GPU acceptance on the GPU host: install the bundle into the plan's venv and the model at its path."""

from __future__ import annotations

import argparse
import configparser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

from .common import (
    AcceptanceError,
    say,
)
from .device import Device, expected_files
from .processes import (
    base_env,
)

# --------------------------------------------------------------------------------------
# install (device)
# --------------------------------------------------------------------------------------


def site_packages(venv_dir: Path) -> Path:
    """The venv's site-packages folder for this interpreter's version."""
    return venv_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


class ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte blocks."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks, self._buf = blocks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._blocks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buf))
        target[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def unpack_site(stage: Path, manifest: dict[str, Any], dest: Path) -> None:
    """Join and verify the parts and unpack ``site/*`` into ``dest`` (xz and tar binaries when
    present, Python's lzma otherwise)."""
    blocks = bundle.iter_joined(stage, manifest)
    if shutil.which("xz") and shutil.which("tar"):
        xz = subprocess.Popen(["xz", "-dc", "-T0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        tar = subprocess.Popen(["tar", "-x", "-C", str(dest), "--strip-components=1"], stdin=xz.stdout)
        assert xz.stdin is not None and xz.stdout is not None
        xz.stdout.close()
        try:
            for block in blocks:
                xz.stdin.write(block)
        finally:
            xz.stdin.close()
        if xz.wait() or tar.wait():
            raise AcceptanceError(f"unpacking the site tree failed (xz {xz.returncode}, tar {tar.returncode})")
        return
    with tarfile.open(fileobj=io.BufferedReader(ChunkReader(blocks), 1 << 20), mode="r|xz") as tar:
        for member in tar:
            extract_stripped(tar, member, dest)


def extract_stripped(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """Extract ``member`` without its first path component (``site/x`` -> ``dest/x``)."""
    member.name = member.name.split("/", 1)[1] if "/" in member.name else ""
    if not member.name:
        return
    if hasattr(tarfile, "data_filter"):
        tar.extract(member, dest, filter="data")
    else:  # Python without extraction filters
        tar.extract(member, dest)


def write_console_scripts(site: Path, bin_dir: Path) -> list[str]:
    """Write ``bin_dir/<name>`` for every console script of the bundled distributions."""
    written = []
    for entry_points in sorted(site.glob("*.dist-info/entry_points.txt")):
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(entry_points)
        if not parser.has_section("console_scripts"):
            continue
        for name, target in parser.items("console_scripts"):
            module, _, attr = target.strip().partition(":")
            attr = attr.split("[")[0].strip()
            script = bin_dir / name
            script.write_text(
                f"#!{bin_dir / 'python'}\nimport sys\nfrom {module.strip()} import {attr.split('.')[0]}\n"
                f"if __name__ == '__main__':\n    sys.exit({attr}())\n"
            )
            script.chmod(0o755)
            written.append(name)
    return written


def link_image_scripts(bin_dir: Path) -> list[str]:
    """Link the image interpreter's scripts (ninja, cmake, ...) that the venv lacks into its
    bin, as a full install would have them there: a plan whose PATH names only the venv still
    finds the JIT tools."""
    image_bin = Path(sysconfig.get_path("scripts"))
    linked = []
    for tool in sorted(image_bin.iterdir()) if image_bin.is_dir() else []:
        if re.match(r"(python|pip|activate|Activate|deactivate)", tool.name) or (bin_dir / tool.name).exists():
            continue
        if tool.is_file() and os.access(tool, os.X_OK):
            (bin_dir / tool.name).symlink_to(tool)
            linked.append(tool.name)
    return linked


# Imports whose failure does not stop the server from starting (only a later step needs them).
OPTIONAL_IMPORTS = {"sglang.bench_serving"}
IMPORT_CHECK = r"""
import importlib, json, sys, time
t = time.time(); out = {}
for name in ["torch", "triton", "transformers", "tokenizers", "flashinfer", "sgl_kernel", "xgrammar", "sglang",
             "sglang.srt.entrypoints.http_server", "sglang.srt.models.qwen3_5", "sglang.srt.models.qwen3_5_mtp",
             "sglang.bench_serving"]:
    try:
        module = importlib.import_module(name)
        out[name] = getattr(module, "__version__", "") or "ok"
    except Exception as exc:
        out[name] = f"FAILED {type(exc).__name__}: {exc}"
try:
    import torch
    out["torch_file"] = torch.__file__
    out["cuda_devices"] = torch.cuda.device_count()
except Exception as exc:
    out["cuda_devices"] = f"FAILED {type(exc).__name__}: {exc}"
out["import_s"] = round(time.time() - t, 1)
print(json.dumps(out))
"""


# The tiny model's token ids that a real config.json must keep: the tiny tokenizer defines them.
VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def use_model_config(model_dir: Path, config: Path) -> None:
    """Put ``config`` (e.g. the real model's config.json, served with ``--load-format dummy``) in
    the model directory, its vision token ids pointed at the tiny tokenizer's; the tiny model's
    own config.json is kept as config.tiny.json."""
    tiny_config = model_dir / "config.tiny.json"
    if not tiny_config.is_file():
        os.replace(model_dir / "config.json", tiny_config)
    tiny = json.loads(tiny_config.read_text())
    real = json.loads(config.read_text())
    for key in VISION_TOKEN_KEYS:
        if key in real and key in tiny:
            real[key] = tiny[key]
    (model_dir / "config.json").write_text(json.dumps(real, indent=1) + "\n")


def use_tiny_config(model_dir: Path) -> None:
    """The model directory as carried (the tiny model's own config.json)."""
    tiny_config = model_dir / "config.tiny.json"
    if tiny_config.is_file():
        os.replace(tiny_config, model_dir / "config.json")


def cmd_install(args: argparse.Namespace, dev: Device) -> int:
    """Create the plan's venv on the image's Python, unpack the bundled packages and the model."""
    manifest = dev.manifest()
    plan = dev.plan(getattr(args, "plan", None))
    t0 = time.time()
    want = manifest["bundle"].get("python_version")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and want != have:
        raise AcceptanceError(f"the bundle is for Python {want} but python3 here is {have}")
    missing = [n for n in expected_files(manifest) if not (dev.stage / n).is_file()]
    if missing:
        raise AcceptanceError(f"files not received yet: {', '.join(missing)}")
    venv_dir = plan.venv_dir
    venv.EnvBuilder(system_site_packages=True, clear=True, symlinks=True, with_pip=False).create(venv_dir)
    site = site_packages(venv_dir)
    unpack_site(dev.stage, manifest["bundle"], site)
    image_sites = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    (site / "_gpu_acceptance_image_site.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in image_sites)
    )
    scripts = write_console_scripts(site, venv_dir / "bin")
    linked = link_image_scripts(venv_dir / "bin")
    if "sglang" not in scripts:
        raise AcceptanceError("the bundled packages have no 'sglang' console script")
    shutil.rmtree(plan.model_path, ignore_errors=True)
    plan.model_path.mkdir(parents=True)
    with tarfile.open(dev.stage / manifest["model"]["archive"], "r:gz") as tar:
        for member in tar.getmembers():
            extract_stripped(tar, member, plan.model_path)
    if getattr(args, "model_config", None):
        use_model_config(plan.model_path, Path(args.model_config))
        say(f"model config: {args.model_config} (the tiny model's tokenizer and processor)")
    t_unpacked = time.time()
    done = subprocess.run(
        [str(venv_dir / "bin" / "python"), "-c", IMPORT_CHECK],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=300,
    )
    if done.returncode:
        print(done.stderr[-3000:])
        raise AcceptanceError("importing the installed packages failed (see above)")
    imports = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in imports.items() if isinstance(v, str) and v.startswith("FAILED")}
    fatal = {k: v for k, v in failed.items() if k not in OPTIONAL_IMPORTS}
    record = {
        "ok": not fatal,
        "seconds": round(t_unpacked - t0, 1),
        "import": imports,
        "venv": str(venv_dir),
        "model_path": str(plan.model_path),
        "image_site": image_sites,
        "console_scripts": len(scripts),
        "image_scripts_linked": len(linked),
    }
    dev.update("install", record)
    say(
        f"installed in {record['seconds']} s into {venv_dir}; imports {imports.get('import_s')} s: "
        + ", ".join(f"{k} {imports.get(k)}" for k in ("sglang", "torch", "transformers", "flashinfer", "sgl_kernel"))
    )
    for name in set(failed) - set(fatal):
        say(f"warning: {name} does not import ({failed[name]}); the server can still start")
    if fatal:
        raise AcceptanceError("some imports failed: " + "; ".join(f"{k}: {v}" for k, v in fatal.items()))
    return 0
