# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Who listens where the gate sends its keys: a local process of another account is refused.

Between the unit's port guard and the engine's listen (minutes while SGLang loads its
weights), any local account can bind the server's port: the gate would then send it the API
key with every ``/health`` poll and the admin key to ``/flush_cache``. When the gate knows the
account that runs the server (``listener_user``) and its URL names this host, every request
reads who listens on the port (``/proc/net/tcp`` and ``tcp6``, as the port guard does) and
refuses a listening socket of any other account; then, once connected and before it sends a
byte, it reads who accepted that very connection (the server side's owner in the same tables),
so a process that binds the port between the check and the connect gets nothing either.
"""

from __future__ import annotations

import pwd
import socket

from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.proc import (
    accepting_uid,
    command,
    holders,
    listening,
    user_of,
)

from .errors import GateFailure


def expected_uid(user: str) -> int:
    """The uid of ``user`` (a name, or digits for a uid); ValueError when the account does not exist."""
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ValueError(f"listener_user {user!r} is not an account on this host") from None


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this machine (a socket can bind it), loopback included."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _type, _proto, _name, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


class ListenerGuard:
    """Refuses to talk to ``port`` while a listening socket on it belongs to an account other than ``uid``."""

    def __init__(self, port: int, user: str, uid: int) -> None:
        """The port the gate talks to and the account (name and uid) that must hold every listener on it."""
        self.port = port
        self.user = user
        self.uid = uid
        self._verified: frozenset[str] = frozenset()

    def check(self) -> None:
        """Raise :class:`GateFailure` when a listener on the port is another account's (before any key is sent)."""
        sockets = listening(self.port)
        if frozenset(sockets) == self._verified:
            return
        foreign = {inode: uid for inode, uid in sockets.items() if uid != self.uid}
        if not foreign:
            self._verified = frozenset(sockets)
            return
        owners = ", ".join(sorted({f"{user_of(uid)} (uid {uid})" for uid in foreign.values()}))
        pids = holders(foreign)
        held = "; ".join(f"pid {pid}: {command(pid)[:120]}" for pid in pids[:3])
        raise GateFailure(
            "wait",
            f"port {self.port} of this host is held by {owners}, not by {self.user} that runs the server "
            f"({held or 'its process is not visible'}): the gate sends no key to another account's process; "
            "stop it (a local user listening where the server will) and deploy again",
        )

    def verify(self, connection: socket.socket) -> None:
        """Raise :class:`GateFailure` unless the account expected accepted ``connection`` (nothing sent yet)."""
        uid = accepting_uid(self.port, connection.getsockname()[1])
        if uid != self.uid:
            whom = "no process of this host" if uid is None else f"{user_of(uid)} (uid {uid})"
            raise GateFailure(
                "wait",
                f"the connection to port {self.port} was accepted by {whom}, not by {self.user} that runs the "
                "server: the gate sends no key to it; stop the process that listens there and deploy again",
            )


def make_guard(host: str, port: int, user: str | None) -> ListenerGuard | None:
    """A guard for a server on ``host``:``port`` run by ``user``; None without a user or for another machine.

    ValueError when ``user`` is no account here.
    """
    if not user or not is_local_address(host):
        return None
    return ListenerGuard(port, user, expected_uid(user))
