"""Resolve a profile's lock file (every package pinned ==) from package metadata alone.

Kept instead of ``uv pip compile --generate-hashes``: uv resolves faster but hashes every file of a
version, for every platform, and writes neither this tool's per-Python markers nor the header
``--from-lock`` reads (docs/architecture.md, 'Hand-written code beside a library or builtin').

For each target Python, pip's resolver runs under that Python's interpreter with
``install --dry-run --ignore-installed --report --only-binary=:all:`` and target platform
tags, so it installs nothing; it reads metadata (PEP 658) where the index serves it, and
otherwise downloads the wheel to read it (a few GB for the SGLang profile: about 3 minutes).
The results are merged into one lock: a package pinned the same for every target gets one
entry, one that differs gets one entry per version with a ``python_version`` marker. Each line says which
packages need it (``# via ...``), so ``tools/build-bundle --exclude`` can prune orphans.
The header records the inputs; ``--from-lock`` regenerates a lock from its own header.

    tools/lock-profile --out roles/ml_env/files/locks/sglang-0.5.11.txt \\
        --python 3.10 --python 3.11 --python 3.12 --platform manylinux_2_34_x86_64 \\
        --title "SGLang profile: SGLang 0.5.11 on Linux x86_64 with NVIDIA GPUs" \\
        sglang==0.5.11 kernels==0.12.3 torch==2.11.0
    tools/lock-profile --from-lock roles/ml_env/files/locks/sglang-0.5.11.txt

The resolver sees PyPI (``--index-url``) and not this machine's pip configuration
(find-links, extra indexes, constraints); ``PIP_CERT`` is honoured.

Hashes. Every line carries ``--hash=sha256:...`` for each wheel file pip picks for it, one
per target (each Python of the header on the header's platform; the union when they
differ), from the index's file hashes in pip's report (``download_info``). ml_env installs
with ``--require-hashes``, so a file that is not one of them is refused. A line with
hashes is continued with `` \\`` and its ``# via`` comment is on the line after its hashes
(a comment before a ``\\`` would hide the hashes from pip)::

    numpy==2.4.6 ; python_version >= "3.11" \\
        --hash=sha256:0f3c... \\
        --hash=sha256:9a1b...
        # via sglang, torch

``--keep-pins`` (with ``--from-lock``) resolves with the lock's own pins as constraints, so
a regeneration refreshes hashes and ``# via`` but never a version (it fails when the pins no
longer resolve). ``--hash-only LOCK`` resolves nothing: it writes the hashes of the files pip
picks for the pins as they are, every other line kept; it is how a lock written by hand
gets its hashes. Its targets are the header's Pythons on its platform; a lock without a
``# python:`` header (a hand-written one) is hashed for this interpreter on this machine
(with this machine's pip configuration: find-links, extra indexes, e.g. a local CPU torch)
and, if it has a ``# platform:`` header, also for that platform. A lock with an ``# index:``
header is hashed against that index alone::

    tools/lock-profile --from-lock roles/ml_env/files/locks/sglang-0.5.11.txt --keep-pins
    tools/lock-profile --hash-only roles/ml_env/files/locks/transformers-cpu.txt
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_PYTHONS = ["3.10", "3.11", "3.12"]
BundleError = bundle.BundleError


def run_report(
    interpreter: str, args: list[str], workdir: Path, what: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``pip install --dry-run --report`` with ``args`` under ``interpreter``; return the report.

    ``what`` says what pip resolves, for the error; ``env`` defaults to one without this
    machine's pip configuration.
    """
    tag = hashlib.sha256(what.encode()).hexdigest()[:12]  # one file per target
    report = workdir / f"report-{tag}.json"
    cmd = [
        interpreter,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        "--target",
        str(workdir / f"target-{tag}"),
        *args,
    ]
    done = subprocess.run(
        cmd, env=env if env is not None else bundle.isolated_pip_env(), capture_output=True, text=True
    )
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise BundleError(f"pip could not resolve {what}:\n{tail}")
    return json.loads(report.read_text())


