"""Ansible filters for the certificates of the network binds: what is wrong with one (one sentence, '' when
nothing is), whether one expires within a number of days, and the names one the deploy issues carries.

The code is ``deploytools.tls`` (tools/deploytools, installed in the controller's venv).
"""

from __future__ import annotations

from typing import Any

from deploytools.tls import certificate_names, expires_within, problem


class FilterModule:
    """Ansible filters for TLS certificates."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {"tls_problem": problem, "tls_expires_within": expires_within, "tls_names": certificate_names}
