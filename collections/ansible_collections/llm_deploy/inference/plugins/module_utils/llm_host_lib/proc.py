"""Who listens on a TCP port, and who a process is, read from ``/proc`` (no ss or lsof).

The helpers every other module of the package builds on: the listening sockets of a port
(``/proc/net/tcp`` and ``tcp6``), the processes holding them, and a process's command line,
systemd service unit, user, group and ``/proc/<pid>/stat`` fields.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from collections.abc import Iterable


def _tcp_sockets() -> Iterable[tuple[int, int, str, int, str]]:
    """(local port, remote port, state, owner uid, inode) of every TCP socket (IPv4 and IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    local, remote, state, uid, inode = fields[1], fields[2], fields[3], fields[7], fields[9]
                    yield int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), state, int(uid), inode
        except FileNotFoundError:
            continue


def listening(port: int) -> dict[str, int]:
    """Socket inode -> owner uid of the TCP sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    return {inode: uid for local, _remote, state, uid, inode in _tcp_sockets() if state == "0A" and local == port}


def accepting_uid(server_port: int, client_port: int) -> int | None:
    """The owner uid of this host's server side of the connection from ``client_port`` to ``server_port``.

    The socket a listener accepts is its listener's, owner included, from the handshake on (before
    the process calls accept()); None when this host has no such connection.
    """
    for local, remote, state, uid, _inode in _tcp_sockets():
        if state == "01" and local == server_port and remote == client_port:
            return uid
    return None


def holds(pid: int | str, inodes: Iterable[str]) -> bool:
    """Whether ``pid`` has one of the socket ``inodes`` open.

    Reading another user's file descriptors needs CAP_SYS_PTRACE (root on a normal host has
    it); without it the process is not seen as holding the socket.
    """
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def holders(inodes: Iterable[str]) -> list[int]:
    """Every process that has one of the sockets open, by pid."""
    inodes = list(inodes)
    if not inodes:
        return []
    return sorted(int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if holds(pid, inodes))


# A flag or variable name that looks like it holds a secret (--api-key, --hf-token=, MY_PASSWORD).
SECRET_NAME = re.compile(r"(?i)(token|secret|passw|key|credential|auth|cookie|session)")


def mask_argv(argv: list[str]) -> list[str]:
    """The argv with the values of flags that look like secrets (--api-key X, --token=X) as ***."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append("***")
            hide_next = False
        elif arg.startswith("-") and SECRET_NAME.search(arg.split("=", 1)[0]):
            if "=" in arg:
                shown.append(arg.split("=", 1)[0] + "=***")
            else:
                shown.append(arg)
                hide_next = True
        else:
            shown.append(arg)
    return shown


def cmdline(pid: int) -> str:
    """The command line of a process, its arguments joined by spaces, the values of secret-looking
    flags masked (:func:`mask_argv`): what may be shown, in a result, a refusal or the journal
    (OSError when it is gone)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        argv = handle.read().decode(errors="replace").split("\0")
    return " ".join(mask_argv([arg for arg in argv if arg])).strip()


def command(pid: int) -> str:
    """The command line of a process ("?" when it is gone or has none)."""
    try:
        return cmdline(pid) or "?"
    except OSError:
        return "?"


def unit_of(pid: int) -> str | None:
    """The systemd service unit whose control group holds ``pid`` (None outside any service)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            found = re.findall(r"/([^/\n]+\.service)", handle.read())
    except OSError:
        return None
    return found[-1] if found else None


def user_of(uid: int) -> str:
    """A user name for a uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_of(gid: int) -> str:
    """A group name for a gid."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, ...]."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return handle.read().rsplit(")", 1)[1].split()