def resolve(
    python: str,
    interpreter: str,
    requirements: list[str],
    platforms: list[str],
    index_url: str,
    workdir: Path,
    constraints: list[str] | None = None,
) -> dict[str, Any]:
    """Run pip's resolver for one target Python and return its ``--report`` JSON.

    ``constraints`` (``name==version`` lines) hold the resolution to those versions.
    """
    args = ["--index-url", index_url, *bundle.target_flags(python, platforms)]
    if constraints is not None:
        path = workdir / f"constraints-{python}.txt"
        path.write_text("".join(f"{c}\n" for c in constraints))
        args += ["--constraint", str(path)]
    return run_report(interpreter, [*args, *requirements], workdir, f"{' '.join(requirements)} for Python {python}")


def file_hashes(item: dict[str, Any]) -> set[str]:
    """``{"sha256:<hex>"}`` of the file pip picked for one report item.

    From ``download_info.archive_info.hashes`` (or the older ``hash``, ``sha256=<hex>``), which
    pip takes from the index; a local file (``file://``, e.g. a find-links folder) is read. An
    item without download information (a hand-made report) has none.
    """
    info = item.get("download_info")
    if not info:
        return set()
    archive = info.get("archive_info")
    if archive is None:
        raise BundleError(f"{item['metadata']['name']} comes from {info.get('url')}, not a wheel file")
    digest = (archive.get("hashes") or {}).get("sha256")
    if not digest and str(archive.get("hash", "")).startswith("sha256="):
        digest = archive["hash"].split("=", 1)[1]
    url = info.get("url", "")
    if not digest and url.startswith("file:"):
        digest = bundle.sha256_file(Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)))
    if not digest:
        raise BundleError(f"the index gives no sha256 for {url}: pip could not check that file, so it cannot be locked")
    return {f"sha256:{digest}"}


