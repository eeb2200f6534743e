"""Where the host probes its own server: the one derivation of the URL the local probes use.

The unit's readiness probe (ExecStartPost), the watchdog between deploys and the health gate
all ask the server on the host itself. They follow the configured bind
(``inference_server_host``): a specific address or name is probed there, a wildcard on the
loopback address of its own family (``0.0.0.0`` on ``127.0.0.1``, ``::`` on ``::1``), and an
IPv6 address is written in brackets. A probe of ``127.0.0.1`` whatever the bind never reached a
server bound to another address, and sent root's request (with the API key) to whoever held
``127.0.0.1`` on that port.
"""

from __future__ import annotations

import ipaddress
from typing import Any

# A wildcard bind, and the loopback address of its family that reaches it.
WILDCARD_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def probe_host(bind: Any) -> str:
    """The address (or name) the host reaches a server bound to ``bind`` at, without brackets.

    >>> probe_host("0.0.0.0"), probe_host("::"), probe_host("10.0.4.17"), probe_host("[fd00::5]")
    ('127.0.0.1', '::1', '10.0.4.17', 'fd00::5')
    """
    host = str(bind or "").strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return WILDCARD_LOOPBACK.get(host, host)


def probe_url(bind: Any, port: Any) -> str:
    """``http://<host>:<port>`` for a server bound to ``bind`` on ``port``, IPv6 in brackets.

    >>> probe_url("::", 30000), probe_url("127.0.0.1", 8000), probe_url("localhost", 8000)
    ('http://[::1]:30000', 'http://127.0.0.1:8000', 'http://localhost:8000')
    """
    host = probe_host(bind)
    return f"http://{f'[{host}]' if ':' in host else host}:{int(port)}"
