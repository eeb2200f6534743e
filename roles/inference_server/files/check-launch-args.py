#!/usr/bin/env python3
"""Check a launch plan with the engine's own parser, in the engine's venv, before a restart.

Run with the target venv's python (the role does this with ``ansible.builtin.script``,
``executable: <venv>/bin/python``), with the plan's environment, and the plan's full argv
after ``--``:

    python check-launch-args.py --engine sglang --gpus 2 -- /venv/bin/sglang serve --model-path ...
    python check-launch-args.py --engine transformers -- /venv/bin/transformers serve ... MODEL_DIR
    python check-launch-args.py --engine sglang --dump-flags      # the flag table, as JSON

sglang: ``sglang.srt.server_args.prepare_server_args(argv)`` (parser, then every check of
``ServerArgs.__post_init__``, which reads the model's config.json), then
``ServerArgs.check_server_args()`` (what the engine runs next at launch). From SGLang 0.5.19 on
(sglang #35907, #36255) constructing ``ServerArgs`` only records the input: the server resolves
derived values and runs the model checks in ``ServerArgs.resolve_once()`` (``sglang serve`` ->
``launch_server.run_server``, again in ``Engine._launch_subprocesses`` before
``check_server_args()``), so this script calls ``resolve_once()`` in between wherever ServerArgs
has it, and reports the resolved values as ``ServerArgs.resolved_dict()`` has them.
transformers: the ``transformers serve`` click command parses the argv without running it,
then the model directory's config is loaded with ``AutoConfig`` and the device and dtype
are checked.

A host without a CUDA device cannot run SGLang's GPU-only checks: SGLang stops at an
assertion on the device (with the hybrid-model flags: ``assert is_cuda() or is_musa()`` in
``ServerArgs._handle_mamba_radix_cache``). That stop is reported as what it is, with the
checks that did not run, and is not a refusal unless ``--gpus N`` (N > 0) says the host
has GPUs.

Prints one JSON object on stdout (the engine's own output goes to stderr). Exit status:
0 passed, 1 refused (``message`` holds the engine's own words), 2 usage error,
3 passed everything a host without a GPU can check.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

PASSED, REFUSED, USAGE, GPU_LESS = 0, 1, 2, 3
STATUS = {PASSED: "passed", REFUSED: "refused", USAGE: "usage", GPU_LESS: "passed-gpu-less"}
# Device predicates of sglang.srt.utils: an assertion on one of them is a GPU-only check.
DEVICE_PREDICATES = {
    "is_cuda",
    "is_musa",
    "is_hip",
    "is_cuda_alike",
    "is_npu",
    "is_xpu",
    "is_hpu",
    "is_sm90_supported",
    "is_sm100_supported",
    "is_blackwell_supported",
}
# Where our JSON and the engine's output go (stdout is redirected while the engine runs).
REAL_STDOUT: TextIO = sys.stdout
REAL_STDERR: TextIO = sys.stderr
# Resolved values worth reporting after a successful SGLang check.
SGLANG_RESOLVED = (
    "model_path",
    "device",
    "tp_size",
    "dtype",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "mamba_scheduler_strategy",
    "mamba_track_interval",
    "disable_radix_cache",
    "page_size",
    "max_running_requests",
    "mem_fraction_static",
    "context_length",
    "attention_backend",
    "linear_attn_backend",
    "disable_overlap_schedule",
    "served_model_name",
)
# Reported as well where the version's ServerArgs has them (0.5.17 renamed
# mamba_scheduler_strategy and cuda_graph_max_bs; the mamba pool's size moved the capacity).
SGLANG_RESOLVED_IF_PRESENT = (
    "mamba_radix_cache_strategy",
    "cuda_graph_max_bs_decode",
    "max_mamba_cache_size",
    "mamba_full_memory_ratio",
)
# The function whose steps a GPU-only stop leaves unrun: the resolution pipeline (0.5.19 on,
# each step called as ``run_hook(handle_x, server_args)``), else ``ServerArgs.__post_init__``
# (each step a ``self._handle_x()`` call).
RESOLUTION_FUNCTIONS = ("run_resolution_pipeline", "__post_init__")


class Tee(io.TextIOBase):
    """A text stream that writes to a real stream and keeps a copy."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:  # noqa: D102 - io.TextIOBase API
        self.stream.write(text)
        self.copy.write(text)
        return len(text)

    def flush(self) -> None:  # noqa: D102 - io.TextIOBase API
        self.stream.flush()

    def isatty(self) -> bool:  # noqa: D102 - io.TextIOBase API
        return False


