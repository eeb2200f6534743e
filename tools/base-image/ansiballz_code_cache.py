"""Keep the compiled code of Ansible's module payloads on a test host (test images only).

Every Ansible module run ships its module and ``ansible.module_utils`` as a zip, and Python's
zipimport compiles each source file in it again on every run: about 80 ms of a module run's
240 ms in the test containers, for the same unchanged files, on every task of every deploy.
This keeps the compiled code of each source in a root-only directory, keyed by the sha256 of the
source and its path inside the zip, so that later runs load it instead of compiling it. What
runs is the same code; only the compile is skipped.

tools/build-base-image installs this module and a ``.pth`` line that imports it into the test
image's Python. It does nothing unless the process's environment names the directory in
``ANSIBALLZ_CODE_CACHE`` (the molecule scenarios' containers set it; the sim host does not, so
``make demo`` and the benchmarks run a stock Python), and only for root.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's own constant, without importing typing in every process
if TYPE_CHECKING:
    from types import CodeType

CACHE_ENV = "ANSIBALLZ_CODE_CACHE"


def _with_filename(code: CodeType, filename: str) -> CodeType:
    """Return ``code`` and its nested code objects with ``co_filename`` set to ``filename``."""
    consts = tuple(
        _with_filename(const, filename) if isinstance(const, type(code)) else const for const in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def install(cache_dir: str) -> None:
    """Put a caching compile in front of zipimport's, for a root-only ``cache_dir``."""
    import zipimport

    compile_source = zipimport._compile_source

    def cached_compile_source(pathname: str, source: bytes) -> CodeType:
        """Compile ``source`` as zipimport does, or load the code an earlier run compiled."""
        import hashlib
        import marshal

        inner = pathname.partition(".zip" + os.sep)[2] or pathname
        path = os.path.join(cache_dir, hashlib.sha256(inner.encode() + b"\0" + source).hexdigest())
        try:
            with open(path, "rb") as cached:
                return _with_filename(marshal.load(cached), pathname)
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = compile_source(pathname, source)
        partial = f"{path}.{os.getpid()}"
        try:
            with open(partial, "xb") as out:
                marshal.dump(code, out)
            os.replace(partial, path)
        except OSError:
            pass
        return code

    zipimport._compile_source = cached_compile_source


def _root_only_dir(path: str) -> bool:
    """Whether ``path`` is (or was just made) a directory of root's that no one else may write."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return False
    return info.st_uid == 0 and (info.st_mode & 0o170077) == 0o040000


_cache_dir = os.environ.get(CACHE_ENV, "")
if _cache_dir and sys.version_info[:2] == (3, 11) and os.geteuid() == 0 and _root_only_dir(_cache_dir):
    install(_cache_dir)
