#!/usr/bin/env python3
"""Can the service account reach the venv, the model and its own directories? Which groups do
the GPU device nodes need? (inference_server's tasks/access.yml, before anything changes on the host)

``service-access.py USER GROUP [--group G]... [--read VAR=PATH]... [--own VAR=PATH]... [--venv VAR=DIR]...
[--devices GLOB]...`` prints one JSON object:

* ``problems``: one entry per path the account could not use, ``{"variable", "path", "blocked_at",
  "mode", "owner", "group", "need"}``: for ``--read`` paths (the model, the drafter) every existing
  directory on the way must be searchable (x) by the account and the path itself readable (r,
  and x for a directory); for ``--own`` paths (the state and cache directories, which the role
  creates and hands to the account) every existing directory above them must be searchable.
  For ``--venv`` directories (the venv link and the lock's venv) every existing directory above
  them must be searchable, as for ``--own``. Symbolic links are followed: the directories of the
  link's own path and of its target count. The first problem of a variable is its only one.
* ``venv_problems``: one entry per ``--venv`` directory that exists and that the account could
  reach but not run, in the same form: its ``bin/python`` must be executable (the directories on
  the way searchable, the interpreter it links to executable), ``pyvenv.cfg`` readable (else
  Python ignores it and runs as the system's) and ``lib/python3*/site-packages`` readable. A
  venv built under root's umask 077 fails here (the server would stop at 203/EXEC); one not
  built yet is ml_env's to build.
* ``root_runs_problems``: one entry per ``--root-runs`` path (the model, the drafter and the venv that
  the deploy's engine check runs as root: it imports the model's own code with trust_remote_code and
  runs the venv's python) that an account other than root could change, ``{"variable", "path",
  "writable_at", "mode", "owner", "group", "by"}``: a directory on the way to it (as written and as
  resolved) or, for a directory, anything below it (the targets of links inside too) owned by another
  account (``by`` its name), writable by a group other than root's (``group NAME``) or by everyone
  (``everyone``; a sticky directory on the way, such as /tmp, protects what root owns in it). Such a
  writer could also keep a changed file's size and mtime, which ``model_sync_verify: cached`` trusts.
  A path not there yet is none (the role makes it, as root). Asked whatever the account.
* ``device_groups``: the groups that own device nodes matching ``--devices`` which the account
  may only open through their group (not world read-write): the account needs them as
  supplementary groups (a driver set NVreg_DeviceFileGID, e.g. to video or render).
* ``device_problems``: device nodes no non-root account can open (neither world nor a non-root
  group read-write), ``{"path", "mode", "owner", "group"}``.

The account may not exist yet (the role creates it later): it then counts as a new system user
whose groups are GROUP and the ``--group`` ones that exist. root passes everything. Standard
library only (the host's python3); nothing is written.
"""

from __future__ import annotations

import argparse
import glob
import grp
import json
import os
import pwd
import stat
import sys
from collections.abc import Iterable


class Account:
    """The uid (None for an account not created yet) and the group ids of the service account."""

    def __init__(self, user: str, groups: Iterable[str]) -> None:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            self.uid: int | None = None
            self.gids: set[int] = set()
        else:
            self.uid = entry.pw_uid
            self.gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
        for name in groups:
            try:
                self.gids.add(grp.getgrnam(name).gr_gid)
            except KeyError:
                pass

    def may(self, st: os.stat_result, want: str) -> bool:
        """Whether the account has every permission in ``want`` ('r', 'w', 'x') on a file with ``st``."""
        if self.uid == 0:
            return True
        shift = 6 if st.st_uid == self.uid else 3 if st.st_gid in self.gids else 0
        bits = {"r": 4, "w": 2, "x": 1}
        return all(st.st_mode >> shift & bits[c] for c in want)


