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
