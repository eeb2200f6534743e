#!/usr/bin/env python3
"""Start ``smg launch`` with its control-plane key taken from the environment, not argv.

``smg-launch [smg launch flags...]``, run with the gateway venv's python. smg takes the
key only as ``--control-plane-api-keys id:name:role:key``; given on the command line it
would be in the unit file and in ``/proc/<pid>/cmdline`` (readable by every user). This
launcher reads ``SMG_CONTROL_PLANE_API_KEY`` (the unit's EnvironmentFile, root 0600),
removes it from the environment, and hands the flag to smg's own argument parser in
process, so the key is in no argv, unit file or log. ``SMG_CONTROL_PLANE_KEY_ID`` names the
key (default ``llm-deploy``); its role is admin (it adds and removes workers).
``SMG_API_KEY`` (gateway_api_key, the same file), when set, becomes smg's ``--api-key``: the key
of its OpenAI API, handed over the same way.
"""

from __future__ import annotations

import os
import sys


def router_argv(argv: list[str], environ: dict[str, str]) -> list[str]:
    """The flags for smg's parser: ``argv`` plus the key from ``environ`` (which loses it)."""
    key = environ.pop("SMG_CONTROL_PLANE_API_KEY", "").strip()
    if not key:
        sys.exit(
            "smg-launch: SMG_CONTROL_PLANE_API_KEY is empty; the gateway refuses to start without a "
            "control-plane key (anyone reaching it could add or remove workers)"
        )
    if any(a.startswith("--control-plane-api-keys") for a in argv):
        sys.exit("smg-launch: pass the control-plane key through SMG_CONTROL_PLANE_API_KEY, not argv")
    if any(a == "--api-key" or a.startswith("--api-key=") for a in argv):
        sys.exit("smg-launch: pass the gateway's API key through SMG_API_KEY, not argv")
    key_id = environ.pop("SMG_CONTROL_PLANE_KEY_ID", "llm-deploy")
    api_key = environ.pop("SMG_API_KEY", "").strip()
    return [
        *argv,
        "--control-plane-api-keys",
        f"{key_id}:{key_id}:admin:{key}",
        *(["--api-key", api_key] if api_key else []),
    ]


def main() -> None:
    """Parse with smg's own parser and start the router (blocks until it stops)."""
    from smg.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(router_argv(sys.argv[1:], os.environ)))


if __name__ == "__main__":
    main()
