"""Resolve a profile's lock file (every package pinned ==) from package metadata alone.

For each target Python, pip's resolver runs under that Python's interpreter with
``install --dry-run --ignore-installed --report --only-binary=:all:`` and target platform
tags, so it reads only metadata (PEP 658) and downloads no wheels. The results are merged
into one lock: a package pinned the same for every target gets a plain line, one that
differs gets one line per version with a ``python_version`` marker. Each line says which
packages need it (``# via ...``), so ``tools/build-bundle --exclude`` can prune orphans.
The header records the inputs; ``--from-lock`` regenerates a lock from its own header.

    tools/lock-profile --out roles/ml_env/files/locks/sglang-0.5.11.txt \\
        --python 3.10 --python 3.11 --python 3.12 --platform manylinux_2_34_x86_64 \\
        --title "SGLang profile: SGLang 0.5.11 on Linux x86_64 with NVIDIA GPUs" \\
        sglang==0.5.11 kernels==0.12.3 torch==2.11.0
    tools/lock-profile --from-lock roles/ml_env/files/locks/sglang-0.5.11.txt

The resolver sees PyPI (``--index-url``) and not this machine's pip configuration
(find-links, extra indexes, constraints); ``PIP_CERT`` is honoured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_PYTHONS = ["3.10", "3.11", "3.12"]
BundleError = bundle.BundleError


def resolve(
    python: str, interpreter: str, requirements: list[str], platforms: list[str], index_url: str, workdir: Path
) -> dict[str, Any]:
    """Run pip's resolver for one target Python and return its ``--report`` JSON."""
    report = workdir / f"report-{python}.json"
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
        str(workdir / f"target-{python}"),
        "--index-url",
        index_url,
        *bundle.target_flags(python, platforms),
        *requirements,
    ]
    done = subprocess.run(cmd, env=bundle.isolated_pip_env(), capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise BundleError(f"pip could not resolve {' '.join(requirements)} for Python {python}:\n{tail}")
    return json.loads(report.read_text())


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
    """Merge per-Python reports into lock lines (sorted by name)."""
    targets = sorted(reports, key=version_key)
    graphs = {py: graph_from_report(rep) for py, rep in reports.items()}
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
            marker = marker_for(pys, targets)
            lines.append(f"{name}=={version}" + (f" ; {marker}" if marker else "") + f"  # {comment}")
    return lines


def check(text: str, reports: dict[str, dict[str, Any]]) -> None:
    """Re-read the written lock for each target Python and compare with pip's resolution."""
    entries = bundle.parse_lock_text(text)
    for py, report in reports.items():
        got = {e.key: e.version for e in bundle.entries_for_target(entries, py)}
        want = {bundle.normalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise BundleError(f"the merged lock does not reproduce the resolution for Python {py}: {diff[:6]}")


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
        "# Every package is pinned with ==; ml_env installs exactly this set (--no-deps) and checks it.",
        "# Generated by tools/lock-profile from index metadata (no wheels downloaded). Do not edit;",
        f"# regenerate with: tools/lock-profile --from-lock {out}",
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


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requirements", nargs="*", help="top-level requirements, e.g. sglang==0.5.11")
    ap.add_argument("--out", type=Path, help="lock file to write (default with --from-lock: that file)")
    ap.add_argument(
        "--from-lock", type=Path, help="take requirements, Pythons, platforms, index and title from this lock's header"
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


def main(argv: list[str] | None = None) -> int:
    """Resolve for every target Python, merge, self-check and write the lock."""
    ap = build_parser()
    args = ap.parse_args(argv)
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
        interpreters = {}
        for spec in pythons_spec:
            version, _, path = spec.partition("=")
            interpreters[version] = path or bundle.find_interpreter(version)
        with tempfile.TemporaryDirectory(prefix="lock-profile-") as tmp, ThreadPoolExecutor(len(interpreters)) as pool:
            futures = {
                py: pool.submit(resolve, py, exe, requirements, platforms, index_url, Path(tmp))
                for py, exe in interpreters.items()
            }
            reports = {py: f.result() for py, f in futures.items()}
        pythons = sorted(reports, key=version_key)
        text = render(title, requirements, pythons, platforms, index_url, merge(reports), out)
        check(text, reports)
    except BundleError as exc:
        print(f"lock-profile: {exc}", file=sys.stderr)
        return 1
    out.write_text(text)
    counts = ", ".join(f"{py}: {len(reports[py]['install'])}" for py in pythons)
    print(f"wrote {out}: packages per Python {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
