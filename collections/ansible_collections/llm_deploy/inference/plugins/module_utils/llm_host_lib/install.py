"""``install DIR FILE...`` (the module's only): put the host helpers' part of this package on the host.

inference_server runs it with the directory of the unit's helpers (``/usr/local/lib/<unit>``)
and the files of this package that the port guard and the watchdog import (the guard, the restart
sequence; its vars list them, so that the converged record checks the same files): each goes to
``DIR/<the package's import name as a path>/<file>`` (``DIR/ansible_collections/llm_deploy/...``:
the launcher and the watchdog in DIR import the copy by the package's one name), root's and 0644
in 0755 directories, and is rewritten only when its content differs, on disk when this returns
(:mod:`.durable`: the guard runs at the next boot too). One module run writes them all
(a ``copy`` task per file would pay a round trip or two each). The content is this package as
this process loaded it (from AnsiballZ's zip or from a directory), so the guard runs exactly
the code the module runs. In check mode it says what it would write and changes nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat

# AnsiballZ ships only what the module imports: the port guard and the watchdog need these.
from . import cli, guard, proc, restart  # noqa: F401
from .durable import replace_file

# Where the copy goes below DIR: the import name as a path, so that it keeps its name there.
PACKAGE_DIR = os.path.join(*__package__.split("."))
# Where earlier versions put the copy (under a name of its own): removed.
STALE_DIRS = ("llm_host_lib",)
FILE_MODE = 0o644
DIR_MODE = 0o755


def refuse(msg: str) -> SystemExit:
    """A refusal as the module reports it (``{"failed": true, "msg": ...}``)."""
    return SystemExit(json.dumps({"failed": True, "msg": msg}))


def source(file_name: str) -> bytes:
    """The content of this package's file ``file_name`` (``__init__.py`` for the package itself)."""
    name = file_name.removesuffix(".py")
    if not file_name.endswith(".py") or not name.isidentifier():
        raise refuse(f"not a module file of {PACKAGE_DIR}: {file_name!r}")
    try:
        module = importlib.import_module(__package__ if name == "__init__" else f"{__package__}.{name}")
    except ImportError as exc:
        raise refuse(f"no module {name} in {PACKAGE_DIR}: {exc}") from None
    return module.__loader__.get_source(module.__name__).encode()


def settle(path: str, mode: int, check: bool) -> bool:
    """Give ``path`` ``mode`` and, when run as root, root's ownership; whether it had to change."""
    st = os.lstat(path)
    wrong_mode = stat.S_IMODE(st.st_mode) != mode
    wrong_owner = os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0)
    if not check:
        if wrong_mode:
            os.chmod(path, mode)
        if wrong_owner:
            os.chown(path, 0, 0)
    return wrong_mode or wrong_owner


def make_package_dirs(directory: str, check: bool) -> bool:
    """Make each folder below ``directory`` down to the package's, root's and 0755 (``directory`` itself
    as the umask makes it, when missing); whether one changed."""
    changed = not os.path.isdir(directory)
    if changed:
        if check:
            return True
        os.makedirs(directory)
    path = directory
    for part in PACKAGE_DIR.split(os.sep):
        path = os.path.join(path, part)
        if not os.path.isdir(path):
            if check:  # in check mode a new folder is not there yet, nor anything below it
                return True
            os.mkdir(path, DIR_MODE)
            changed = True
        changed |= settle(path, DIR_MODE, check)
    return changed


def install(directory: str, file_names: list[str], check: bool = False) -> dict[str, object]:
    """Make ``directory/PACKAGE_DIR`` hold ``file_names`` of this package: ``changed``, what was written
    and what of an earlier version's copy was removed."""
    sources = {name: source(name) for name in file_names}
    target = os.path.join(directory, PACKAGE_DIR)
    changed = make_package_dirs(directory, check)
    written = []
    for name, data in sorted(sources.items()):
        path = os.path.join(target, name)
        try:
            with open(path, "rb") as handle:
                same = not os.path.islink(path) and handle.read() == data
        except OSError:
            same = False
        if not same:
            written.append(path)
            if not check:
                replace_file(path, data, FILE_MODE)
        if os.path.lexists(path):  # in check mode a new file is not there yet
            changed |= settle(path, FILE_MODE, check)
    removed = [
        os.path.join(directory, stale) for stale in STALE_DIRS if os.path.lexists(os.path.join(directory, stale))
    ]
    for path in removed if not check else []:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return {
        "changed": changed or bool(written or removed),
        "directory": target,
        "installed": written,
        "removed": removed,
    }
