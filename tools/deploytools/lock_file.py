"""Lock files of the engine profiles: every package pinned with == and by sha256 (docs/locks.md).

Parsing and writing the lines pip reads (continued lines, ``--hash`` options, markers, ``# via``
comments) and the header ``tools/lock-profile`` writes; ``build_bundle`` and ``lock_profile`` use
them. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path


class BundleError(Exception):
    """A problem the user must fix; the message is one sentence."""


# ---------------------------------------------------------------------------------------
# Lock files
# ---------------------------------------------------------------------------------------


def normalize_name(name: str) -> str:
    """Return the PEP 503 normalised form of a distribution name (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockEntry:
    """One pinned requirement of a lock file (one line, or one line continued with ``\\``)."""

    name: str
    version: str
    marker: str = ""
    via: tuple[str, ...] = ()
    # ``sha256:<hex>`` of every wheel file pip may install for this line (empty: not hashed).
    hashes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The normalised distribution name."""
        return normalize_name(self.name)

    @property
    def pin(self) -> str:
        """``name==version`` without marker."""
        return f"{self.name}=={self.version}"

    def requirement(self, marker: bool = True) -> str:
        """The line for pip on one line: ``name==version[ ; marker][ --hash=sha256:...]``."""
        text = self.pin + (f" ; {self.marker}" if marker and self.marker else "")
        return " ".join([text, *(f"--hash={h}" for h in self.hashes)])


_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[^\s;#]+)\s*"
    r"(?:;(?P<marker>[^#]*))?(?:#(?P<comment>.*))?$"
)
# pip's own rule for a comment in a requirements file: '#' at the start or after whitespace.
_COMMENT = re.compile(r"(^|\s+)#.*$")
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(first line number, line)`` the way pip reads a requirements file: a line ending in
    ``\\`` goes on with the next one; a comment line never continues (and ends a continuation)."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        comment = _COMMENT.match(raw) is not None
        if raw.endswith("\\") and not comment:
            start = start if pending else number
            pending.append(raw[:-1])
            continue
        if pending and not comment:
            yield start, " ".join([*pending, raw])
        elif pending:  # pip drops a comment that ends a continuation; it is yielded on its own
            yield start, " ".join(pending)
            yield number, raw
        else:
            yield number, raw
        pending = []
    if pending:
        yield start, " ".join(pending)


def via_of(comment: str) -> tuple[str, ...]:
    """The parents a ``via a, b`` comment names (``requested ...``: none, never pruned)."""
    if not comment.startswith("via "):
        return ()
    return tuple(normalize_name(v.strip()) for v in comment[4:].split(",") if v.strip())


def parse_requirement(line: str, source: str = "lock", number: int = 0) -> tuple[LockEntry, str]:
    """One logical requirement line -> ``(entry, its inline comment)``.

    ``name==version [; marker] [--hash=sha256:HEX ...] [# comment]``; any option but
    ``--hash`` is refused (a lock is a list of exact files, not a pip command line).
    """
    comment = ""
    found = _COMMENT.search(line)
    if found:
        comment = found.group(0).strip()[1:].strip()
        line = line[: found.start()]
    words = line.split()
    first = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    requirement, options = " ".join(words[:first]), words[first:]
    match = _LINE.match(requirement)
    if not match:
        raise BundleError(f"{source}:{number}: '{line.strip()}' is not pinned with ==; a lock pins every package")
    hashes: list[str] = []
    while options:
        option = options.pop(0)
        value = option[len("--hash=") :] if option.startswith("--hash=") else None
        if option == "--hash" and options:
            value = options.pop(0)
        if value is None or not _HASH.match(value):
            raise BundleError(
                f"{source}:{number}: '{option}' is not --hash=sha256:<64 hex digits>, the only option a lock line takes"
            )
        if value not in hashes:
            hashes.append(value)
    entry = LockEntry(
        match.group("name"), match.group("version"), (match.group("marker") or "").strip(), (), tuple(hashes)
    )
    return entry, comment


def parse_lock_text(text: str, source: str = "lock") -> list[LockEntry]:
    """Parse a lock's text into entries; every non-comment line must be ``name==version``.

    A requirement may go on over lines ending in ``\\`` with its ``--hash=sha256:...``
    options, as pip reads it. A ``# via a, b`` comment names the packages that need the
    line's package, and ``# requested`` marks a top-level requirement: at the end of the
    line, or on the indented comment line right after the requirement (after its hashes).
    """
    entries: list[LockEntry] = []
    commented = True  # whether the last entry has its comment (nothing to attach to yet)
    for number, line in logical_lines(text):
        stripped = line.strip()
        if not stripped:
            commented = True
            continue
        if stripped.startswith("#"):
            if not commented and line[:1].isspace():
                entries[-1] = replace(entries[-1], via=via_of(stripped[1:].strip()))
            commented = True
            continue
        entry, comment = parse_requirement(line, source, number)
        entries.append(replace(entry, via=via_of(comment)))
        commented = bool(comment)
    return entries


def format_entry(entry: LockEntry, comment: str = "") -> str:
    """A lock line as tools/lock-profile writes it: one line without hashes; with hashes,
    pip's continued form, one ``--hash`` per line and the comment on the line after them
    (a comment before a ``\\`` would swallow the hashes)."""
    first = entry.pin + (f" ; {entry.marker}" if entry.marker else "")
    if not entry.hashes:
        return first + (f"  # {comment}" if comment else "")
    lines = [first, *(f"    --hash={h}" for h in sorted(entry.hashes))]
    text = " \\\n".join(lines)
    return text + (f"\n    # {comment}" if comment else "")


def read_lock(path: Path) -> list[str]:
    """Return the ``name==version`` pins of a lock file (markers not evaluated)."""
    return [e.pin for e in parse_lock_text(path.read_text(), str(path))]


def lock_header(text: str) -> dict[str, str]:
    """Return the ``# key: value`` lines at the top of a lock (written by tools/lock-profile)."""
    header: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.startswith("#"):
            break
        match = re.match(r"#\s*([a-z][a-z-]*):\s*(.*)$", raw)
        if match:
            header[match.group(1)] = match.group(2).strip()
    return header
