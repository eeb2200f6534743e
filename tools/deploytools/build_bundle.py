"""Build an offline wheelhouse ("bundle") for one engine profile's lock file, and pack it.

The same lock that the ``ml_env`` role installs is downloaded as wheels for a target
Python version and platform, so a host without an index (an air-gapped site, the CPU
rehearsal containers, a GPU host without network) installs with ``--no-index --find-links``:

    tools/build-bundle --lock roles/ml_env/files/locks/transformers-cpu.txt --out DIR
    tools/build-bundle --lock roles/ml_env/files/locks/sglang-0.5.11.txt --out DIR \\
        --python-version 3.12 --platform manylinux_2_34_x86_64

Selection. Lock lines may carry environment markers (``pkg==1.0 ; python_version <
"3.11"``); they are evaluated for the *target* Python, not for this interpreter.
``--exclude PATTERN`` leaves out packages (shell-style patterns on normalised names,
e.g. ``nvidia-*``) that the target already provides or does not need; packages that
only excluded packages need (read from the lock's ``# via`` comments) are left out with
them unless ``--no-prune``. ``--keep PATTERN`` overrides ``--exclude``; ``--only
PATTERN`` selects exactly the matching packages. ``--list`` prints the selection and
downloads nothing.

Hashes. A lock whose lines carry ``--hash=sha256:...`` (tools/lock-profile writes them) is
downloaded with ``pip download --require-hashes``, so a file whose sha256 the lock does not
list is refused, and the wheel kept for each line is one whose sha256 the lock lists;
``requirements.txt`` in the wheelhouse pins each package with the sha256 of its wheel there.

Packing for another machine: ``--pack DIR`` installs the selected wheels with ``pip install --no-index --no-deps
--no-compile --target`` into a site tree (console scripts dropped: the receiving side
writes its own), deletes the ``--strip`` globs and runs ``tar | xz`` into one archive
part, or, with ``--part-size SIZE`` (for a transport with a limit per transfer), into
parts of at most that size; a ``pack.json`` manifest holds every part's sha256 and the
whole archive's. ``join_parts`` (importable) reassembles
and verifies them.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from deploytools.lock_file import (  # noqa: F401  (re-exported: callers use build_bundle's names)
    BundleError,
    LockEntry,
    format_entry,
    lock_header,
    logical_lines,
    normalize_name,
    parse_lock_text,
    parse_requirement,
    read_lock,
    via_of,
)

ARCHIVE_NAME = "site.tar.xz"
PACK_MANIFEST = "pack.json"
# The part size when none is asked for: the whole archive is one part.
WHOLE = 2**63 - 1
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _marker_class():  # noqa: ANN202 - returns a class from whichever packaging is present
    """Return ``packaging.markers.Marker`` (or pip's vendored copy)."""
    try:
        from packaging.markers import Marker
    except ImportError:  # a bare interpreter: pip always vendors packaging
        from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    return Marker


def marker_environment(python_version: str | None) -> dict[str, str]:
    """The marker environment of a Linux target with ``python_version`` (default: this one)."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    return {
        "python_version": version,
        "python_full_version": f"{version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_system": "Linux",
        "platform_machine": os.environ.get("BUNDLE_TARGET_MACHINE", "x86_64"),
        "extra": "",
    }


def applies(entry: LockEntry, environment: dict[str, str]) -> bool:
    """Whether a lock line's marker holds in ``environment`` (no marker: always)."""
    if not entry.marker:
        return True
    return bool(_marker_class()(entry.marker).evaluate(environment))


def entries_for_target(entries: Iterable[LockEntry], python_version: str | None) -> list[LockEntry]:
    """The lines that apply to the target Python; a package must not be pinned twice."""
    environment = marker_environment(python_version)
    chosen: dict[str, LockEntry] = {}
    for entry in entries:
        if applies(entry, environment):
            if entry.key in chosen:
                raise BundleError(f"{entry.name} is pinned twice for Python {environment['python_version']}")
            chosen[entry.key] = entry
    return list(chosen.values())


def _matches(key: str, patterns: Iterable[str]) -> bool:
    """Whether a normalised name matches one of the shell-style patterns (normalised too)."""
    return any(fnmatch.fnmatchcase(key, normalize_name(p)) for p in patterns)


def split_patterns(values: Iterable[str]) -> list[str]:
    """Flatten repeatable, comma- or space-separated pattern options."""
    return [p for v in values for p in re.split(r"[,\s]+", v) if p]


def select(
    entries: list[LockEntry],
    exclude: Iterable[str] = (),
    keep: Iterable[str] = (),
    only: Iterable[str] = (),
    prune: bool = True,
) -> tuple[list[LockEntry], dict[str, str]]:
    """Apply ``--only``/``--exclude``/``--keep`` and orphan pruning.

    Returns the selected entries (lock order) and ``{name: reason}`` for every entry left out.
    A package is pruned when it has ``# via`` parents and all of them are left out.
    """
    exclude, keep, only = list(exclude), list(keep), list(only)
    dropped: dict[str, str] = {}
    if only:
        unknown = [p for p in only if not any(_matches(e.key, [p]) for e in entries)]
        if unknown:
            raise BundleError(f"--only names packages that are not in the lock: {', '.join(unknown)}")
        for e in entries:
            if not _matches(e.key, only):
                dropped[e.key] = "not in --only"
        prune = False
    for e in entries:
        if e.key not in dropped and _matches(e.key, exclude) and not _matches(e.key, keep):
            dropped[e.key] = "excluded"
    if prune:
        changed = True
        while changed:
            changed = False
            for e in entries:
                if e.key in dropped or not e.via or _matches(e.key, keep):
                    continue
                parents = [p for p in e.via if p in {x.key for x in entries}]
                if parents and all(p in dropped for p in parents):
                    dropped[e.key] = "only needed by " + ", ".join(sorted(parents))
                    changed = True
    return [e for e in entries if e.key not in dropped], dropped


# ---------------------------------------------------------------------------------------
# Download
# ---------------------------------------------------------------------------------------


def expand_platforms(platforms: Iterable[str]) -> list[str]:
    """Add every older manylinux tag below each ``manylinux_2_N_<arch>`` (pip matches tags exactly)."""
    out: list[str] = []
    for plat in platforms:
        match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", plat)
        tags = [plat]
        if match:
            top, arch = int(match.group(1)), match.group(2)
            tags = [f"manylinux_2_{n}_{arch}" for n in range(top, 4, -1)]
            tags += [f"{legacy}_{arch}" for n, legacy in LEGACY_MANYLINUX.items() if n <= top]
        out += [t for t in tags if t not in out]
    return out


def target_flags(python_version: str | None, platforms: list[str]) -> list[str]:
    """pip flags that select wheels for another interpreter/platform (empty: this one)."""
    flags: list[str] = []
    if python_version:
        flags += ["--python-version", python_version, "--implementation", "cp"]
    for plat in expand_platforms(platforms):
        flags += ["--platform", plat]
    if flags:
        flags.append("--only-binary=:all:")
    return flags


def isolated_pip_env() -> dict[str, str]:
    """Environment for pip that ignores this machine's pip config files, find-links and constraints.

    The CA bundle (``PIP_CERT``) is kept so that a TLS-inspecting proxy still works.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK")
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def hash_mode(entries: list[LockEntry], source: str = "lock") -> bool:
    """Whether pip checks these entries by hash: all of them hashed (True) or none (False).

    pip itself refuses a mix (a hashed line turns hash checking on for every line).
    """
    unhashed = [e.pin for e in entries if not e.hashes]
    if unhashed and len(unhashed) < len(entries):
        raise BundleError(
            f"{source} pins {', '.join(unhashed[:5])}{' ...' if len(unhashed) > 5 else ''} without --hash while "
            "other lines have hashes; add them with tools/lock-profile --hash-only"
        )
    return bool(entries) and not unhashed


def download(
    entries: list[LockEntry],
    out: Path,
    python_version: str | None,
    platforms: list[str],
    index_url: str | None = None,
    source: str = "lock",
) -> None:
    """Download every pinned wheel (no dependency resolution: the lock is complete).

    A hashed lock is downloaded with ``--require-hashes``: pip refuses a file whose sha256
    the lock does not list (and fetches again a file already in ``out`` whose hash is wrong).
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(out), "--quiet"]
    cmd += target_flags(python_version, platforms)
    if index_url:
        cmd += ["--index-url", index_url]
    with tempfile.TemporaryDirectory(prefix="build-bundle-") as tmp:
        if hash_mode(entries, source):
            # Markers were evaluated for the target already; pip would evaluate them for this interpreter.
            requirements = Path(tmp) / "requirements.txt"
            requirements.write_text("".join(e.requirement(marker=False) + "\n" for e in entries))
            cmd += ["--require-hashes", "-r", str(requirements)]
        else:
            cmd += [e.pin for e in entries]
        done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(done.stderr)
    if "DO NOT MATCH THE HASHES" in done.stderr:
        raise BundleError(
            f"pip refused wheels whose sha256 is not in {source} (THESE PACKAGES DO NOT MATCH THE HASHES, above): "
            "the index serves other files than the lock was made from, or the lock has no hash for this "
            "--python-version/--platform; find out why before refreshing the hashes (tools/lock-profile --hash-only)"
        )
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, cmd)


