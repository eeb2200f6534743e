"""The module's ``install`` action: put this package on the host for the ``model-sync`` command.

One module run installs every file, so the role pays one round trip (a ``copy`` task per
file would pay one each). The files come from the package as this process loaded it (from
AnsiballZ's zip under the module, or from a directory), so the command runs exactly the
engine the module runs. The package goes below the destination at its import name as a path
(``ansible_collections/llm_deploy/inference/plugins/module_utils/model_sync_lib``), where the
launcher beside it imports it by that one name. A file is rewritten only when its content differs.
"""

from __future__ import annotations

import os

# AnsiballZ ships only what the module imports: the command needs all of these.
from . import cli, fetch_hub, fetch_local, fetch_rsync, hub_helper  # noqa: F401
from .fs import atomic_write

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from .base import EngineBase

# Where the copy goes below the destination: the import name as a path, so that it keeps its name.
PACKAGE_DIR = os.path.join(*__package__.split("."))
# Beside the package, what earlier versions installed: the single-file engine, then the package
# under a name of its own.
STALE = ("model_sync.py", "model_sync_lib")


def package_sources() -> dict[str, bytes]:
    """File name -> content of every module of this package (``__init__.py`` included)."""
    import importlib
    import pkgutil
    import sys

    package = sys.modules[__package__]
    names = {"__init__": package} | {
        info.name: importlib.import_module(f"{__package__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
    }
    return {f"{name}.py": module.__loader__.get_source(module.__name__).encode() for name, module in names.items()}


def install_engine(eng: EngineBase) -> dict:
    """Make ``<eng.dest>/PACKAGE_DIR`` hold this package (owner, group and modes of ``eng``).

    Returns ``changed`` and the files written (``installed``) or removed (``removed``).
    """
    target = os.path.join(eng.dest, PACKAGE_DIR)
    changed = False
    folders = [eng.dest]
    for part in PACKAGE_DIR.split(os.sep):
        folders.append(os.path.join(folders[-1], part))
    for path in folders:
        if os.path.isdir(path):
            changed |= eng.fix_attrs(path, os.stat(path), is_dir=True)
        else:
            changed = True
            eng.makedirs(path)
    written, removed = [], []
    for name, data in sorted(package_sources().items()):
        path = os.path.join(target, name)
        try:
            with open(path, "rb") as fh:
                same = fh.read() == data
        except FileNotFoundError:
            same = False
        if not same:
            written.append(path)
            if not eng.check:
                atomic_write(path, data)
        if os.path.exists(path):  # in check mode a new file is not there yet
            changed |= eng.fix_attrs(path, os.stat(path))
    for name in STALE:
        path = os.path.join(eng.dest, name)
        if os.path.lexists(path):
            removed.append(path)
            if eng.check:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                import shutil  # here, not above: shutil pulls in re (start-up time)

                shutil.rmtree(path)
            else:
                os.unlink(path)
    return {"changed": changed or bool(written or removed), "installed": written, "removed": removed}
