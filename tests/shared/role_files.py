"""Import a Python file that is no installed module (a role's module, helper or launcher, a filter) by its path.

Roles are no packages and their files are not installed on the controller, so a test imports
them from where they are, without putting their folder on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def import_file(path: Path, name: str = "") -> ModuleType:
    """The module that the Python file at ``path`` defines, named ``name`` (default: after the file)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