@contextlib.contextmanager
def engine_output() -> Iterator[Tee]:
    """Send everything the engine prints to stderr (stdout is for our JSON), keeping a copy."""
    tee = Tee(REAL_STDERR)
    with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
        yield tee


def result(code: int, engine: str, message: str, **extra: Any) -> int:
    """Print the JSON result on the real stdout and return the exit status."""
    out = {"status": STATUS[code], "engine": engine, "message": message}
    out.update(extra)
    REAL_STDOUT.write(json.dumps(out, sort_keys=True, default=str) + "\n")
    REAL_STDOUT.flush()
    return code


# --------------------------------------------------------------------------------------
# Where an exception came from, and whether it is a GPU-only check
# --------------------------------------------------------------------------------------


def engine_frame(exc: BaseException, package: str) -> traceback.FrameSummary | None:
    """The innermost traceback frame inside the engine's package."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"/{package}/" in f.filename]
    return frames[-1] if frames else None


def statement_at(filename: str, lineno: int) -> ast.stmt | None:
    """The innermost statement of a source file that spans ``lineno``."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError):
        return None
    best: ast.stmt | None = None
    for node in ast.walk(tree):
        end = (node.end_lineno or node.lineno) if isinstance(node, ast.stmt) else 0
        if (
            isinstance(node, ast.stmt)
            and node.lineno <= lineno <= end
            and (best is None or end - node.lineno <= (best.end_lineno or best.lineno) - best.lineno)
        ):
            best = node
    return best


def names_in(node: ast.AST) -> set[str]:
    """Every plain name and attribute name used in ``node``."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return names | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def device_assertion(frame: traceback.FrameSummary | None) -> str | None:
    """Return the source of the assertion at ``frame`` if it tests the device, else None.

    The assertion tests the device when it names a device predicate itself (``assert is_cuda()
    or is_musa()``, 0.5.11) or calls a function of the same module that does (``assert
    _platform_supports_mamba_cache_extra_buffer()``, whose body reads ``platform.is_cuda``, 0.5.23).
    """
    if frame is None or frame.lineno is None:
        return None
    stmt = statement_at(frame.filename, frame.lineno)
    if not isinstance(stmt, ast.Assert):
        return None
    names = names_in(stmt.test)
    if names & DEVICE_PREDICATES:
        return ast.unparse(stmt.test)
    called = {n.func.id for n in ast.walk(stmt.test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    if called:
        tree = ast.parse(Path(frame.filename).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in called and names_in(node) & DEVICE_PREDICATES:
                return ast.unparse(stmt.test)
    return None


def resolution_function(exc: BaseException) -> str:
    """The engine function that runs the resolution steps in ``exc``'s traceback (see RESOLUTION_FUNCTIONS)."""
    names = {f.name for f in traceback.extract_tb(exc.__traceback__)}
    return next((name for name in RESOLUTION_FUNCTIONS if name in names), RESOLUTION_FUNCTIONS[-1])


