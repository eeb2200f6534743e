"""The attacker of molecule/attacker: plants links where the accounts below root can write and the
playbooks touch, and proves that root changed nothing it was not declared to change.

Run as root on the scenario's host (``python3 -SE attacker.py COMMAND ...``), around every playbook
run of converge.yml:

``before STEP``
    Looks at the host as it is: which paths each attacker account (the service account, the by-hand
    user, an unrelated local user; those that exist) can replace or write, read from the file modes,
    owners and groups on the host, not from a list. At every path that an earlier step touched there
    (learned from the snapshots below) and that one of them can plant at, it plants, as that account,
    a link to the root-owned canary, moving what was there aside. Then it snapshots the paths the
    accounts can write and takes the manifest of every root-owned file (path, type, owner, group,
    mode, sha256 or link target) outside the paths the playbooks may write (``--declared``).
``guarded PATHS``
    Plants no more at ``PATHS`` (a JSON list): a playbook refused each, as a link where it needs its
    own file or directory, and changed nothing (the driver, run_steps.py, saw it and checked it).
``watch STEP``
    Runs during the step (started beside it): records every name created, written or removed in the
    directories the accounts can write, which a snapshot before and after misses when the step makes
    and removes a name within itself; ``after`` stops it and learns what it saw.
``after STEP``
    Takes the manifest and the snapshot of the writable paths again (one walk of the host, as before
    the step: the links still planted) and compares: every root-owned file added, removed or changed
    outside the declared paths is a finding; so is any change to the canary. Learns every path the step
    created, changed or removed where the accounts can write (and what the watch saw), for the next
    steps to plant at; takes out the links it planted (putting back what it moved aside). Prints the
    step's record (JSON), also kept in the state directory.

The state lives in a root-only directory (``--state``).
"""

from __future__ import annotations

import argparse
import fnmatch
import grp
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Kernel trees, not files a playbook writes (and /dev, of which only SHARED_DEVICE_DIRS).
NEVER_WALKED = ("/proc", "/sys")
# Device trees where any account can write (walked for the writable paths, not for the manifest).
SHARED_DEVICE_DIRS = ("/dev/shm", "/dev/mqueue")
ASIDE = ".attacker-aside"


class Account:
    """An account below root: its uid and every group it is in."""

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if name in g.gr_mem}

    def may(self, st: os.stat_result, bit: int) -> bool:
        """Whether the mode bits of ``st`` give this account ``bit`` (4 read, 2 write, 1 search)."""
        if st.st_uid == self.uid:
            return bool(st.st_mode >> 6 & bit)
        if st.st_gid in self.gids:
            return bool(st.st_mode >> 3 & bit)
        return bool(st.st_mode & bit)

    def may_replace(self, parent: os.stat_result, entry: os.stat_result | None) -> bool:
        """Whether the account can create, or move away, the name ``entry`` in the directory ``parent``
        (the sticky bit keeps others' names in /tmp theirs)."""
        if not self.may(parent, 2) or not self.may(parent, 1):
            return False
        if entry is None or not parent.st_mode & stat.S_ISVTX:
            return True
        return self.uid in (entry.st_uid, parent.st_uid)


def accounts(names: list[str]) -> list[Account]:
    """The accounts of ``names`` that exist on the host now (the service account comes with the deploy)."""
    found = []
    for name in names:
        try:
            found.append(Account(name))
        except KeyError:
            continue
    return found


def walk(skip: tuple[str, ...], top: str = "/", scratch: tuple[str, ...] = ()) -> Any:
    """Every path on the host below / (not following links) with its lstat and whether it is in a scratch
    tree (``scratch``, or below one); /proc and /sys are left out, and of /dev only its shared directories
    are walked (scratch); ``skip``: more trees left out; ``top``: where to start (a test's tree)."""
    stack = [(top, top in scratch)]
    while stack:
        directory, in_scratch = stack.pop()
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if path in skip or path in NEVER_WALKED:
                continue
            if path == "/dev":
                stack.extend((d, True) for d in SHARED_DEVICE_DIRS if d not in skip and os.path.isdir(d))
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            below = in_scratch or path in scratch
            yield path, st, below
            if stat.S_ISDIR(st.st_mode):
                stack.append((path, below))


