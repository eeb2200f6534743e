"""The test images' cache of compiled module payloads (tools/base-image/ansiballz_code_cache.py).

Each case runs a fresh Python, as a module run does, that imports a module from a zip (as
AnsiballZ ships a module and ansible.module_utils) with the cache installed.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK_DIR = ROOT / "tools" / "base-image"

IMPORT_FROM_ZIP = """
import json, sys, zipimport
import ansiballz_code_cache
if sys.argv[1]:
    ansiballz_code_cache.install(sys.argv[1])
import payload_mod
print(json.dumps({
    "value": payload_mod.VALUE,
    "filename": payload_mod.where.__code__.co_filename,
    "patched": zipimport._compile_source.__module__ == "ansiballz_code_cache",
}))
"""


def make_payload(path: Path, value: str) -> Path:
    """A zip holding payload_mod.py, whose VALUE is ``value``, under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    archive = path / "payload.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("payload_mod.py", f"VALUE = {value!r}\n\n\ndef where():\n    return 1\n")
    return archive


def import_from(archive: Path, cache: Path | None, **env: str) -> dict[str, object]:
    """Import payload_mod from ``archive`` in a new Python, with the cache at ``cache`` (or none)."""
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_FROM_ZIP, str(cache or "")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": f"{archive}{os.pathsep}{HOOK_DIR}", **env},
    )
    return json.loads(run.stdout)


def test_a_later_run_loads_the_code_an_earlier_run_compiled(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    first = import_from(make_payload(tmp_path / "run1", "from source"), cache)
    assert first == {"value": "from source", "filename": f"{tmp_path}/run1/payload.zip/payload_mod.py", "patched": True}
    entries = list(cache.iterdir())
    assert len(entries) == 1, entries

    # The entry stands for that source: put other code in it, and a later run of the same
    # source (from another temporary zip, as each module run is) gets that code, named after
    # its own zip, instead of compiling.
    entries[0].write_bytes(marshal.dumps(compile("VALUE = 'from cache'\ndef where(): pass\n", "old", "exec")))
    again = import_from(make_payload(tmp_path / "run2", "from source"), cache)
    assert again == {"value": "from cache", "filename": f"{tmp_path}/run2/payload.zip/payload_mod.py", "patched": True}


def test_a_changed_source_is_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    import_from(make_payload(tmp_path / "run1", "first"), cache)
    changed = import_from(make_payload(tmp_path / "run2", "second"), cache)
    assert changed["value"] == "second"
    assert len(list(cache.iterdir())) == 2


def test_a_cache_that_cannot_be_written_still_imports(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    result = import_from(make_payload(tmp_path / "run1", "from source"), missing)
    assert result["value"] == "from source"
    assert not missing.exists()


def test_nothing_is_installed_unless_the_environment_names_a_root_only_directory(tmp_path: Path) -> None:
    archive = make_payload(tmp_path / "run1", "from source")
    # Without ANSIBALLZ_CODE_CACHE (the sim host, a real host): zipimport as it is.
    assert import_from(archive, None, ANSIBALLZ_CODE_CACHE="")["patched"] is False
    # A directory others may write: never read code from it.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert import_from(archive, None, ANSIBALLZ_CODE_CACHE=str(shared))["patched"] is False
    # A root-only directory: installed for root (the test hosts' module runs), not for others.
    own = tmp_path / "own"
    expected = os.geteuid() == 0
    assert import_from(archive, None, ANSIBALLZ_CODE_CACHE=str(own))["patched"] is expected
    assert own.is_dir() and (own.stat().st_mode & 0o777) == 0o700
