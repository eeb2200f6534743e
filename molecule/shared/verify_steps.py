"""Helpers shared by the verifiers of the molecule scenarios.

Molecule's testinfra verifier runs pytest on each scenario's ``tests/`` directory; a test
module there imports this one by name: pyproject.toml's pytest ``pythonpath`` (its rootdir is
the repository, wherever pytest is started) puts ``molecule/shared`` on the path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# The colour codes Ansible puts around each line of its output when molecule asks for colour.
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def ephemeral(name: str) -> Path:
    """The path ``name`` in the scenario's ephemeral directory, where its playbooks write."""
    return Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / name


def recorded(name: str) -> Any:
    """The JSON file ``name`` that the scenario's playbooks wrote to its ephemeral directory."""
    return json.loads(ephemeral(name).read_text())


def failed_output(run: dict[str, Any]) -> str:
    """The output of a recorded step that must have failed, without colour codes, its whitespace
    folded to single spaces (a message that the callback wrapped over lines reads as one)."""
    assert run["rc"] != 0, f"the step was expected to fail, but exited {run['rc']}"
    return " ".join(ANSI_COLOUR.sub("", run["output"]).split())