def step_name(call: ast.Call) -> str | None:
    """``_handle_x`` for ``self._handle_x(...)``, ``handle_x`` for ``run_hook(handle_x, ...)``, else None."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    if isinstance(func, ast.Name) and func.id == "run_hook" and call.args and isinstance(call.args[0], ast.Name):
        return call.args[0].id
    return None


def later_steps(exc: BaseException, function: str = "__post_init__") -> list[str]:
    """The steps of ``function`` (``self._handle_*()`` or ``run_hook(handle_*, ...)``) after where it stopped."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.name == function]
    stopped = frames[-1].lineno if frames else None
    if stopped is None:
        return []
    tree = ast.parse(Path(frames[-1].filename).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            steps: list[tuple[int, str]] = []
            for call in ast.walk(node):
                name = step_name(call) if isinstance(call, ast.Call) and call.lineno > stopped else None
                if name is not None:
                    steps.append((call.lineno, name))
            return [name for _, name in sorted(steps)]
    return []


def unfinished(exc: BaseException, package: str, function: str = "__post_init__") -> list[str]:
    """The engine functions between ``function`` and the raise, innermost first (their rest did not run)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"/{package}/" in f.filename]
    names = [f.name for f in frames]
    if function in names:
        frames = frames[len(names) - names[::-1].index(function) :]
    # run_hook only calls the step (a plugin may replace it): it has no rest of its own.
    return [f.name for f in reversed(frames) if f.name != "run_hook"]


def where(frame: traceback.FrameSummary | None, package: str) -> str | None:
    """``sglang/srt/server_args.py:2403 in _handle_mamba_radix_cache`` for a frame."""
    if frame is None:
        return None
    path = frame.filename
    rel = path[path.rfind(f"/{package}/") + 1 :] if f"/{package}/" in path else path
    return f"{rel}:{frame.lineno} in {frame.name}"


def last_error_line(text: str) -> str:
    """The last ``...: error: ...`` line argparse printed (or the last line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line]
    return (errors or lines or ["(no message)"])[-1].strip()


def installed_version(package: str) -> str | None:
    """The installed version of a distribution, or None."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_entry_point(argv: Sequence[str], engine: str) -> tuple[list[str], str | None]:
    """Split the plan's argv into the engine's own arguments; return (args, error)."""
    if not argv:
        return [], "no argv given after --"
    exe = argv[0]
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return [], f"the plan's executable {exe} does not exist or is not executable on this host"
    name = os.path.basename(exe)
    if engine == "sglang":
        if name == "sglang" and argv[1:2] == ["serve"]:
            return list(argv[2:]), None
        if name.startswith("python") and list(argv[1:3]) == ["-m", "sglang.launch_server"]:
            return list(argv[3:]), None
        return [], f"{' '.join(argv[:3])} is not an SGLang entry point (sglang serve or python -m sglang.launch_server)"
    if name == "transformers" and argv[1:2] == ["serve"]:
        return list(argv[2:]), None
    return [], f"{' '.join(argv[:2])} is not `transformers serve`"


# --------------------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------------------


def fla_chunk_size(server_args_module: Any) -> int:
    """The FLA chunk size SGLang's mamba checks use.

    ``server_args.FLA_CHUNK_SIZE`` where server_args imports it (0.5.11 from
    ``sglang.srt.layers.attention.fla``, 0.5.17 from ``sglang.kernels.ops.attention.fla``); from
    0.5.19 on ``mamba_cache_chunk_size`` in ``sglang.srt.arg_groups.overrides`` imports it itself,
    from ``sglang.kernels.ops.attention.fla.chunk_delta_h``.
    """
    value = getattr(server_args_module, "FLA_CHUNK_SIZE", None)
    if value is None:
        from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE as value
    return int(value)


def field_default(server_args_class: type, name: str) -> Any:
    """A ServerArgs field's default: the dataclass's class attribute (0.5.11, 0.5.17), or the
    msgspec Struct's field default from 0.5.19 on (its class attributes are slot descriptors)."""
    import inspect

    default = getattr(server_args_class, name)
    if inspect.ismemberdescriptor(default):
        import msgspec

        default = next(f.default for f in msgspec.structs.fields(server_args_class) if f.name == name)
    return default


def sglang_flag_table() -> dict[str, Any]:
    """Every option of SGLang's real parser (``ServerArgs.add_cli_args``), as the filter reads it."""
    import argparse as ap

    import sglang
    import sglang.srt.server_args as server_args_module
    from sglang.srt.server_args import ServerArgs

    parser = ap.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags: dict[str, Any] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of actions
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, ap._HelpAction):  # noqa: SLF001
            continue
        kind = type(action).__name__
        # --x and --no-x of a BooleanOptionalAction are opposite bare flags, not aliases.
        groups = [[s] for s in longs] if isinstance(action, ap.BooleanOptionalAction) else [longs]
        for names in groups:
            if action.nargs == 0 or kind in (
                "_StoreTrueAction",
                "_StoreFalseAction",
                "_StoreConstAction",
                "_CountAction",
                "BooleanOptionalAction",
            ):
                takes = "none"
            elif action.nargs == "?":
                takes = "optional"
            elif action.nargs in ("+", "*") or isinstance(action.nargs, int):
                takes = "list"
            else:
                takes = "one"
            builtin_types: dict[Any, str] = {int: "int", float: "float", str: "str"}
            type_name = None
            if action.type is not None:
                type_name = builtin_types.get(action.type, getattr(action.type, "__name__", None))
            flags[names[0]] = {
                "aliases": names[1:],
                "dest": action.dest,
                "takes": takes,
                "type": type_name if takes != "none" else None,
                "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
                # SGLang's own Deprecated*Action classes (DeprecatedAliasStoreAction and
                # DeprecatedStoreConstAction came after 0.5.11); new_flag names the replacement.
                "deprecated": kind.startswith("Deprecated"),
                "replacement": getattr(action, "new_flag", None),
            }
    return {
        "engine": "sglang",
        "version": sglang.__version__,
        "source": "sglang.srt.server_args.ServerArgs.add_cli_args",
        "constants": {
            "fla_chunk_size": fla_chunk_size(server_args_module),
            "mamba_track_interval_default": field_default(ServerArgs, "mamba_track_interval"),
        },
        "flags": dict(sorted(flags.items())),
    }


