"""GPU acceptance on the controller: build the bundle (wheels, model, plan) and run.md."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

from .common import (
    ACCEPTANCE_HOST,
    ACCEPTANCE_INVENTORY,
    GATE_CLI,
    IMAGE_PROVIDED,
    KEEP,
    MANIFEST,
    MODEL_ARCHIVE,
    NOT_NEEDED,
    REPO,
    RUN_STEPS,
    TARGET_PLATFORM,
    TARGET_PYTHON,
    TOOLS,
    AcceptanceError,
    Plan,
    flag_value,
    say,
    strips_for,
    write_json,
)


def acceptance_offline_plan() -> dict[str, Any]:
    """The acceptance host's ``offline_plan`` (its GPUs, engine version) from its inventory."""
    import yaml  # the controller venv has it (ansible-core)

    inventory = yaml.safe_load(ACCEPTANCE_INVENTORY.read_text())
    return inventory["all"]["children"]["sglang_servers"]["hosts"][ACCEPTANCE_HOST]["offline_plan"]


def render_plan(model_config_file: Path, weights_bytes: int, model_path: str) -> dict[str, Any]:
    """Render the plan through the inference_server role, as a deploy to an SGLang host would.

    Runs ``tools/launch-plan h200-acceptance -i inventory/gpu-acceptance.yml``: the role's
    own plan.yml with the sglang_servers group's settings, the host's 2x H200 and its one
    tiny-model override, plus this model's config.json, size and path. The venv directory,
    the environment (JIT caches included) and every flag come from the role, not from here.
    """
    offline = {
        **acceptance_offline_plan(),
        "model_config_file": str(model_config_file.resolve()),
        "weights_bytes": weights_bytes,
    }
    extra = {"offline_plan": offline, "model_sync_source": {"type": "host_path", "path": model_path}}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "launch-plan"),
            ACCEPTANCE_HOST,
            "-i",
            str(ACCEPTANCE_INVENTORY),
            "-e",
            json.dumps(extra),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise AcceptanceError(
            f"tools/launch-plan refused or failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return json.loads(proc.stdout)["plan"]


# --------------------------------------------------------------------------------------
# prepare (controller)
# --------------------------------------------------------------------------------------


def bundle_args(
    lock: Path, wheelhouse: Path, pack_dir: Path, part_size: str | None = None, strips: list[str] | None = None
) -> list[str]:
    """build-bundle arguments for the target image: cp312, image packages and unneeded ones out,
    the archive split into parts of at most ``part_size`` when one is given."""
    args = [
        "--lock",
        str(lock),
        "--out",
        str(wheelhouse),
        "--python-version",
        TARGET_PYTHON,
        "--platform",
        TARGET_PLATFORM,
        "--exclude",
        ",".join(IMAGE_PROVIDED + NOT_NEEDED),
        "--keep",
        ",".join(KEEP),
        "--pack",
        str(pack_dir),
    ]
    for pattern in strips_for([]) if strips is None else strips:
        args += ["--strip", pattern]
    if part_size:
        args += ["--part-size", part_size]
    return args


def current_selection(lock: Path) -> list[str]:
    """The pins the bundle carries for this lock."""
    entries = bundle.entries_for_target(bundle.parse_lock_text(lock.read_text(), str(lock)), TARGET_PYTHON)
    chosen, _ = bundle.select(entries, IMAGE_PROVIDED + NOT_NEEDED, KEEP)
    return [e.pin for e in chosen]


def ensure_bundle(
    lock: Path,
    wheelhouse: Path,
    pack_dir: Path,
    rebuild: bool,
    part_size: str | None = None,
    strips: list[str] | None = None,
) -> dict[str, Any]:
    """Reuse ``pack_dir/pack.json`` if it packs this lock's selection with exactly these strips
    (in parts no larger than ``part_size``, when one is given), else build it."""
    strips = strips_for([]) if strips is None else strips
    manifest_path = pack_dir / bundle.PACK_MANIFEST
    if manifest_path.is_file() and not rebuild:
        packed = json.loads(manifest_path.read_text())
        fresh = (
            packed.get("lock_sha256") == bundle.sha256_file(lock)
            and packed.get("packages") == current_selection(lock)
            and set(packed.get("stripped_bytes", {})) == {*bundle.ALWAYS_STRIPPED, *strips}
            and (not part_size or all(p["bytes"] <= bundle.parse_size(part_size) for p in packed["parts"]))
        )
        if fresh and all((pack_dir / p["name"]).is_file() for p in packed["parts"]):
            say(f"reusing the packed bundle in {pack_dir} ({packed['bytes'] / 2**20:.1f} MiB)")
            return packed
    say(f"building the bundle (download, install, strip, tar | xz) into {pack_dir}; xz takes minutes")
    if bundle.main(bundle_args(lock, wheelhouse, pack_dir, part_size, strips)):
        raise AcceptanceError("tools/build-bundle failed (see above)")
    return json.loads(manifest_path.read_text())


def deterministic_tgz(source: Path, dest: Path, arcname: str) -> None:
    """``tar czf`` with sorted members, owner 0, mtime 0 and a gzip header without a date."""
    with (
        dest.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in [source, *sorted(source.rglob("*"))]:
            relative = path.relative_to(source).as_posix()
            info = tar.gettarinfo(str(path), arcname=arcname if relative == "." else f"{arcname}/{relative}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


def same_files(one: Path, other: Path) -> bool:
    """Whether the directories ``one`` and ``other`` hold the same file names with the same bytes."""
    names = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    if names != sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file()):
        return False
    return all(bundle.sha256_file(one / name) == bundle.sha256_file(other / name) for name in names)


def ensure_model(out: Path, model_python: str, rebuild: bool, source: Path | None = None) -> dict[str, Any]:
    """Generate the acceptance model and its archive, or reuse them; with ``source`` (a trained acceptance
    model, ``make-tiny-model --vision --with-mtp --train ...``) carry a copy of it instead."""
    model_dir, archive = out / "model", out / MODEL_ARCHIVE
    if source is not None:
        if not (source / "config.json").is_file() or not any(source.glob("*.safetensors")):
            raise AcceptanceError(f"--model {source}: no config.json and safetensors there (a model directory)")
        if not (model_dir.is_dir() and archive.is_file() and same_files(source, model_dir)):
            shutil.rmtree(model_dir, ignore_errors=True)
            say(f"carrying the model of {source}")
            shutil.copytree(source, model_dir)
            for path in model_dir.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the host's service account
            deterministic_tgz(model_dir, archive, "model")
    elif rebuild or not (model_dir / "config.json").is_file() or not archive.is_file():
        shutil.rmtree(model_dir, ignore_errors=True)
        say(f"generating the tiny model with {model_python}")
        subprocess.run(
            [model_python, str(TOOLS / "make-tiny-model"), "--out", str(model_dir), "--vision", "--with-mtp"],
            check=True,
        )
        deterministic_tgz(model_dir, archive, "model")
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return {
        "archive": MODEL_ARCHIVE,
        "bytes": archive.stat().st_size,
        "sha256": bundle.sha256_file(archive),
        "weights_bytes": weights,
        # A model the operator carried (e.g. trained with make-tiny-model --train), or random weights made here.
        "carried": source is not None,
        "config": json.loads((model_dir / "config.json").read_text()),
    }


def split_folders(files: list[tuple[str, int]], part_size: int | None) -> list[list[str]]:
    """Spread files (name, bytes), in order, over numbered folders.

    Without ``part_size`` everything goes into one folder; with it, into as few folders of
    at most ``part_size`` bytes as order allows (a transport with a limit per transfer
    carries one folder at a time). A single file larger than ``part_size`` is an error.
    """
    if part_size is None:
        return [[name for name, _ in files]]
    folders: list[list[str]] = [[]]
    used = 0
    for name, size in files:
        if size > part_size:
            raise AcceptanceError(f"{name} ({size} bytes) is larger than the part size of {part_size} bytes")
        if folders[-1] and used + size > part_size:
            folders.append([])
            used = 0
        folders[-1].append(name)
        used += size
    return folders


def link_or_copy(source: Path | str, dest: Path | str) -> None:
    """Hard-link ``source`` to ``dest`` (copy across file systems); usable as copytree's copy_function."""
    source, dest = Path(source), Path(dest)
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def run_commands(folders: list[str], out_rel: str) -> list[str]:
    """The GPU host's commands, from the repository root: the whole run in one process, or
    its steps one by one (each step its own process; the state folder carries them on)."""
    ga = "python3 tools/gpu-acceptance"
    received = [f"{ga} receive {out_rel}/{f}" for f in folders]
    return [
        f"{ga} run {' '.join(f'{out_rel}/{f}' for f in folders)}",
        *received,
        *(f"{ga} {s}" for s in RUN_STEPS),
        f"{ga} collect",
    ]


def run_markdown(folders: list[str], out_rel: str) -> str:
    """``run.md``: how to bring the bundle to a GPU host and run the acceptance there."""
    commands = run_commands(folders, out_rel)
    return "\n".join(
        [
            "# GPU acceptance on a GPU host",
            "",
            "Bring the repository checkout and the bundle folders to the GPU host (any Linux machine with",
            "the GPUs the plan needs and the target Python), e.g. `rsync -a --exclude .git ./ HOST:acceptance/`,",
            f"or one folder of `{out_rel}` at a time where a transfer is limited. Then, from the repository root:",
            "",
            "```",
            commands[0],
            "```",
            "",
            "or the same steps one at a time (e.g. over separate sessions; the state folder keeps them):",
            "",
            "```",
            *commands[1:],
            "```",
            "",
            "`collect` writes gpu_acceptance.json, gpu_acceptance.md and logs.tar.gz (to `--out`, default",
            "`<state>/out`); copy the first two to bench/results/.",
            "",
        ]
    )


def seed_from(other: Path, out: Path) -> None:
    """Copy another prepared folder's packed bundle and model into ``out`` where it has none
    (they are then checked for freshness like any earlier build)."""
    if other == out:
        return
    if (other / "pack" / bundle.PACK_MANIFEST).is_file() and not (out / "pack" / bundle.PACK_MANIFEST).is_file():
        shutil.copytree(other / "pack", out / "pack", copy_function=link_or_copy, dirs_exist_ok=True)
    if (other / MODEL_ARCHIVE).is_file() and not (out / MODEL_ARCHIVE).is_file():
        shutil.copytree(other / "model", out / "model", dirs_exist_ok=True)
        link_or_copy(other / MODEL_ARCHIVE, out / MODEL_ARCHIVE)
    say(f"seeded {out} from {other}")


def cmd_prepare(args: argparse.Namespace) -> int:
    """Build the bundle folders, the manifest and run.md (the GPU host's commands)."""
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))
    t0 = time.monotonic()
    if args.reuse:
        seed_from(args.reuse.resolve(), out)
    wheelhouse = cache / "wheelhouse" / f"{args.lock.stem}-h200-cp312"
    gpu_names = args.gpu_name or [gpu["name"] for gpu in acceptance_offline_plan().get("gpus", [])]
    strips = strips_for(gpu_names)
    say(f"bundle for {', '.join(gpu_names) or 'unknown GPUs'}: leaves out {', '.join(strips)}")
    packed = ensure_bundle(args.lock, wheelhouse, out / "pack", args.rebuild_bundle, args.part_size, strips)
    t_bundle = time.monotonic()
    model_python = args.model_python or str(cache / "venvs" / "transformers-cpu" / "bin" / "python")
    model = ensure_model(out, model_python, args.rebuild_model, args.model)
    t_model = time.monotonic()
    model_path = args.model_path or f"/root/models/tiny-qwen3.6/revisions/{model['sha256'][:12]}"
    if args.plan:
        plan = Plan.from_dict(json.loads(args.plan.read_text()))
        plan_source = str(args.plan)
    else:
        plan = Plan.from_dict(render_plan(out / "model" / "config.json", model["weights_bytes"], model_path))
        plan_source = (
            f"tools/launch-plan {ACCEPTANCE_HOST} -i {ACCEPTANCE_INVENTORY.relative_to(REPO)} "
            "(the inference_server role's plan.yml with the sglang_servers settings)"
        )
    expected_venv = Path(f"/root/ml-env.d/{packed['lock_sha256'][:12]}")
    if plan.venv_dir != expected_venv:
        raise AcceptanceError(f"the plan's venv {plan.venv_dir} is not the bundle's lock venv {expected_venv}")
    if flag_value(plan.argv, "--mem-fraction-static") is None:
        say("warning: the plan has no --mem-fraction-static; the tiny model's draft KV pool may not fit (docs/gpu.md)")
    files = [(p["name"], p["bytes"]) for p in packed["parts"]] + [(MODEL_ARCHIVE, model["bytes"])]
    sources = {p["name"]: out / "pack" / p["name"] for p in packed["parts"]}
    sources[MODEL_ARCHIVE] = out / MODEL_ARCHIVE
    folders = split_folders(files, bundle.parse_size(args.part_size) if args.part_size else None)
    for stale in out.iterdir():
        if stale.is_dir() and stale.name.isdigit():
            shutil.rmtree(stale)
    manifest = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lock": args.lock.name,
        "bundle": packed,
        "model": {k: v for k, v in model.items() if k != "config"},
        "plan": plan.as_dict(),
        "plan_source": plan_source,
        "gate_args": args.gate_arg,
        "bench": {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_prompts": args.num_prompts,
            "max_concurrency": 1,
            "tps_metric": args.tps_metric,
        },
        "folders": {str(i): names for i, names in enumerate(folders, 1)},
    }
    out_rel = os.path.relpath(out, REPO)
    names = [str(i) for i in range(1, len(folders) + 1)]
    manifest["run"] = run_commands(names, out_rel)
    for i, members in enumerate(folders, 1):
        folder = out / str(i)
        folder.mkdir()
        for name in members:
            link_or_copy(sources[name], folder / name)
        write_json(folder / MANIFEST, manifest)
        size = sum((folder / n).stat().st_size for n in members)
        say(f"{out_rel}/{i}: {', '.join(members)} = {size / 2**20:.1f} MiB")
    write_json(out / MANIFEST, manifest)
    (out / "run.md").write_text(run_markdown(names, out_rel))
    print(run_markdown(names, out_rel))
    say(
        f"prepared in {time.monotonic() - t0:.0f} s (bundle {t_bundle - t0:.0f} s, model {t_model - t_bundle:.0f} s); "
        f"plan: {shlex.join(plan.argv)}"
    )
    if not GATE_CLI.is_file():
        say("warning: tools/health-gate is missing; the GPU host's gate step falls back to a plain measurement")
    return 0
