"""The executable tools (``tools/<name>``, scripts without .py) imported as modules.

Shared by the test folders; the root ``tests/conftest.py`` puts this folder on ``sys.path``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_tool(name: str) -> ModuleType:
    """Import the executable ``tools/<name>`` (a script without .py) as a module.

    For the tools whose logic still lives in the executable; the others are imported from
    ``deploytools``. One module object per tool, so its classes compare equal across tests.
    """
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(REPO / "tools" / name))
    if loader.name in sys.modules:
        return sys.modules[loader.name]
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module
