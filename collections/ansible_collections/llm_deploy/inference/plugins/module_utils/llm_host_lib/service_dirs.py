"""``service-dirs USER GROUP VAR=PATH...`` (the module's only): the service account's directories, made by
root without following a link the account could have put there.

inference_server (``tasks/service_dirs.yml``) runs it for its state and cache directories and the
Hugging Face cache inside the latter: each ``PATH`` ends up a directory of ``USER:GROUP``, mode
0750, and ``VAR`` is the variable a refusal names. The account can write these directories, so
anything inside them may have been put there by the account or by code it ran (a model's own
code with trust_remote_code): a link from ``<cache>/huggingface`` to ``/etc`` would otherwise
make root hand ``/etc`` to the account. So root:

* walks each path from ``/`` one name at a time (``openat`` of the directory it holds open,
  ``O_NOFOLLOW``) and follows a symbolic link only inside a directory that root alone can write
  (owned by root, no write bit for its group or others): ``/var/cache`` may hold an operator's
  link to a larger disk, the account's cache directory may hold no link root would follow;
* refuses a link there, or anything else that is no directory where a directory is expected,
  with one sentence naming the path and the variable, after looking at every path and before
  it changes anything (a link put there while it runs is refused the same way, never followed);
* sets owner and mode through the directory it holds open (``fchown``, ``fchmod``);
* hands over what another account left when a directory exists with another owner (a host moved
  off root, or to another account): with ``os.fwalk`` (no link followed), only what belongs to
  that account, and a directory's entries before the directory itself, so that the service
  account cannot change a directory while root works in it; a link is changed itself
  (``lchown``), never its target, and a file with a second name (a hard link, maybe of a file
  outside) is left as it is. Modes are kept.

A missing directory on the way that is not in the list is made root's, 0755 (the account needs
only to pass through it). In check mode (the module's) nothing changes and ``changed`` says
whether something would. Returns ``{"changed", "made", "settled", "handed_over", "kept",
"refused"}``: the directories made, those whose owner or mode changed, how many entries were
handed over under each directory, how many were left as they were (more than one name), and the
refusal's sentence (None when there is none; nothing was changed then).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

SERVICE_DIR_MODE = 0o750
# A directory made on the way to one of the listed ones, which the account only passes through.
PASSAGE_MODE = 0o755
# As the kernel's limit on links followed in one path lookup (MAXSYMLINKS).
MAX_LINKS = 40
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A path that is no directory where one is expected; the message is the sentence."""


def root_alone_writes(st: os.stat_result) -> bool:
    """Whether only root can change the entries of the directory ``st`` (owner root, no group or other write)."""
    return st.st_uid == 0 and not st.st_mode & 0o022


def writers(st: os.stat_result) -> str:
    """Who besides root can change the directory ``st``, in words."""
    names = []
    if st.st_uid != 0:
        names.append(_name(pwd.getpwuid, st.st_uid))
    if st.st_mode & 0o020:
        names.append(f"the group {_name(grp.getgrgid, st.st_gid)}")
    if st.st_mode & 0o002:
        names.append("every account")
    return " and ".join(names)


def _name(lookup, ident: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def what(st: os.stat_result, name: str, dir_fd: int) -> str:
    """What is at ``name`` in ``dir_fd`` (``st``, not followed), in words."""
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link to {os.readlink(name, dir_fd=dir_fd)}"
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISSOCK, "a socket"), (stat.S_ISFIFO, "a named pipe"))
    return next((words for test, words in kinds if test(st.st_mode)), "a device node")


def refusal(path: str, found: str, variable: str, parent: str, parent_st: os.stat_result) -> Refused:
    """The sentence for ``found`` at ``path`` (in ``parent``) where ``variable`` needs a directory."""
    if root_alone_writes(parent_st):
        return Refused(
            f"{path} is {found}, where {variable} needs a directory: move it away or set {variable} to "
            "another path, and deploy again."
        )
    return Refused(
        f"{path} is {found}, where {variable} needs a directory: {parent} can be written by "
        f"{writers(parent_st)}, who could have put it there, so root follows no link and changed nothing "
        f"there; remove {path} and deploy again."
    )