def _requirement_class():  # noqa: ANN202
    """``packaging.requirements.Requirement`` (or pip's vendored copy)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    return Requirement


def graph_from_report(report: dict[str, Any]) -> tuple[dict[str, tuple[str, str]], dict[str, set[str]], set[str]]:
    """From a pip report: ``{key: (name, version)}``, ``{key: parents}`` and the requested keys.

    The edges are found the way pip walked them: from the requested packages (with their
    extras), each dependency whose marker holds for the report's environment under no
    extra or one of the parent's active extras is an edge, and it activates the extras the
    requirement names on the child.
    """
    requirement = _requirement_class()
    pins: dict[str, tuple[str, str]] = {}
    requires: dict[str, list[Any]] = {}
    active: dict[str, set[str]] = {}
    for item in report["install"]:
        meta = item["metadata"]
        key = bundle.normalize_name(meta["name"])
        pins[key] = (meta["name"], meta["version"])
        requires[key] = [requirement(text) for text in meta.get("requires_dist") or []]
        if item.get("requested"):
            active[key] = set(item.get("requested_extras") or [])
    requested = set(active)
    parents: dict[str, set[str]] = {k: set() for k in pins}
    environment = dict(report["environment"])
    queue = list(active)
    while queue:
        parent = queue.pop()
        for req in requires[parent]:
            child = bundle.normalize_name(req.name)
            if child not in pins or child == parent:
                continue
            extras = [""] + sorted(active[parent])
            if req.marker is not None and not any(req.marker.evaluate({**environment, "extra": e}) for e in extras):
                continue
            parents[child].add(parent)
            new = set(req.extras) - active.get(child, set())
            if child not in active or new:
                active.setdefault(child, set()).update(new)
                queue.append(child)
    unreached = sorted(set(pins) - set(active))
    if unreached:
        raise BundleError(f"pip's report installs packages no requirement leads to: {', '.join(unreached)}")
    return pins, parents, requested


def marker_for(subset: list[str], targets: list[str]) -> str:
    """A ``python_version`` marker true for ``subset`` of the sorted ``targets``.

    Contiguous runs become open-ended ranges (so the lines of one package partition every
    Python version), anything else an ``or`` of equalities.
    """
    if subset == targets:
        return ""
    index = [targets.index(v) for v in subset]
    if index == list(range(index[0], index[-1] + 1)):
        clauses = []
        if index[0] > 0:
            clauses.append(f'python_version >= "{subset[0]}"')
        if index[-1] < len(targets) - 1:
            clauses.append(f'python_version < "{targets[index[-1] + 1]}"')
        return " and ".join(clauses)
    return " or ".join(f'python_version == "{v}"' for v in subset)


def version_key(version: str) -> tuple[int, ...]:
    """Sort key for ``3.10`` style versions."""
    return tuple(int(x) for x in version.split("."))


def merge(reports: dict[str, dict[str, Any]]) -> list[str]:
    """Merge per-Python reports into lock lines (sorted by name), each with the sha256 of the
    file pip picked for every Python that installs that version."""
    targets = sorted(reports, key=version_key)
    graphs = {py: graph_from_report(rep) for py, rep in reports.items()}
    files: dict[tuple[str, str], set[str]] = {}
    for report in reports.values():
        for item in report["install"]:
            pin = (bundle.normalize_name(item["metadata"]["name"]), item["metadata"]["version"])
            files.setdefault(pin, set()).update(file_hashes(item))
    keys = sorted({k for pins, _, _ in graphs.values() for k in pins})
    lines: list[str] = []
    for key in keys:
        by_version: dict[tuple[str, str], list[str]] = {}
        parents: set[str] = set()
        requested = False
        for py in targets:
            pins, edges, req = graphs[py]
            if key in pins:
                by_version.setdefault(pins[key], []).append(py)
                parents |= edges[key]
                requested |= key in req
        via = ", ".join(sorted(parents))
        comment = ("requested" + (f" (also via {via})" if via else "")) if requested else f"via {via}"
        for (name, version), pys in sorted(by_version.items(), key=lambda kv: version_key(kv[1][0])):
            entry = bundle.LockEntry(name, version, marker_for(pys, targets), (), tuple(files[(key, version)]))
            lines.append(bundle.format_entry(entry, comment))
    return lines


def check(text: str, reports: dict[str, dict[str, Any]]) -> None:
    """Re-read the written lock for each target Python and compare with pip's resolution:
    the same versions, and the file pip picked among the line's hashes."""
    entries = bundle.parse_lock_text(text)
    for py, report in reports.items():
        chosen = {e.key: e for e in bundle.entries_for_target(entries, py)}
        got = {k: e.version for k, e in chosen.items()}
        want = {bundle.normalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise BundleError(f"the merged lock does not reproduce the resolution for Python {py}: {diff[:6]}")
        for item in report["install"]:
            entry = chosen[bundle.normalize_name(item["metadata"]["name"])]
            if not file_hashes(item) <= set(entry.hashes):
                raise BundleError(f"the lock line of {entry.pin} lacks the hash of the file pip picks for Python {py}")


def render(
    title: str,
    requirements: list[str],
    pythons: list[str],
    platforms: list[str],
    index_url: str,
    lines: list[str],
    out: Path,
) -> str:
    """The lock's full text: header (``# key: value`` lines are read back by --from-lock), then pins."""
    header = [
        f"# Lock for the {title}.",
        "# Every package is pinned with == and by the sha256 of each wheel file pip picks for it (one per",
        "# Python below on the platform below); ml_env installs exactly this set (--no-deps --require-hashes).",
        "# Generated by tools/lock-profile from the index's metadata and file hashes. Do not edit;",
        f"# regenerate with: tools/lock-profile --from-lock {out} [--keep-pins]",
        "# Lines with a python_version marker differ between the Python versions below; pip",
        "# evaluates the markers itself. '# via' names the packages that need a line's package.",
        f"# title: {title}",
        f"# requirements: {' '.join(requirements)}",
        f"# python: {' '.join(pythons)}",
        f"# platform: {' '.join(platforms)}",
        f"# index: {index_url}",
        f"# generated: {datetime.date.today().isoformat()}",
    ]
    return "\n".join(header + lines) + "\n"


def held_pins(old: list[bundle.LockEntry], reports: dict[str, dict[str, Any]], source: str) -> None:
    """Refuse a resolution (``--keep-pins``) whose versions differ from the lock's for any Python."""
    for py, report in reports.items():
        want = {e.key: e.version for e in bundle.entries_for_target(old, py)}
        got = {bundle.normalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise BundleError(
                f"with the pins of {source} as constraints pip resolves other versions for Python {py}: {diff[:6]}"
            )


# ---------------------------------------------------------------------------------------
# --hash-only: the hashes of an existing lock's pins, nothing resolved
# ---------------------------------------------------------------------------------------


def picked_files(
    interpreter: str,
    python: str,
    platforms: list[str],
    entries: list[bundle.LockEntry],
    pip_args: list[str],
    env: dict[str, str],
    workdir: Path,
    tag: str,
) -> dict[tuple[str, str], set[str]]:
    """``{(name, version): {sha256:...}}`` of the files pip picks for ``entries`` (already
    selected for ``python``) on one target; no ``platforms``: this machine's own."""
    pins = workdir / f"pins-{hashlib.sha256(tag.encode()).hexdigest()[:12]}.txt"
    pins.write_text("".join(f"{e.pin}\n" for e in entries))
    flags = bundle.target_flags(python, platforms) if platforms else ["--only-binary=:all:"]
    report = run_report(
        interpreter, [*pip_args, *flags, "--no-deps", "-r", str(pins)], workdir, f"the pins for {tag}", env
    )
    files: dict[tuple[str, str], set[str]] = {}
    by_key = {e.key: e for e in entries}
    for item in report["install"]:
        entry = by_key.get(bundle.normalize_name(item["metadata"]["name"]))
        if entry is None or not same_version(entry.version, item["metadata"]["version"]):
            raise BundleError(
                f"pip picks {item['metadata']['name']} {item['metadata']['version']} for {tag}, not a pin"
            )
        hashes = file_hashes(item)
        if not hashes:
            raise BundleError(f"pip's report for {tag} has no file for {entry.pin}")
        files.setdefault((entry.key, entry.version), set()).update(hashes)
    missing = [e.pin for e in entries if (e.key, e.version) not in files]
    if missing:
        raise BundleError(f"pip picks no file for {', '.join(missing)} for {tag}")
    return files


def same_version(a: str, b: str) -> bool:
    """Whether two version strings name the same version (``1.0`` and ``1.0.0``)."""
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version  # type: ignore[no-redef]
    return Version(a) == Version(b)


def with_hashes(text: str, files: dict[tuple[str, str], set[str]], source: str) -> str:
    """``text`` with each requirement's hashes set to ``files[(name, version)]``; comments,
    blank lines, pins and markers kept (a comment at a line's end moves below its hashes)."""
    out: list[str] = []
    for number, line in bundle.logical_lines(text):
        if not line.strip() or line.strip().startswith("#"):
            out.append(line)
            continue
        entry, comment = bundle.parse_requirement(line, source, number)
        hashes = files.get((entry.key, entry.version))
        if not hashes:
            raise BundleError(f"{source}:{number}: no target of this lock installs {entry.pin}; nothing to hash")
        out.append(bundle.format_entry(replace(entry, hashes=tuple(hashes)), comment))
    return "\n".join(out) + "\n"


def hash_only(
    path: Path,
    pythons_spec: list[str],
    platforms: list[str],
    index_url: str | None,
    workdir: Path,
) -> tuple[str, list[str]]:
    """The text of the lock at ``path`` with the hashes of the files pip picks for its pins,
    and the targets hashed. Nothing is resolved: the pins are installed as they are (--no-deps)."""
    text = path.read_text()
    header = bundle.lock_header(text)
    entries = bundle.parse_lock_text(text, str(path))
    pythons_spec = pythons_spec or header.get("python", "").split()
    platforms = platforms or header.get("platform", "").split()
    index_url = index_url or header.get("index")
    if index_url:  # that index alone, as tools/lock-profile resolved it
        env, pip_args = bundle.isolated_pip_env(), ["--index-url", index_url]
    else:  # this machine's pip configuration, as make tools-venv and tools/build-bundle install it
        env, pip_args = dict(os.environ), []
    targets: list[tuple[str, str, list[str]]] = []
    if pythons_spec:
        for spec in pythons_spec:
            version, _, exe = spec.partition("=")
            exe = exe or bundle.find_interpreter(version)
            targets += [(version, exe, platforms)] if platforms else [(version, exe, [])]
    else:  # a hand-written lock: the files this machine installs, and those of its platform
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        targets += [(version, sys.executable, [])] + ([(version, sys.executable, platforms)] if platforms else [])
    files: dict[tuple[str, str], set[str]] = {}
    names: list[str] = []
    for python, exe, plats in targets:
        tag = f"Python {python} on {' '.join(plats) or 'this machine'}"
        chosen = bundle.entries_for_target(entries, python)
        for pin, hashes in picked_files(exe, python, plats, chosen, pip_args, env, workdir, tag).items():
            files.setdefault(pin, set()).update(hashes)
        names.append(tag)
    new = with_hashes(text, files, str(path))
    before = [(e.key, e.version, e.marker) for e in entries]
    if [(e.key, e.version, e.marker) for e in bundle.parse_lock_text(new, str(path))] != before:
        raise BundleError(f"adding hashes to {path} would change its pins; nothing written")
    return new, names


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requirements", nargs="*", help="top-level requirements, e.g. sglang==0.5.11")
    ap.add_argument("--out", type=Path, help="lock file to write (default with --from-lock/--hash-only: that file)")
    ap.add_argument(
        "--from-lock", type=Path, help="take requirements, Pythons, platforms, index and title from this lock's header"
    )
    ap.add_argument(
        "--keep-pins",
        action="store_true",
        help="with --from-lock: resolve with that lock's pins as constraints (only hashes and '# via' change)",
    )
    ap.add_argument(
        "--hash-only",
        type=Path,
        metavar="LOCK",
        help="write the hashes of the files pip picks for LOCK's pins as they are; resolve nothing",
    )
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="X.Y[=PATH]",
        help=f"target Python, optionally with its interpreter (default {' '.join(DEFAULT_PYTHONS)})",
    )
    ap.add_argument(
        "--platform",
        action="append",
        default=[],
        help="newest platform tag, e.g. manylinux_2_34_x86_64 (older manylinux tags are added)",
    )
    ap.add_argument("--index-url", help=f"index to resolve against (default {DEFAULT_INDEX})")
    ap.add_argument("--title", help="what the lock is for (first header line)")
    return ap


def main_hash_only(args: argparse.Namespace) -> int:
    """``--hash-only LOCK``."""
    out = args.out or args.hash_only
    try:
        with tempfile.TemporaryDirectory(prefix="lock-profile-") as tmp:
            text, targets = hash_only(args.hash_only, args.python, args.platform, args.index_url, Path(tmp))
    except BundleError as exc:
        print(f"lock-profile: {exc}", file=sys.stderr)
        return 1
    out.write_text(text)
    count = sum(len(e.hashes) for e in bundle.parse_lock_text(text))
    print(f"wrote {out}: {count} hashes for {'; '.join(targets)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Resolve for every target Python, merge, self-check and write the lock."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.hash_only:
        if args.from_lock or args.requirements or args.keep_pins:
            ap.error("--hash-only takes a lock as it is: no --from-lock, --keep-pins or requirements")
        return main_hash_only(args)
    if args.keep_pins and not args.from_lock:
        ap.error("--keep-pins keeps the pins of --from-lock LOCK")
    header: dict[str, str] = {}
    if args.from_lock:
        header = bundle.lock_header(args.from_lock.read_text())
    requirements = args.requirements or header.get("requirements", "").split()
    if not requirements:
        ap.error("name the top-level requirements, or --from-lock a lock that records them")
    out = args.out or args.from_lock
    if out is None:
        ap.error("--out is required without --from-lock")
    pythons_spec = args.python or header.get("python", "").split() or DEFAULT_PYTHONS
    platforms = args.platform or header.get("platform", "").split()
    index_url = args.index_url or header.get("index") or DEFAULT_INDEX
    title = args.title or header.get("title") or f"profile of {' '.join(requirements)}"
    try:
        old = bundle.parse_lock_text(args.from_lock.read_text(), str(args.from_lock)) if args.keep_pins else []
        interpreters = {}
        for spec in pythons_spec:
            version, _, path = spec.partition("=")
            interpreters[version] = path or bundle.find_interpreter(version)
        with tempfile.TemporaryDirectory(prefix="lock-profile-") as tmp, ThreadPoolExecutor(len(interpreters)) as pool:
            futures = {
                py: pool.submit(
                    resolve,
                    py,
                    exe,
                    requirements,
                    platforms,
                    index_url,
                    Path(tmp),
                    [e.pin for e in bundle.entries_for_target(old, py)] if args.keep_pins else None,
                )
                for py, exe in interpreters.items()
            }
            reports = {py: f.result() for py, f in futures.items()}
        if args.keep_pins:
            held_pins(old, reports, str(args.from_lock))
        pythons = sorted(reports, key=version_key)
        text = render(title, requirements, pythons, platforms, index_url, merge(reports), out)
        check(text, reports)
    except BundleError as exc:
        print(f"lock-profile: {exc}", file=sys.stderr)
        return 1
    out.write_text(text)
    counts = ", ".join(f"{py}: {len(reports[py]['install'])}" for py in pythons)
    hashes = sum(len(e.hashes) for e in bundle.parse_lock_text(text))
    print(f"wrote {out}: packages per Python {counts}; {hashes} hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
