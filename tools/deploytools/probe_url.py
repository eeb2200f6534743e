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

from ansible.module_utils.parsing.convert_bool import boolean

# A wildcard bind, and the loopback address of its family that reaches it.
WILDCARD_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def bind_address(bind: Any) -> str:
    """``bind`` without brackets, an IP address in its normal form ('' for none).

    >>> bind_address("[fd00:0::5]"), bind_address(" 0.0.0.0 "), bind_address("gpu1"), bind_address(None)
    ('fd00::5', '0.0.0.0', 'gpu1', '')
    """
    host = str(bind or "").strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def probe_host(bind: Any) -> str:
    """The address (or name) the host reaches a server bound to ``bind`` at, without brackets.

    >>> probe_host("0.0.0.0"), probe_host("::"), probe_host("10.0.4.17"), probe_host("[fd00::5]")
    ('127.0.0.1', '::1', '10.0.4.17', 'fd00::5')
    """
    host = bind_address(bind)
    return WILDCARD_LOOPBACK.get(host, host)


def probe_url(bind: Any, port: Any, scheme: str = "http") -> str:
    """``<scheme>://<host>:<port>`` for a server bound to ``bind`` on ``port``, IPv6 in brackets.

    >>> probe_url("::", 30000), probe_url("127.0.0.1", 8000), probe_url("localhost", 8000, "https")
    ('http://[::1]:30000', 'http://127.0.0.1:8000', 'https://localhost:8000')
    """
    host = probe_host(bind)
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{int(port)}"


def is_wildcard(bind: Any) -> bool:
    """Whether ``bind`` listens on every address of its family (``0.0.0.0``, ``::``, or '' for the default).

    >>> is_wildcard("0.0.0.0"), is_wildcard("[::]"), is_wildcard(""), is_wildcard("10.0.4.17"), is_wildcard("::1")
    (True, True, True, False, False)
    """
    return bind_address(bind) in WILDCARD_LOOPBACK


def is_loopback(bind: Any) -> bool:
    """Whether ``bind`` listens on loopback only (the role's ``_inference_server_on_loopback``).

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, True, False)
    """
    host = str(bind or "").strip().strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def fronted(bind: Any, front: Any = True) -> bool:
    """Whether the API front stands on ``bind``: a network bind with the front on (``inference_server_front``).

    >>> fronted("0.0.0.0"), fronted("10.0.4.17", False), fronted("127.0.0.1")
    (True, False, False)
    """
    return boolean(front, strict=False) and not is_loopback(bind)


def front_scheme(bind: Any, front: Any = True, tls: Any = True) -> str:
    """The scheme clients reach ``bind`` with: https behind the front with TLS (``inference_server_tls``), else http.

    >>> front_scheme("0.0.0.0"), front_scheme("0.0.0.0", True, False), front_scheme("127.0.0.1")
    ('https', 'http', 'http')
    """
    return "https" if fronted(bind, front) and boolean(tls, strict=False) else "http"


def front_url(bind: Any, port: Any, front: Any = True, tls: Any = True) -> str:
    """Where the host reaches the API front on ``bind`` (https with TLS): '' where none stands.

    >>> front_url("0.0.0.0", 30000), front_url("0.0.0.0", 30000, True, "no"), front_url("127.0.0.1", 8000)
    ('https://127.0.0.1:30000', 'http://127.0.0.1:30000', '')
    """
    return probe_url(bind, port, front_scheme(bind, front, tls)) if fronted(bind, front) else ""


def engine_bind(bind: Any, front: Any = True) -> str:
    """Where the engine itself listens: behind a front, on the loopback address of the bind's family.

    >>> engine_bind("0.0.0.0"), engine_bind("::"), engine_bind("10.0.4.17", False), engine_bind("127.0.0.1")
    ('127.0.0.1', '::1', '10.0.4.17', '127.0.0.1')
    """
    if not fronted(bind, front):
        return str(bind)
    return "::1" if ":" in probe_host(bind) else "127.0.0.1"


def engine_port(port: Any, bind: Any, front: Any = True, behind_port: Any = None) -> int:
    """The engine's port: behind a front ``behind_port`` (``inference_server_engine_port``; default ``port`` + 1),
    else ``port`` itself.

    >>> engine_port(30000, "0.0.0.0"), engine_port(30000, "0.0.0.0", True, 31000), engine_port(30000, "127.0.0.1")
    (30001, 31000, 30000)
    """
    if not fronted(bind, front):
        return int(port)
    return int(behind_port) if behind_port not in (None, "") else int(port) + 1


def engine_url(bind: Any, port: Any, front: Any = True, behind_port: Any = None) -> str:
    """The URL the host reaches the engine itself at (readiness, watchdog, gate): the front's upstream.

    >>> engine_url("0.0.0.0", 30000), engine_url("0.0.0.0", 30000, False), engine_url("::", 8000, True, 9000)
    ('http://127.0.0.1:30001', 'http://127.0.0.1:30000', 'http://[::1]:9000')
    """
    return probe_url(engine_bind(bind, front), engine_port(port, bind, front, behind_port))


def local_api(bind: Any, port: Any, tls: Any = True, tls_dir: str = "") -> dict[str, str]:
    """Where a service with TLS of its own on a network bind (the gateway: ``gateway_tls``) answers on its
    own host, and the CA file that verifies it there ('' over plain HTTP, on a loopback bind or without TLS).

    >>> local_api("0.0.0.0", 30000, True, "/etc/smg-gateway-tls")
    {'url': 'https://127.0.0.1:30000', 'ca_file': '/etc/smg-gateway-tls/ca.pem'}
    >>> local_api("127.0.0.1", 30000, True, "/etc/smg-gateway-tls")
    {'url': 'http://127.0.0.1:30000', 'ca_file': ''}
    """
    scheme = front_scheme(bind, True, tls)
    return {"url": probe_url(bind, port, scheme), "ca_file": f"{tls_dir}/ca.pem" if scheme == "https" else ""}
