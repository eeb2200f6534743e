"""Run check-launch-args.py many times in one engine venv, paying the engine's import once.

Importing ``sglang.srt.server_args`` costs about 15 s of CPU on the test machine, more than the
check itself; the launch-plan tests run the check some forty times. This server runs with the
venv's python and the check's environment, imports the engine's modules once, then reads one JSON
request per line on stdin (``{"argv": [...]}``: the arguments after the script's name) and, for
each, forks: the child runs the real script as ``__main__`` with that argv, its stdout and stderr
on files, and exits with the script's status; the server answers one JSON line
(``{"rc", "stdout", "stderr"}``). Each check so runs the whole script in a process of its own, as
the role runs it; only the engine's modules are already imported, with the same environment.

    python check_forkserver.py SCRIPT ENGINE      # ENGINE: sglang or transformers

Used by the ``run_check`` fixture (tests/launch_plan/conftest.py); standard library only (it runs
in the engine's venv).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import tempfile
from typing import TextIO

# What the check imports first, per engine; an import that fails here is left to the check, which
# reports it as its finding.
# sglang.srt.configs.model_config: what the check's prepare_server_args -> get_model_config imports
# (848 modules: quantization, MoE, torch._dynamo), about 2.8 of a check's 3.1 CPU-seconds otherwise.
PRELOAD = {
    "sglang": ["torch", "sglang.srt.server_args", "sglang.srt.configs.model_config"],
    "transformers": ["transformers.cli.transformers"],
}


def preload(engine: str) -> None:
    """Import the engine's heavy modules once, before the first fork."""
    for module in PRELOAD.get(engine, []):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the check itself reports an import that fails
            return


def run_child(script: str, argv: list[str], out_path: str, err_path: str) -> None:
    """In the forked child: the script as __main__ with argv, stdout/stderr on files; never returns."""
    code = 1
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - an uncaught error is the script's, as python would print it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(script: str, answers: TextIO) -> None:
    """Answer one check per request line until stdin closes."""
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryDirectory(prefix="check-") as tmp:
            out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            pid = os.fork()
            if pid == 0:
                run_child(script, request["argv"], out_path, err_path)
            _, status = os.waitpid(pid, 0)
            with open(out_path, encoding="utf-8", errors="replace") as out:
                stdout = out.read()
            with open(err_path, encoding="utf-8", errors="replace") as err:
                stderr = err.read()
        answer = {"rc": os.waitstatus_to_exitcode(status), "stdout": stdout, "stderr": stderr}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    # Answers go to the real stdout; whatever the engine's import prints goes to stderr.
    answer_stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    preload(sys.argv[2])
    serve(sys.argv[1], answer_stream)
