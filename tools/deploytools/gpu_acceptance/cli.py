"""The gpu-acceptance command line: one subcommand per step, and ``run`` for the whole GPU host side."""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

from deploytools import build_bundle as bundle

from . import __doc__ as DESCRIPTION
from .common import (
    DEFAULT_LOCK,
    DEFAULT_STATE,
    REPO,
    RUN_STEPS,
    AcceptanceError,
    say,
)
from .correctness import cmd_correctness
from .device import Device, cmd_check, cmd_receive
from .install import (
    cmd_install,
)
from .measure import (
    cmd_bench,
    cmd_gate,
    cmd_original_flags,
)
from .prepare import (
    cmd_prepare,
)
from .processes import (
    cmd_launch,
    cmd_restart,
    cmd_stop,
    cmd_wait,
)
from .report import cmd_collect
from .upgrade import cmd_upgrade

# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def add_gate_arg(parser: argparse.ArgumentParser, text: str) -> None:
    """The repeatable ``--gate-arg`` option: arguments passed on to tools/health-gate."""
    parser.add_argument("--gate-arg", action="append", default=[], help=text)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, default=DEFAULT_STATE, help=f"device state folder (default {DEFAULT_STATE})")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="build the bundle folders, manifest and run.md (controller)")
    p.add_argument("--out", type=Path, default=REPO / ".gpuw", help="transfer folder (default .gpuw)")
    p.add_argument("--lock", type=Path, default=DEFAULT_LOCK, help="SGLang profile lock")
    p.add_argument("--plan", type=Path, help="a rendered plan JSON instead of calling filter_plugins/launch_plan.py")
    p.add_argument("--model-path", help="model path in the plan (default /root/models/tiny-qwen3.6/revisions/<sha>)")
    p.add_argument(
        "--model",
        type=Path,
        metavar="DIR",
        help="carry this acceptance model (e.g. one trained with make-tiny-model --vision --with-mtp --train) "
        "instead of generating random weights",
    )
    p.add_argument(
        "--model-python",
        help="python with torch+transformers for make-tiny-model "
        "(default $DEPLOY_CACHE_DIR/venvs/transformers-cpu/bin/python)",
    )
    add_gate_arg(
        p, "argument for tools/health-gate on the device (repeatable, e.g. --gate-arg=--min-accept-length=1.0)"
    )
    p.add_argument("--input-len", type=int, default=128, help="bench prompt tokens when the gate reports none")
    p.add_argument("--output-len", type=int, default=256, help="bench output tokens when the gate reports none")
    p.add_argument("--num-prompts", type=int, default=8, help="bench_serving requests (default 8)")
    p.add_argument(
        "--tps-metric",
        choices=["tpot", "output"],
        default="tpot",
        help="bench_serving number compared with the gate: 1000/mean TPOT (decode rate per request, "
        "default) or output throughput",
    )
    p.add_argument(
        "--part-size",
        help="split the bundle into folders of at most this size, e.g. 56M, for a transport with a limit per "
        "transfer (default: one folder)",
    )
    p.add_argument(
        "--reuse",
        type=Path,
        metavar="DIR",
        help="take the packed bundle and model from another prepared folder (e.g. a worktree's .gpuw)",
    )
    p.add_argument(
        "--gpu-name",
        action="append",
        help="a GPU of the target host as nvidia-smi names it (repeatable; default: the acceptance inventory's "
        "GPUs); the sgl_kernel build that its compute capability loads stays in the bundle",
    )
    p.add_argument("--rebuild-bundle", action="store_true", help="rebuild the packed bundle even if it is current")
    p.add_argument("--rebuild-model", action="store_true", help="regenerate the tiny model")

    p = sub.add_parser("receive", help="stage one bundle folder (GPU host)")
    p.add_argument("folder", type=Path)
    sub.add_parser("check", help="check Python, GPUs, tools and disk against the manifest (GPU host)")
    p = sub.add_parser("install", help="create the plan's venv and unpack packages and model (GPU host)")
    p.add_argument(
        "--model-config",
        type=Path,
        help="put this config.json in the model directory (e.g. the real model's, served with --load-format dummy)",
    )
    p.add_argument("--plan", type=Path, help="a rendered plan JSON: its venv and model paths instead of the manifest's")
    p = sub.add_parser("original-flags", help="run the seed's by-hand flags, capture the refusal (GPU host)")
    p.add_argument("--timeout", type=float, default=180)
    p = sub.add_parser("launch", help="start the plan in its own session (GPU host)")
    p.add_argument("name")
    p.add_argument("--plan", type=Path, help="a rendered plan JSON instead of the manifest's")
    p.add_argument("--user", help="run the server as this system user (created when missing), as the role's unit does")
    p = sub.add_parser("wait", help="wait for /health (GPU host)")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=420)
    p.add_argument("--interval", type=float, default=2.0)
    p = sub.add_parser("gate", help="run tools/health-gate and probe SGLang (GPU host)")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("gate_args", nargs=argparse.REMAINDER, help="extra gate arguments after --")
    p = sub.add_parser("bench-serving", help="python -m sglang.bench_serving against the server (GPU host)")
    p.add_argument("name")
    p.add_argument("--input-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--num-prompts", type=int)
    p.add_argument("--timeout", type=float, default=300)
    p = sub.add_parser("stop", help="stop a server's whole session (GPU host)")
    p.add_argument("name")
    p = sub.add_parser("restart", help="stop OLD, start NEW with the same plan and caches, wait (GPU host)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--timeout", type=float, default=240)
    p = sub.add_parser("upgrade", help="an engine upgrade as a gated candidate: keep or roll back (GPU host)")
    p.add_argument("--candidate-state", type=Path, required=True, help="state folder of the candidate's bundle")
    p.add_argument("--candidate-plan", type=Path, help="a rendered plan JSON instead of the candidate's manifest's")
    p.add_argument("--name", default="upgrade", help="name of this upgrade's record (default upgrade)")
    baseline = p.add_mutually_exclusive_group()
    baseline.add_argument("--baseline-gates", type=int, default=3, help="gates of the running server (default 3)")
    baseline.add_argument("--baseline", type=Path, help="an earlier gate report as the baseline instead")
    p.add_argument(
        "--baseline-only", action="store_true", help="measure the baseline and the gate's noise, switch nothing"
    )
    add_gate_arg(
        p, "argument for every gate of the upgrade, after the manifest's (repeatable, e.g. --gate-arg=--requests=8)"
    )
    p.add_argument("--max-regression-pct", type=float, default=10.0, help="the relative gate's margin (default 10)")
    p.add_argument("--min-running-requests", type=int, default=0, help="the capacity floor (default 0: none)")
    p.add_argument("--timeout", type=float, default=570, help="limit for each start and each gate (default 570 s)")
    p = sub.add_parser("correctness", help="what SGLang says: relaunch, no NEXTN, another version (GPU host)")
    p.add_argument("--name", default="correctness", help="name of the record (default correctness)")
    p.add_argument("--reference", type=Path, help="another version's first-step gate report, re-scored here")
    p.add_argument(
        "--steps",
        help="comma-separated steps to run: first, again, no-spec, versus, traffic, perturbed, setting (default: the "
        "first "
        "three, and versus with --reference); the record of --name keeps the steps run earlier",
    )
    p.add_argument("--gates", type=int, default=1, help="gates of each started server (default 1)")
    p.add_argument("--streams", type=int, default=8, help="background chat clients of the traffic step (default 8)")
    p.add_argument("--perturbed-model", type=Path, help="another revision of the model, served by the perturbed step")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="ARG",
        help="a server argument the setting step adds to the plan (repeatable, e.g. "
        "--setting=--quantization=fp8): a setting that corrupts tokens, which the gate must refuse",
    )
    add_gate_arg(p, "argument for every gate of the steps, after the manifest's (repeatable)")
    p.add_argument("--timeout", type=float, default=570, help="limit for each start and each gate (default 570 s)")
    p = sub.add_parser("collect", help="write the results to --out (GPU host)")
    p.add_argument("--out", type=Path, help="results folder (default <state>/out)")
    p = sub.add_parser("run", help="receive the folders, run every step, collect (GPU host)")
    p.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    p.add_argument("--out", type=Path, help="results folder (default <state>/out)")
    return ap


