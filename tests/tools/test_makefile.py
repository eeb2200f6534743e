"""The Makefile's own wiring that a parallel ``make test-setup`` depends on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_host_python_is_never_the_controller_venv_that_is_built_beside_it(tmp_path: Path) -> None:
    """Steps that run beside the controller venv's build (make -j2) call $(PYTHON); a recipe's PATH puts
    .venv/bin first, and ``make test``'s recursive make starts with that PATH, so a bare ``python3``
    there was the venv's, half-built and without pip (CI failed in setup)."""
    show = tmp_path / "show.mk"
    show.write_text("show:\n\t@command -v $(PYTHON)\n")
    run = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "-f", "Makefile", "-f", str(show), "show"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"},
    )
    resolved = Path(run.stdout.strip())
    assert resolved.is_file(), run.stdout
    assert ROOT / ".venv" not in resolved.parents, f"$(PYTHON) resolves to the controller venv: {resolved}"


def test_recipes_keep_the_bytecode_python_compiles_when_the_caller_says_not_to(tmp_path: Path) -> None:
    """The venvs are installed without bytecode (pip --no-compile): Python writes it on first import. A
    PYTHONDONTWRITEBYTECODE in the caller's environment would make every process of make test compile
    all it imports again (issue 52); the recipes run without it, and a recipe's python writes bytecode."""
    module = tmp_path / "probe_module.py"
    module.write_text("VALUE = 1\n")
    show = tmp_path / "show.mk"
    show.write_text(
        "show:\n"
        '\t@echo "PYTHONDONTWRITEBYTECODE=[$${PYTHONDONTWRITEBYTECODE-unset}]"\n'
        f"\t@cd {tmp_path} && $(PYTHON) -c 'import probe_module, sys; print(sys.dont_write_bytecode)'\n"
    )
    run = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "-f", "Makefile", "-f", str(show), "show"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert run.stdout.splitlines() == ["PYTHONDONTWRITEBYTECODE=[unset]", "False"], run.stdout
    assert list((tmp_path / "__pycache__").glob("probe_module.*.pyc")), "no bytecode was written"
