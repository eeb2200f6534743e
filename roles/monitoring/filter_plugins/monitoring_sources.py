"""Whether an address is let in by an IP allow-list of IPAddressAllow= entries.

``{{ '10.0.4.17' | monitoring_address_allowed(['10.0.4.0/24']) }}`` is true. Entries are IP
addresses, CIDR prefixes or systemd's words (``any``, ``localhost``, ``link-local``,
``multicast``); an address that is not an IP address (a name) is never let in, because
systemd filters addresses, not names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

_WORDS = {
    "any": ("0.0.0.0/0", "::/0"),
    "localhost": ("127.0.0.0/8", "::1/128"),
    "link-local": ("169.254.0.0/16", "fe80::/64"),
    "multicast": ("224.0.0.0/4", "ff00::/8"),
}


def monitoring_address_allowed(address: Any, sources: Iterable[Any]) -> bool:
    """True when ``address`` falls in one of ``sources`` (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(str(address).strip())
    except ValueError:
        return False
    for source in sources or []:
        for network in _WORDS.get(str(source).strip(), (str(source).strip(),)):
            try:
                if ip in ipaddress.ip_network(network, strict=False):
                    return True
            except ValueError:
                continue
    return False


class FilterModule:
    """The monitoring role's allow-list filter."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {"monitoring_address_allowed": monitoring_address_allowed}