def _name(lookup, ident: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _describe(path: str, st: os.stat_result) -> dict[str, str]:
    return {
        "blocked_at": path,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
    }


def _chain(path: str) -> list[str]:
    """The directories above ``path`` (from /), and ``path`` itself, for the path as written and
    for its resolved form (the directories a symbolic link's target sits in)."""
    found: list[str] = []
    for form in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        parts = form.strip("/").split("/") if form != "/" else []
        found += ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    return list(dict.fromkeys(found))


def blocked(account: Account, path: str, need: str) -> dict[str, str] | None:
    """Where ``account`` is stopped on the way to ``path`` (``need`` 'read', 'own' or 'run'), or None."""
    target = os.path.realpath(path)
    for step in _chain(path):
        try:
            st = os.stat(step)
        except OSError:
            continue  # not there yet (created later by the role) or behind a directory already named
        last = step in (os.path.abspath(path), target)
        if (last and need == "own") or not (last or stat.S_ISDIR(st.st_mode)):
            continue  # the role hands its own directories to the account
        want = "x" if not last or need == "run" else "rx" if stat.S_ISDIR(st.st_mode) else "r"
        if not account.may(st, want):
            label = "read" if "r" in want else "search (x)" if stat.S_ISDIR(st.st_mode) else "run (x)"
            return {**_describe(step, st), "need": label}
    return None


def _writer(st: os.stat_result, on_the_way: bool) -> str | None:
    """Who other than root may change a file or directory with ``st`` (None: root alone). On the way to a
    path, a sticky directory (/tmp) lets others add entries but not replace root's."""
    if st.st_uid != 0:
        return _name(pwd.getpwuid, st.st_uid)
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        return f"group {_name(grp.getgrgid, st.st_gid)}"
    sticky_on_the_way = on_the_way and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not sticky_on_the_way:
        return "everyone"
    return None


def others_write(path: str) -> dict[str, str] | None:
    """Where an account other than root could change what root runs from ``path``, or None (see
    ``root_runs_problems`` in the module's docstring)."""
    if not os.path.exists(path):
        return None
    seen: set[str] = set()
    pending = [(step, step != os.path.abspath(path) and step != os.path.realpath(path)) for step in _chain(path)]
    if os.path.isdir(path):
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                inside = os.path.join(top, name)
                if os.path.islink(inside):  # what is read is its target, where that lies
                    pending += [(step, True) for step in _chain(os.path.realpath(inside))[:-1]]
                    pending.append((os.path.realpath(inside), False))
                else:
                    pending.append((inside, False))
    for step, on_the_way in pending:
        if step in seen:
            continue
        seen.add(step)
        try:
            st = os.stat(step)
        except OSError:
            continue  # a dangling link: nothing to run
        by = _writer(st, on_the_way)
        if by:
            return {**_describe(step, st), "by": by}
    return None


def venv_blocked(account: Account, venv: str) -> dict[str, str] | None:
    """Where ``account`` is stopped running the venv's python as that venv, or None (also when not built yet)."""
    if not os.path.isdir(venv):
        return None
    site_packages = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    for path, need in [(os.path.join(venv, "bin", "python"), "run"), (os.path.join(venv, "pyvenv.cfg"), "read")] + [
        (path, "read") for path in site_packages
    ]:
        where = blocked(account, path, need)
        if where:
            return where
    return None


def devices(patterns: Iterable[str]) -> tuple[list[str], list[dict[str, str]]]:
    """The groups the device nodes matching ``patterns`` need, and the nodes no account may open."""
    groups: set[str] = set()
    problems: list[dict[str, str]] = []
    for path in sorted({p for pattern in patterns for p in glob.glob(pattern)}):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISCHR(st.st_mode) or st.st_mode & 0o006 == 0o006:
            continue
        if st.st_gid != 0 and st.st_mode & 0o060 == 0o060:
            groups.add(_name(grp.getgrgid, st.st_gid))
        else:
            info = _describe(path, st)
            problems.append({"path": path, "mode": info["mode"], "owner": info["owner"], "group": info["group"]})
    return sorted(groups), problems


def _pairs(values: list[str]) -> list[tuple[str, str]]:
    return [tuple(v.split("=", 1)) for v in values if "=" in v and v.split("=", 1)[1]]  # type: ignore[misc]


def main(argv: list[str]) -> int:
    """Print the JSON object described in the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("user")
    parser.add_argument("group")
    parser.add_argument("--group", dest="groups", action="append", default=[])
    parser.add_argument("--read", action="append", default=[], help="VAR=PATH the account must read")
    parser.add_argument("--own", action="append", default=[], help="VAR=PATH the role creates for the account")
    parser.add_argument("--venv", action="append", default=[], help="VAR=DIR of the venv whose python it must run")
    parser.add_argument("--devices", action="append", default=[], help="glob of device nodes it must open")
    parser.add_argument("--root-runs", action="append", default=[], help="VAR=PATH root runs code from")
    args = parser.parse_args(argv)
    device_groups, device_problems = devices(args.devices)
    account = Account(args.user, [args.group, *args.groups, *device_groups])
    problems = []
    # A venv's reach is that of an own directory: the directories above it; venv_blocked looks inside.
    for need, pairs in (("own", _pairs(args.venv)), ("read", _pairs(args.read)), ("own", _pairs(args.own))):
        for variable, path in pairs:
            where = blocked(account, path, need)
            # One reason per variable (ml_env_path names both the link and the lock's venv beside it).
            if where and variable not in {p["variable"] for p in problems}:
                problems.append({"variable": variable, "path": path, **where})
    venv_problems = []
    for variable, path in _pairs(args.venv):
        where = None if variable in {p["variable"] for p in problems} else venv_blocked(account, path)
        if where:
            venv_problems.append({"variable": variable, "path": path, **where})
    root_runs_problems = []
    for variable, path in _pairs(args.root_runs):
        where = others_write(path)
        if where and variable not in {p["variable"] for p in root_runs_problems}:
            writable_at = where.pop("blocked_at")
            root_runs_problems.append({"variable": variable, "path": path, "writable_at": writable_at, **where})
    out = {"problems": problems, "venv_problems": venv_problems, "root_runs_problems": root_runs_problems}
    print(json.dumps({**out, "device_groups": device_groups, "device_problems": device_problems}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