def cmd_run(args: argparse.Namespace, dev: Device) -> int:
    """The whole GPU host side in one process: receive every folder, then RUN_STEPS in order
    until one fails, then collect whatever was recorded. Returns the first failure's code."""
    state = ["--state", str(dev.root)]
    code = 0
    for folder in args.folders:
        code = code or main([*state, "receive", str(folder)])
    for step in RUN_STEPS:
        if code:
            break
        say(f"step: {step}")
        code = main([*state, *shlex.split(step)])
    collect = main([*state, "collect", *(["--out", str(args.out)] if args.out else [])])
    return code or collect


DEVICE_COMMANDS = {
    "receive": cmd_receive,
    "check": cmd_check,
    "install": cmd_install,
    "original-flags": cmd_original_flags,
    "launch": cmd_launch,
    "wait": cmd_wait,
    "gate": cmd_gate,
    "bench-serving": cmd_bench,
    "stop": cmd_stop,
    "restart": cmd_restart,
    "upgrade": cmd_upgrade,
    "correctness": cmd_correctness,
    "collect": cmd_collect,
    "run": cmd_run,
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch a subcommand; report failures in one line."""
    args = build_parser().parse_args(argv)
    if getattr(args, "gate_args", None) and args.gate_args[:1] == ["--"]:
        args.gate_args = args.gate_args[1:]
    try:
        if args.command == "prepare":
            return cmd_prepare(args)
        return DEVICE_COMMANDS[args.command](args, Device(args.state))
    except (AcceptanceError, bundle.BundleError) as exc:
        say(f"{args.command} failed: {exc}")
        return 1
    except subprocess.CalledProcessError as exc:
        say(f"{args.command} failed: {shlex.join(map(str, exc.cmd))[:200]} exited with {exc.returncode}")
        return 1