def reachable(path: str, who: Account) -> bool:
    """Whether ``who`` can search every directory on the way to ``path``."""
    parts = Path(path).parents
    for parent in parts:
        try:
            if not who.may(os.stat(parent), 1):
                return False
        except OSError:
            return False
    return True


class Writable:
    """The paths some attacker can replace (its directory is theirs to write) or write (a file they may
    write): path -> [type, inode, size, mtime_ns, ctime_ns, uid, the accounts]; and every directory some
    attacker can make names in (an empty /run/lock too), where a step's new names are watched."""

    def __init__(self, who: list[Account]) -> None:
        self.who = who
        self.snapshot: dict[str, list[Any]] = {}
        self.into: list[str] = []
        self.parents: dict[str, os.stat_result] = {}
        self.search: dict[tuple[str, int], bool] = {}

    def add(self, path: str, st: os.stat_result) -> None:
        """Take in one path of the walk."""
        parent = os.path.dirname(path)
        if parent not in self.parents:
            try:
                self.parents[parent] = os.stat(parent)
            except OSError:
                return
        names = []
        makes_names = False
        for account in self.who:
            key = (parent, account.uid)
            if key not in self.search:
                self.search[key] = reachable(path, account)
            if not self.search[key]:
                continue
            writes_file = stat.S_ISREG(st.st_mode) and account.may(st, 2)
            if writes_file or account.may_replace(self.parents[parent], st):
                names.append(account.name)
            if stat.S_ISDIR(st.st_mode) and account.may(self.parents[parent], 1) and account.may_replace(st, None):
                makes_names = True
        if names:
            kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
            self.snapshot[path] = [kind, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, names]
        if makes_names:
            self.into.append(path)


def touched(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> set[str]:
    """The paths a step created, removed or changed among those the attackers can write."""
    changed = {p for p in before.keys() & after.keys() if before[p][:5] != after[p][:5]}
    return changed | (before.keys() ^ after.keys())


def sha256(path: str) -> str:
    """The sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Manifest:
    """Every root-owned path outside ``declared`` (glob patterns): path -> [type, uid, gid, mode, sha256 of
    a file or target of a link]. A file's sha256 is read again only when its inode, size, mtime or ctime
    moved (``cache``: what the last manifest read; ``done`` leaves this one's there)."""

    def __init__(self, declared: list[str], cache: dict[str, Any]) -> None:
        self.declared = declared
        self.cache = cache
        self.found: dict[str, list[Any]] = {}
        self.fresh: dict[str, Any] = {}

    def add(self, path: str, st: os.stat_result) -> None:
        """Take in one path of the walk."""
        if st.st_uid != 0 or any(fnmatch.fnmatchcase(path, pattern) for pattern in self.declared):
            return
        if stat.S_ISREG(st.st_mode):
            key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            kept = self.cache.get(path)
            if kept and kept[0] == key:
                content = kept[1]
            else:
                try:
                    content = sha256(path)
                except OSError as error:
                    content = f"unreadable: {error.strerror}"
            self.fresh[path] = [key, content]
            kind = "f"
        elif stat.S_ISLNK(st.st_mode):
            kind, content = "l", os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            kind, content = "d", ""
        else:
            kind, content = "o", ""
        self.found[path] = [kind, st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode)), content]

    def done(self) -> dict[str, list[Any]]:
        """The manifest; the cache now holds the sha256s it read."""
        self.cache.clear()
        self.cache.update(self.fresh)
        return self.found


# Trees of run-time scratch (sockets, temporary files): walked for the writable paths, not for the manifest.
SCRATCH = ("/run", "/tmp", "/var/tmp")


def survey(
    who: list[Account], skip: tuple[str, ...], declared: list[str], cache: dict[str, Any], top: str = "/"
) -> tuple[dict[str, list[Any]], list[str], dict[str, list[Any]]]:
    """One walk of the host (``skip``: trees left out; ``top``: where to start, a test's tree): what the
    attackers ``who`` can write and the directories they can make names in (Writable), and the manifest of
    root-owned files outside ``declared`` and the scratch trees (Manifest, with ``cache``)."""
    writable, listing = Writable(who), Manifest(declared, cache)
    for path, st, scratch in walk(skip, top, SCRATCH):
        writable.add(path, st)
        if not scratch:
            listing.add(path, st)
    return writable.snapshot, writable.into, listing.done()