def sglang_resolved(server_args: Any) -> dict[str, Any]:
    """The values worth reporting, as resolved (``resolved_dict()`` from 0.5.19 on, else the fields)."""
    values = server_args.resolved_dict() if callable(getattr(server_args, "resolved_dict", None)) else None
    if values is None:
        values = {
            k: getattr(server_args, k)
            for k in (*SGLANG_RESOLVED, *SGLANG_RESOLVED_IF_PRESENT)
            if hasattr(server_args, k)
        }
    resolved = {k: values.get(k) for k in SGLANG_RESOLVED}
    resolved.update({k: values[k] for k in SGLANG_RESOLVED_IF_PRESENT if k in values})
    return resolved


def check_sglang(args: list[str], gpus: int) -> int:
    """Run SGLang's own argument parsing and validation on ``args``."""
    notes: list[str] = []
    with engine_output() as out:
        try:
            import torch
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            return result(REFUSED, "sglang", f"importing torch in {sys.prefix} failed: {type(exc).__name__}: {exc}")
        cuda = bool(torch.cuda.is_available() and torch.version.cuda is not None)
        facts = {
            "engine_version": installed_version("sglang"),
            "torch": torch.__version__,
            "cuda_visible": cuda,
            "python": sys.executable,
        }
        if gpus > 0 and not cuda:
            return result(
                REFUSED,
                "sglang",
                f"torch {torch.__version__} in {sys.prefix} sees no CUDA device "
                f"although preflight found {gpus} GPU(s): check the NVIDIA driver (torch is built "
                f"for CUDA {torch.version.cuda}).",
                **facts,
            )
        try:
            from sglang.srt.server_args import prepare_server_args
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            return result(
                REFUSED,
                "sglang",
                f"importing sglang.srt.server_args in {sys.prefix} failed: {type(exc).__name__}: {exc}",
                **facts,
            )
        if not cuda and not any(a == "--device" or a.startswith("--device=") for a in args):
            args = [*args, "--device", "cuda"]
            notes.append(
                "no CUDA device here: validated with --device cuda, which SGLang picks on a GPU host "
                "(without it SGLang stops at once: No accelerator is available)"
            )
        stage = "prepare_server_args"
        try:
            server_args = prepare_server_args(args)
            # 0.5.19 and later: what the server calls after parsing, before check_server_args().
            resolve = getattr(server_args, "resolve_once", None)
            if callable(resolve):
                stage = "resolve_once"
                resolve()
            stage = "check_server_args"
            server_args.check_server_args()
        except SystemExit as exc:
            if exc.code in (0, None):
                return result(USAGE, "sglang", "the argv asked SGLang for --help", **facts)
            error = last_error_line(out.copy.getvalue())
            return result(
                REFUSED,
                "sglang",
                f"SGLang's parser refused the argv: {error}",
                exception="SystemExit",
                where="argparse",
                notes=notes,
                **facts,
            )
        except Exception as exc:  # noqa: BLE001 - SGLang raises ValueError, AssertionError, ...
            frame = engine_frame(exc, "sglang")
            assertion = device_assertion(frame)
            if assertion is not None and not cuda:
                function = resolution_function(exc)
                skipped = [f"the rest of {name}" for name in unfinished(exc, "sglang", function)] + later_steps(
                    exc, function
                )
                message = (
                    f"SGLang's validation passed everything a host without a GPU can check, up to "
                    f"`assert {assertion}` at {where(frame, 'sglang')} ({exc}), which needs a CUDA "
                    f"device (torch.cuda.is_available() is False here)"
                )
                return result(
                    GPU_LESS,
                    "sglang",
                    message,
                    exception=type(exc).__name__,
                    error=str(exc),
                    where=where(frame, "sglang"),
                    assertion=assertion,
                    stage=stage,
                    not_run=skipped,
                    notes=notes,
                    **facts,
                )
            return result(
                REFUSED,
                "sglang",
                f"{type(exc).__name__}: {exc}",
                exception=type(exc).__name__,
                where=where(frame, "sglang"),
                stage=stage,
                notes=notes,
                **facts,
            )
    resolved = sglang_resolved(server_args)
    return result(
        PASSED, "sglang", "SGLang's parser and validation accepted the plan", resolved=resolved, notes=notes, **facts
    )