def wheel_key(filename: str) -> tuple[str, str]:
    """``(normalised name, version)`` of a wheel file name."""
    parts = filename[:-4].split("-")
    if not filename.endswith(".whl") or len(parts) < 5:
        raise BundleError(f"{filename} is not a wheel file name")
    return normalize_name(parts[0]), parts[1]


def wheels_for(entries: list[LockEntry], wheelhouse: Path) -> list[Path]:
    """The one wheel file in ``wheelhouse`` for each entry; raise if one is missing.

    For a hashed entry it is the file whose sha256 the lock lists: a wheelhouse that holds
    only other files for it is refused.
    """
    found: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        found.setdefault(wheel_key(path.name), []).append(path)
    missing = [e.pin for e in entries if (e.key, e.version) not in found]
    if missing:
        raise BundleError(f"{wheelhouse} lacks wheels for: {', '.join(missing)}")
    chosen: list[Path] = []
    wrong: list[str] = []
    for entry in entries:
        paths = found[(entry.key, entry.version)]
        if entry.hashes:
            paths = [p for p in paths if f"sha256:{wheel_sha256(p)}" in entry.hashes]
            if not paths:
                wrong += [f"{p.name} (sha256 {wheel_sha256(p)})" for p in found[(entry.key, entry.version)]]
                continue
        chosen.append(paths[0])
    if wrong:
        raise BundleError(
            f"{wheelhouse} holds wheels whose sha256 the lock does not list: {', '.join(wrong)}; "
            "delete them and build the wheelhouse again"
        )
    return chosen


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=4096)
def _wheel_sha256(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def wheel_sha256(path: Path) -> str:
    """Hex sha256 of a wheel, read once per build (wheels_for and write_selection both need it)."""
    stat = path.stat()
    return _wheel_sha256(path.resolve(), stat.st_size, stat.st_mtime_ns)


def write_selection(
    out: Path,
    entries: list[LockEntry],
    wheels: list[Path],
    lock: Path,
    python_version: str | None,
    platforms: list[str],
) -> None:
    """Write ``requirements.txt`` (the exact pins in this wheelhouse, each with the sha256 of
    its wheel here) and ``SHA256SUMS``."""
    lines = [
        f"# Wheelhouse of {lock.name} for Python {python_version or 'of the builder'} "
        f"{' '.join(platforms) or '(this platform)'}; built by tools/build-bundle.",
        *(f"{e.pin} --hash=sha256:{wheel_sha256(w)}" for e, w in zip(entries, wheels, strict=True)),
    ]
    (out / "requirements.txt").write_text("\n".join(lines) + "\n")
    (out / "SHA256SUMS").write_text("".join(f"{wheel_sha256(w)}  {w.name}\n" for w in wheels))


# ---------------------------------------------------------------------------------------
# Pack: site tree -> tar.xz -> parts
# ---------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Parse ``56M``, ``1G``, ``4096`` (binary units) into bytes."""
    match = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not match:
        raise BundleError(f"'{text}' is not a size such as 56M")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def install_site(
    wheels: list[Path], site: Path, pip_python: str, python_version: str | None, platforms: list[str]
) -> None:
    """Install wheels, without dependencies and without byte-compiling, into the folder ``site``."""
    cmd = [
        pip_python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-warn-script-location",
        "--target",
        str(site),
    ]
    cmd += target_flags(python_version, platforms)
    cmd += [str(w) for w in wheels]
    subprocess.run(cmd, check=True, env=isolated_pip_env())


def tree_bytes(path: Path) -> int:
    """Total size of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# What every packed site tree leaves out besides the caller's patterns: console scripts (written again
# on the target) and bytecode.
ALWAYS_STRIPPED = ["bin", "**/__pycache__"]


def strip_site(site: Path, patterns: Iterable[str]) -> dict[str, int]:
    """Delete console scripts, ``__pycache__`` and every path matching ``patterns`` (globs
    relative to ``site``); return the bytes removed per pattern. A pattern that matches
    nothing is reported with 0 so a stale pattern is noticed."""
    removed: dict[str, int] = {}
    for pattern in [*ALWAYS_STRIPPED, *patterns]:
        total = 0
        for path in sorted(site.glob(pattern), key=lambda p: len(p.parts), reverse=True):
            if not path.exists():
                continue
            if path.is_dir() and not path.is_symlink():
                total += tree_bytes(path)
                shutil.rmtree(path)
            else:
                total += path.lstat().st_size
                path.unlink()
        removed[pattern] = total
    return removed


def split_stream(stream: BinaryIO, out: Path, part_size: int, stem: str = ARCHIVE_NAME) -> dict:
    """Copy ``stream`` into ``<stem>.partNNN`` files of at most ``part_size`` bytes.

    Returns ``{"archive": stem, "bytes": n, "sha256": whole, "parts": [{name, bytes, sha256}]}``.
    """
    if part_size < 1:
        raise BundleError("the part size must be at least 1 byte")
    whole = hashlib.sha256()
    parts: list[dict] = []
    total = 0
    buf = stream.read(min(part_size, 1 << 20))
    while buf:
        name = f"{stem}.part{len(parts):03d}"
        digest, size = hashlib.sha256(), 0
        with (out / name).open("wb") as fh:
            while buf:
                fh.write(buf)
                digest.update(buf)
                whole.update(buf)
                size += len(buf)
                if size >= part_size:
                    break
                buf = stream.read(min(part_size - size, 1 << 20))
        parts.append({"name": name, "bytes": size, "sha256": digest.hexdigest()})
        total += size
        buf = stream.read(min(part_size, 1 << 20))
    return {"archive": stem, "bytes": total, "sha256": whole.hexdigest(), "parts": parts}


def verify_part(path: Path, expected_sha256: str) -> None:
    """Raise if a part's sha256 differs from the manifest."""
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise BundleError(f"{path.name} is corrupt: sha256 {actual[:12]} instead of {expected_sha256[:12]}")


def iter_joined(folder: Path, manifest: dict) -> Iterator[bytes]:
    """Yield the archive's bytes from the parts in ``folder``, checking every part and the whole."""
    whole = hashlib.sha256()
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            raise BundleError(f"part {part['name']} is missing from {folder}")
        verify_part(path, part["sha256"])
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                whole.update(block)
                yield block
    if whole.hexdigest() != manifest["sha256"]:
        raise BundleError(f"the joined {manifest['archive']} does not match its sha256")


def join_parts(folder: Path, manifest: dict, dest: Path) -> Path:
    """Reassemble the parts in ``folder`` into ``dest`` and verify it; return ``dest``."""
    with dest.open("wb") as fh:
        for block in iter_joined(folder, manifest):
            fh.write(block)
    return dest


def pack(site: Path, out: Path, part_size: int, xz_threads: int, xz_level: int) -> dict:
    """``tar`` the folder ``site`` (members ``site/...``, sorted, owner 0) through ``xz`` into parts."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f"{ARCHIVE_NAME}.part*"):
        stale.unlink()
    tar = subprocess.Popen(
        [
            "tar",
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
            str(site.parent),
            "-cf",
            "-",
            site.name,
        ],
        stdout=subprocess.PIPE,
    )
    xz = subprocess.Popen(["xz", f"-T{xz_threads}", f"-{xz_level}", "-c"], stdin=tar.stdout, stdout=subprocess.PIPE)
    assert tar.stdout is not None and xz.stdout is not None
    tar.stdout.close()
    result = split_stream(xz.stdout, out, part_size)
    if xz.wait() or tar.wait():
        raise BundleError(f"tar | xz failed (tar {tar.returncode}, xz {xz.returncode})")
    return result


def build_pack(
    entries: list[LockEntry],
    wheels: list[Path],
    dest: Path,
    *,
    lock: Path,
    python_version: str | None,
    platforms: list[str],
    pip_python: str,
    strip: list[str],
    part_size: int,
    xz_threads: int,
    xz_level: int,
    dropped: dict[str, str],
) -> dict:
    """Install, strip, tar, xz and split; write ``dest/pack.json`` and return it."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bundle-site-", dir=dest.parent) as tmp:
        site = Path(tmp) / "site"
        install_site(wheels, site, pip_python, python_version, platforms)
        installed = tree_bytes(site)
        removed = strip_site(site, strip)
        t_installed = time.monotonic()
        archive = pack(site, dest, part_size, xz_threads, xz_level)
        manifest = {
            **archive,
            "lock": lock.name,
            "lock_sha256": sha256_file(lock),
            "python_version": python_version,
            "platforms": platforms,
            "packages": [e.pin for e in entries],
            "left_out": dropped,
            "installed_bytes": installed,
            "stripped_bytes": removed,
            "site_bytes": installed - sum(removed.values()),
            "seconds": {
                "install_strip": round(t_installed - t0, 1),
                "tar_xz_split": round(time.monotonic() - t_installed, 1),
            },
        }
    (dest / PACK_MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def interpreter_version(path: str) -> str | None:
    """``X.Y`` of an interpreter, or None when it does not run (e.g. an inactive pyenv shim)."""
    argv = [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_interpreter(version: str) -> str:
    """A working ``pythonX.Y``: on PATH, else in pyenv's versions folder; raise if none runs."""
    candidates = [shutil.which(f"python{version}") or ""]
    candidates += [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]
    for candidate in candidates:
        if candidate and interpreter_version(candidate) == version:
            return candidate
    raise BundleError(f"no working python{version} interpreter found; name one with --pip-python or --python")


def default_pip_python(python_version: str | None) -> str:
    """A working ``pythonX.Y`` for the target if there is one, else this interpreter (pip then
    gets the target flags either way)."""
    if python_version:
        try:
            return find_interpreter(python_version)
        except BundleError:
            pass
    return sys.executable


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lock", required=True, type=Path, help="lock file (name==version per line)")
    ap.add_argument("--out", required=True, type=Path, help="wheelhouse directory to fill")
    ap.add_argument("--python-version", help="target Python, e.g. 3.12 (default: this interpreter)")
    each = {"action": "append", "default": []}  # a repeatable option
    ap.add_argument(
        "--platform",
        **each,
        help="target platform tag, e.g. manylinux_2_34_x86_64 (older manylinux tags are added; repeatable)",
    )
    ap.add_argument("--index-url", help="package index (default: pip's configuration)")
    pattern = {**each, "metavar": "PATTERN"}
    ap.add_argument(
        "--exclude", **pattern, help="leave out matching packages, e.g. 'torch,triton,nvidia-*' (repeatable)"
    )
    ap.add_argument(
        "--exclude-file", type=Path, **each, help="file with one exclude pattern per line (# comments allowed)"
    )
    ap.add_argument("--keep", **pattern, help="keep matching packages even if excluded or orphaned (repeatable)")
    ap.add_argument("--only", **pattern, help="select exactly the matching packages (no pruning; repeatable)")
    ap.add_argument("--no-prune", action="store_true", help="keep packages that only excluded packages need")
    ap.add_argument("--list", action="store_true", help="print the selection and exit without downloading")
    pk = ap.add_argument_group("packing for another machine")
    pk.add_argument("--pack", type=Path, metavar="DIR", help="write site.tar.xz parts and pack.json here")
    pk.add_argument(
        "--pip-python",
        help="interpreter whose pip installs the site tree (default: "
        "pythonX.Y of --python-version if found, else this one)",
    )
    pk.add_argument(
        "--strip",
        **each,
        metavar="GLOB",
        help="delete this glob (relative to the site tree) before packing (repeatable)",
    )
    pk.add_argument(
        "--part-size", help="split the archive into parts of at most this size, e.g. 56M (default: one part)"
    )
    pk.add_argument("--xz-threads", type=int, default=2, help="xz -T (default 2)")
    pk.add_argument("--xz-level", type=int, default=6, choices=range(0, 10), help="xz preset (default 6)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, select, download and optionally pack."""
    args = build_parser().parse_args(argv)
    try:
        entries = entries_for_target(parse_lock_text(args.lock.read_text(), str(args.lock)), args.python_version)
        exclude = split_patterns(args.exclude)
        for path in args.exclude_file:
            exclude += split_patterns(line.split("#", 1)[0] for line in path.read_text().splitlines())
        chosen, dropped = select(
            entries, exclude, split_patterns(args.keep), split_patterns(args.only), prune=not args.no_prune
        )
        if args.list:
            for e in chosen:
                print(e.pin)
            for name, why in sorted(dropped.items()):
                print(f"# left out {name}: {why}", file=sys.stderr)
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        pins = [e.pin for e in chosen]
        download(chosen, args.out, args.python_version, args.platform, args.index_url, str(args.lock))
        wheels = wheels_for(chosen, args.out)
        write_selection(args.out, chosen, wheels, args.lock, args.python_version, args.platform)
        size = sum(w.stat().st_size for w in wheels)
        print(
            f"{len(pins)} pinned packages from {args.lock} -> {args.out} "
            f"({size / 2**20:.0f} MiB of wheels; {len(dropped)} left out)"
        )
        if args.pack:
            manifest = build_pack(
                chosen,
                wheels,
                args.pack,
                lock=args.lock,
                python_version=args.python_version,
                platforms=args.platform,
                pip_python=args.pip_python or default_pip_python(args.python_version),
                strip=args.strip,
                part_size=parse_size(args.part_size) if args.part_size else WHOLE,
                xz_threads=args.xz_threads,
                xz_level=args.xz_level,
                dropped=dropped,
            )
            print(
                f"packed {manifest['site_bytes'] / 2**20:.0f} MiB of site tree into "
                f"{len(manifest['parts'])} part(s), {manifest['bytes'] / 2**20:.1f} MiB, in {args.pack}"
            )
    except (BundleError, OSError) as exc:
        print(f"build-bundle: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"build-bundle: {exc.cmd[0]} {exc.cmd[1:4]} failed with exit code {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