class Walk:
    """One path walked from ``/``, a name at a time, holding the directory it is in open."""

    def __init__(self, variable: str) -> None:
        self.variable = variable
        self.fd = os.open("/", DIR_FLAGS)
        self.here = "/"
        self.made: list[str] = []

    def close(self) -> None:
        """Let go of the directory held."""
        os.close(self.fd)

    def enter(self, name: str, expect: os.stat_result) -> None:
        """Hold the directory ``name`` (``expect``, as looked at) instead of the one held now."""
        path = os.path.join(self.here, name)
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError:  # replaced by a link or a file since it was looked at
            raise refusal(path, "no longer a directory", self.variable, self.here, os.fstat(self.fd)) from None
        if not os.path.samestat(os.fstat(fd), expect):
            os.close(fd)
            raise refusal(path, "another directory than the one looked at", self.variable, self.here, expect)
        os.close(self.fd)
        self.fd, self.here = fd, path

    def jump(self, target: str) -> list[str]:
        """Follow a link to ``target``: the names still to walk (from ``/`` for an absolute one)."""
        if target.startswith("/"):
            os.close(self.fd)
            self.fd, self.here = os.open("/", DIR_FLAGS), "/"
        return target.split("/")

    def up(self) -> None:
        """Hold the parent of the directory held now (a link's ``..``)."""
        fd = os.open("..", DIR_FLAGS, dir_fd=self.fd)
        os.close(self.fd)
        self.fd, self.here = fd, os.path.dirname(self.here)

    def make(self, name: str, owner: tuple[int, int, int]) -> None:
        """Make the directory ``name`` with ``owner`` (uid, gid, mode) and hold it."""
        os.mkdir(name, owner[2], dir_fd=self.fd)
        self.enter(name, os.stat(name, dir_fd=self.fd, follow_symlinks=False))
        os.fchown(self.fd, owner[0], owner[1])
        os.fchmod(self.fd, owner[2])
        self.made.append(self.here)

    def to(self, path: str, owner: tuple[int, int, int] | None = None) -> bool:
        """Walk to ``path``; False where a name on the way is missing and ``owner`` is None.

        With ``owner`` (uid, gid, mode) a missing ``path`` is made with it, a missing directory
        on the way root's, 0755. A link is followed only where root alone writes the directory
        it is in; anything else that is no directory is refused.
        """
        names = path.strip("/").split("/")
        links = 0
        while names:
            name = names.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                self.up()
                continue
            parent_st = os.fstat(self.fd)
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                if owner is None:
                    return False
                self.make(name, owner if not names else (0, 0, PASSAGE_MODE))
                continue
            if stat.S_ISLNK(st.st_mode) and root_alone_writes(parent_st) and links < MAX_LINKS:
                links += 1
                names = self.jump(os.readlink(name, dir_fd=self.fd)) + names
            elif stat.S_ISDIR(st.st_mode):
                self.enter(name, st)
            else:
                found = what(st, name, self.fd)
                raise refusal(os.path.join(self.here, name), found, self.variable, self.here, parent_st)
        return True


def hand_over(top_fd: int, old_uid: int, uid: int, gid: int, check: bool) -> tuple[int, int]:
    """Give what ``old_uid`` owns under the directory ``top_fd`` to ``uid:gid``: (handed over, kept).

    Top-down with ``os.fwalk`` (no link followed, a directory swapped while walking is not
    entered): in each directory its files and links first (``lchown``), then the directory
    itself (``fchown``), then its subdirectories, so that a directory is still the old
    account's, closed to the service account, while its entries change hands. Subdirectories of
    other owners are not entered; a file with more than one name is kept as it is.
    """
    handed = kept = 0
    for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
        entered = []
        for name in dirnames + filenames:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if st.st_uid != old_uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                entered.append(name)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                kept += 1
            else:
                handed += 1
                if not check:
                    os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        dirnames[:] = entered
        if dirpath != ".":  # the top directory changes hands last, in Settler.settle
            handed += 1
            if not check:
                os.fchown(dfd, uid, gid)
    return handed, kept


class Settler:
    """The account's directories made and handed over, and what that changed (the subcommand's result)."""

    def __init__(self, user: str, group: str, check: bool) -> None:
        self.check = check
        try:
            self.ids: tuple[int, int] | None = (pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid)
        except KeyError:
            if not check:  # account.yml creates the account first; check mode may come before it
                raise Refused(
                    f"the account {user}:{group} does not exist, so no directory can be given to it."
                ) from None
            self.ids = None
        self.made: list[str] = []
        self.settled: list[str] = []
        self.handed_over: dict[str, int] = {}
        self.kept = 0

    def settle(self, variable: str, path: str) -> None:
        """Make ``path`` a directory of the account, 0750, handing over what another account left in it."""
        walk = Walk(variable)
        try:
            owner = None if self.check or self.ids is None else (*self.ids, SERVICE_DIR_MODE)
            if not walk.to(path, owner):
                self.made.append(path)  # check mode: it would be made
                return
            self.made += walk.made
            st = os.fstat(walk.fd)
            if self.ids is None or (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (*self.ids, SERVICE_DIR_MODE):
                self.settled.append(path)
            if self.ids is None:
                return
            if st.st_uid != self.ids[0]:
                handed, kept = hand_over(walk.fd, st.st_uid, *self.ids, self.check)
                self.handed_over[path], self.kept = handed, self.kept + kept
            if not self.check and path in self.settled:
                os.fchown(walk.fd, *self.ids)
                os.fchmod(walk.fd, SERVICE_DIR_MODE)
        finally:
            walk.close()

    def result(self, refused: str | None = None) -> dict[str, object]:
        """The subcommand's JSON object."""
        changed = bool(self.made or self.settled or any(self.handed_over.values()))
        return {
            "changed": changed,
            "made": self.made,
            "settled": self.settled,
            "handed_over": self.handed_over,
            "kept": self.kept,
            "refused": refused,
        }


def service_dirs(args: list[str], check: bool = False) -> dict[str, object] | None:
    """Make each ``VAR=PATH`` of ``args[2:]`` a directory of ``args[0]:args[1]`` (the module's docstring says how).

    None for wrong arguments."""
    pairs = [arg.split("=", 1) for arg in args[2:]]
    if len(args) < 3 or any(len(pair) != 2 or not pair[1].startswith("/") for pair in pairs):
        return None
    listed = [(variable, os.path.normpath(path)) for variable, path in pairs]
    settler = None
    try:
        settler = Settler(args[0], args[1], check)
        for variable, path in listed:  # every path looked at first: a refusal changes nothing
            walk = Walk(variable)
            try:
                walk.to(path)
            finally:
                walk.close()
        for variable, path in listed:
            settler.settle(variable, path)
    except Refused as exc:
        return settler.result(str(exc)) if settler else {"changed": False, "refused": str(exc)}
    return settler.result()