# --------------------------------------------------------------------------------------
# transformers serve
# --------------------------------------------------------------------------------------


def transformers_serve_command() -> Any:
    """The click command behind ``transformers serve`` (transformers' own typer app)."""
    import click
    from transformers.cli.transformers import app

    if isinstance(app, click.Group):  # huggingface_hub's typer_factory builds the click group itself
        group = app
    else:  # a plain typer.Typer app
        import typer

        group = typer.main.get_command(app)
    return group.commands["serve"]


def transformers_flag_table() -> dict[str, Any]:
    """Every option of ``transformers serve``, as the filter reads it."""
    import transformers

    command = transformers_serve_command()
    flags: dict[str, Any] = {}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        type_name = {"integer": "int", "float": "float", "text": "str", "boolean": "bool"}.get(
            param.type.name, param.type.name
        )
        choices = getattr(param.type, "choices", None)
        for names in [list(param.opts)] + ([[s] for s in param.secondary_opts] if param.secondary_opts else []):
            longs = [n for n in names if n.startswith("--")]
            if not longs:
                continue
            flags[longs[0]] = {
                "aliases": longs[1:],
                "dest": param.name,
                "takes": "none" if param.is_flag else "one",
                "type": None if param.is_flag else type_name,
                "choices": sorted(str(c) for c in choices) if choices else None,
                "deprecated": bool(getattr(param, "deprecated", False)),
                "replacement": None,
            }
    return {
        "engine": "transformers",
        "version": transformers.__version__,
        "source": "transformers.cli.serve.Serve (transformers serve, click via typer)",
        "constants": {},
        "flags": dict(sorted(flags.items())),
    }


