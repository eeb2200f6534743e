"""What both gate experiments share: paths, progress, the CPU venv and the tiny model."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "tools" / "health-gate"
PROMPTS = REPO / "roles" / "health_gate" / "files" / "prompts.json"
# The bench's own entry point: re-run with ``_inside`` (systemd container) or ``_independent`` (CPU venv).
ENTRY = REPO / "bench" / "gate"


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench/gate] {msg}", file=sys.stderr, flush=True)


def cache_paths(cache: Path) -> dict[str, Path]:
    """The CPU venv's ``transformers`` entry point, its python and the tiny model."""
    venv = cache / "venvs" / "transformers-cpu"
    paths = {
        "serve": venv / "bin" / "transformers",
        "python": venv / "bin" / "python",
        "model": cache / "models" / "tiny-qwen3.5",
    }
    missing = [str(p) for p in (paths["serve"], paths["model"] / "config.json") if not p.exists()]
    if missing:
        sys.exit(
            "bench/gate: missing {}; run `make tools-venv model` or set DEPLOY_CACHE_DIR".format(", ".join(missing))
        )
    return paths


def make_broken_model(src: Path, dest: Path) -> Path:
    """A copy of the model with one weight shard truncated (a half-finished download)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    shards = sorted(dest.glob("*.safetensors"))
    with open(shards[len(shards) // 2], "r+b") as handle:
        handle.truncate(200)
    return dest
