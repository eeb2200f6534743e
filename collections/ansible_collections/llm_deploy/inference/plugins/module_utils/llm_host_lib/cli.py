"""The command line: ``llm-host SUBCOMMAND ...``, and ``port-guard PORT UNIT [GRACE_S]``.

Role llm_host's launcher ``files/llm-host`` runs :func:`main` (the tests, molecule's adopt scenario,
by hand), and so does the unit's port guard, the same launcher installed as ``port-guard``: by
that name it runs the guard alone. Each subcommand is documented in the module that implements
it; ``facts`` and adopt's print the JSON object the module returns as ``host``:

* ``facts``: the host facts (``facts``);
* ``inspect``, ``record``, ``restore``, ``switch``, ``alive``: a server started by hand (``adopt``);
* ``restart``: the server's restart sequence (``restart``), which the watchdog imports;
* ``guard``: the port guard (``guard``).

(The module's ``install`` and ``service-dirs`` have no command line.) A wrong command line prints this or the
subcommand's documentation and exits 2. Only the guard is imported before the subcommand is
known, so the port guard needs no more of the package than its own modules.
"""

from __future__ import annotations

import os
import sys

from .guard import USAGE, guard_main

# The name the unit runs the launcher by (inference_server installs it as .../port-guard).
GUARD_NAME = "port-guard"
ADOPT_COMMANDS = ("inspect", "record", "restore", "switch", "alive")


def main(argv: list[str]) -> int:
    """Run the subcommand in ``argv[1]`` (or the guard, when the launcher runs as ``port-guard``)."""
    if os.path.basename(argv[0]) == GUARD_NAME:
        return guard_main(argv[1:])
    command_name, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if command_name == "facts":
        from .facts import facts_main

        return facts_main(rest)
    if command_name == "guard":
        return guard_main(rest)
    if command_name == "restart":
        from .restart import restart_main

        return restart_main(rest)
    if command_name in ADOPT_COMMANDS:
        from .adopt import adopt_main

        return adopt_main(argv[1:])
    print(__doc__, file=sys.stderr)
    return USAGE