def check_transformers(args: list[str], gpus: int) -> int:
    """Parse ``args`` with transformers' own CLI without serving, then check model, device and dtype."""
    del gpus  # transformers serve runs on CPU in this repository
    with engine_output():
        try:
            import click
            import torch
            import transformers
            from transformers import AutoConfig
            from transformers.utils import is_serve_available
        except Exception as exc:  # noqa: BLE001
            return result(
                REFUSED, "transformers", f"importing transformers in {sys.prefix} failed: {type(exc).__name__}: {exc}"
            )
        facts = {"engine_version": transformers.__version__, "torch": torch.__version__, "python": sys.executable}
        command = transformers_serve_command()
        try:
            ctx = command.make_context("transformers serve", list(args))
        except click.exceptions.ClickException as exc:
            return result(
                REFUSED,
                "transformers",
                f"transformers serve refused the argv: {exc.format_message()}",
                exception=type(exc).__name__,
                **facts,
            )
        params = ctx.params
        if not is_serve_available():
            return result(
                REFUSED,
                "transformers",
                f"transformers serve in {sys.prefix} lacks its serving "
                "dependencies (fastapi, uvicorn, ...): install the profile's full lock",
                **facts,
            )
        model = params.get("force_model")
        if not model:
            return result(
                REFUSED,
                "transformers",
                "the argv does not pin a model directory (transformers serve MODEL_DIR)",
                **facts,
            )
        if not (Path(model) / "config.json").is_file():
            return result(REFUSED, "transformers", f"the model directory {model} has no config.json", **facts)
        try:
            config = AutoConfig.from_pretrained(model, trust_remote_code=params.get("trust_remote_code", False))
            device = torch.device(params["device"]) if params.get("device") != "auto" else None
            dtype = params.get("dtype")
            if dtype not in (None, "auto") and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
                raise ValueError(f"--dtype {dtype} is not a torch dtype")
            if device is not None and device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"--device {params['device']} but torch sees no CUDA device")
        except Exception as exc:  # noqa: BLE001
            return result(
                REFUSED, "transformers", f"{type(exc).__name__}: {exc}", exception=type(exc).__name__, **facts
            )
    resolved = {k: params.get(k) for k in ("force_model", "host", "port", "device", "dtype", "trust_remote_code")}
    resolved["model_type"] = config.model_type
    resolved["architectures"] = getattr(config, "architectures", None)
    return result(
        PASSED,
        "transformers",
        "transformers serve's parser accepted the plan and loaded the model's config",
        resolved=resolved,
        **facts,
    )


def format_table(table: dict[str, Any]) -> str:
    """JSON with one flag per line, so a regenerated table diffs line by line."""
    head = {k: v for k, v in table.items() if k != "flags"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "flags": {']
    items = sorted(table["flags"].items())
    for i, (name, spec) in enumerate(items):
        lines.append(f"  {json.dumps(name)}: {json.dumps(spec, sort_keys=True)}{',' if i < len(items) - 1 else ''}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Parse our own arguments, then check the plan's argv (or dump the flag table)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    plan_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, plan_argv = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, choices=("sglang", "transformers"))
    parser.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs preflight found on this host; with N > 0 a missing CUDA device is a refusal",
    )
    parser.add_argument("--dump-flags", action="store_true", help="print the engine's flag table as JSON and exit")
    try:
        opts = parser.parse_args(argv)
    except SystemExit as exc:
        return USAGE if exc.code else PASSED
    if opts.dump_flags:
        with engine_output():
            table = sglang_flag_table() if opts.engine == "sglang" else transformers_flag_table()
        REAL_STDOUT.write(format_table(table))
        return PASSED
    args, error = check_entry_point(plan_argv, opts.engine)
    if error:
        return result(USAGE if not plan_argv else REFUSED, opts.engine, error)
    if opts.engine == "sglang":
        return check_sglang(args, opts.gpus)
    return check_transformers(args, opts.gpus)


if __name__ == "__main__":
    sys.exit(main())