# inotify(7): the events that name a path in a watched directory.
IN_MODIFY, IN_ATTRIB, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_ISDIR = 0x2, 0x4, 0x80, 0x100, 0x200, 0x40000000
WATCHED_EVENTS = IN_MODIFY | IN_ATTRIB | IN_MOVED_TO | IN_CREATE | IN_DELETE


def watch(directories: list[str], stop: Path, out: Path) -> None:
    """Every path created, moved in, written, changed or removed in ``directories`` (and in the
    directories made in them meanwhile), by anyone, until ``stop`` exists: written to ``out`` (JSON).
    What a snapshot before and after cannot see: a name a playbook makes and removes within a step."""
    import ctypes
    import select
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    watched: dict[int, str] = {}

    def add(directory: str) -> None:
        wd = libc.inotify_add_watch(fd, directory.encode(), WATCHED_EVENTS)
        if wd >= 0:
            watched[wd] = directory

    for directory in directories:
        add(directory)
    (stop.parent / "watching").touch()
    seen: set[str] = set()
    while not stop.exists():
        if not select.select([fd], [], [], 0.2)[0]:
            continue
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        offset = 0
        while offset < len(data):
            wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
            name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode(errors="surrogateescape")
            offset += 16 + length
            if wd in watched and name:
                path = os.path.join(watched[wd], name)
                seen.add(path)
                if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                    add(path)
    out.write_text(json.dumps(sorted(seen)))


PLANTER = r"""
import json, os, sys
canary, paths = sys.argv[1], json.load(sys.stdin)
done = []
for path in paths:
    parent = os.path.dirname(path)
    made = []
    try:
        missing = parent
        while not os.path.lexists(missing):
            made.insert(0, missing)
            missing = os.path.dirname(missing)
        own = os.lstat(missing).st_uid == os.getuid()
        for directory in made:
            os.mkdir(directory, 0o755)
        aside = None
        if os.path.lexists(path):
            # A second name for what was there, then the name removed: a process that holds the file
            # open sees it deleted (/proc/PID/fd reads "PATH (deleted)"), as after an account's rm + ln -s;
            # a directory, or a file the account may not link, is moved aside instead.
            aside = path + ".attacker-aside"
            try:
                os.link(path, aside, follow_symlinks=False)
            except OSError:
                os.rename(path, aside)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    os.unlink(aside)
                    raise
        try:
            os.symlink(canary, path)
        except OSError:
            if aside:
                os.rename(aside, path)
            raise
    except OSError:
        for directory in reversed(made):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        continue
    done.append({"path": path, "aside": aside, "made": made, "own": own})
print(json.dumps(done))
"""


def plant(paths: list[str], who: list[Account], canary: str) -> list[dict[str, Any]]:
    """A link to ``canary`` at each of ``paths``, planted by the first of ``who`` (the least trusted
    first) that can, as that account (setpriv): [{path, aside, made, own, by}]; own: the account owns the
    directory it planted in (its own to break), not a shared one such as /tmp."""
    planted: list[dict[str, Any]] = []
    left = list(paths)
    for account in who:
        if not left:
            break
        proc = subprocess.run(
            [
                "setpriv",
                f"--reuid={account.uid}",
                f"--regid={account.gid}",
                "--init-groups",
                "--reset-env",
                sys.executable,
                "-SE",
                "-c",
                PLANTER,
                canary,
            ],
            input=json.dumps(left),
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        )
        done = json.loads(proc.stdout)
        planted += [dict(item, by=account.name) for item in done]
        left = [p for p in left if p not in {item["path"] for item in done}]
    return planted


def unplant(planted: list[dict[str, Any]], canary: str) -> None:
    """Takes out the planted links and puts back what they moved aside (unless the step put something
    of its own there), then removes the directories the planting made (when empty)."""
    for item in planted:
        path, aside = item["path"], item["aside"]
        if os.path.islink(path) and os.readlink(path) == canary:
            os.unlink(path)
        if aside and os.path.lexists(aside):
            if os.path.lexists(path):
                if os.path.isdir(aside) and not os.path.islink(aside):
                    shutil.rmtree(aside)
                else:
                    os.unlink(aside)
            else:
                os.rename(aside, path)
        for directory in reversed(item["made"]):
            try:
                os.rmdir(directory)
            except OSError:
                pass


def canary_state(canary: str) -> list[Any]:
    """What must not change of the canary: its owner, mode and sha256."""
    st = os.lstat(canary)
    return [st.st_uid, oct(st.st_mode), sha256(canary)]


def differences(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Root-owned paths added, removed or changed between two manifests."""
    found = []
    for path in sorted(before.keys() | after.keys()):
        if before.get(path) != after.get(path):
            found.append({"path": path, "before": before.get(path), "after": after.get(path)})
    return found


def main() -> None:
    """Parse the command line and run ``before`` or ``after`` for one step."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["before", "watch", "after", "guarded"])
    parser.add_argument("step", help="the step's name; for guarded, a JSON list of paths")
    parser.add_argument("--state", default="/var/lib/attacker-harness")
    parser.add_argument("--canary", default="/etc/attacker-canary")
    parser.add_argument(
        "--accounts",
        required=True,
        help="the attackers, the least trusted first (comma-separated; absent ones skipped)",
    )
    parser.add_argument("--declared", default="[]", help="JSON list of glob patterns the playbooks may write as root")
    parser.add_argument("--no-plant", action="store_true", help="learn only (the first step)")
    args = parser.parse_args()
    state = Path(args.state)
    state.mkdir(mode=0o700, exist_ok=True)
    skip = (str(state),)
    who = accounts(args.accounts.split(","))
    declared = json.loads(args.declared)

    def load(name: str, default: Any) -> Any:
        path = state / name
        return json.loads(path.read_text()) if path.exists() else default

    def keep(name: str, value: Any) -> None:
        (state / name).write_text(json.dumps(value))

    if args.command == "guarded":
        keep("guarded.json", sorted(set(load("guarded.json", [])) | set(json.loads(args.step))))
        return
    cache = load("hashes.json", {})
    if args.command == "before":
        guarded = set(load("guarded.json", []))
        learned = sorted(p for p in load("learned.json", []) if p not in guarded and p != args.canary)
        planted = [] if args.no_plant else plant(learned, who, args.canary)
        keep("planted.json", planted)
        writable, into, listed = survey(who, skip, declared, cache)
        keep("writable.json", writable)
        # The directories the accounts can make names in: watched during the step (``watch``).
        keep("watch-dirs.json", sorted(into))
        for name in ("watch.stop", "watched.json", "watching"):
            (state / name).unlink(missing_ok=True)
        keep("manifest.json", listed)
        keep("canary.json", canary_state(args.canary))
        keep("hashes.json", cache)
        print(json.dumps({"step": args.step, "accounts": [a.name for a in who], "planted": len(planted)}))
        return
    if args.command == "watch":
        watch(load("watch-dirs.json", []), state / "watch.stop", state / "watched.json")
        return
    (state / "watch.stop").touch()
    before = load("manifest.json", {})
    # As before the step: with the links still planted (what the step did at them is in both).
    writable_after, _, after = survey(who, skip, declared, cache)
    keep("hashes.json", cache)
    canary_now = canary_state(args.canary)
    planted = load("planted.json", [])
    unplant(planted, args.canary)
    writable_before = load("writable.json", {})
    for _ in range(50):
        if (state / "watched.json").exists():
            break
        time.sleep(0.2)
    watched = set(load("watched.json", []))
    new = {p for p in touched(writable_before, writable_after) | watched if ASIDE not in p and not p.startswith(skip)}
    learned = sorted(set(load("learned.json", [])) | new)
    keep("learned.json", learned)
    record = {
        "step": args.step,
        "accounts": [a.name for a in who],
        "writable": {a.name: sum(a.name in v[6] for v in writable_after.values()) for a in who},
        "planted": [{k: item[k] for k in ("path", "by", "own")} for item in planted],
        "learned_now": sorted(new),
        "watched": len(watched),
        "learned": len(learned),
        "canary_changed": canary_now != load("canary.json", canary_now),
        "root_files": len(after),
        "differences": differences(before, after),
    }
    keep(f"step-{args.step}.json", record)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
