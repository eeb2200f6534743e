"""Prove that a server enforces its API key: /v1/* refuses a request without it, accepts one
with it, and /health answers without it.

    tools/api-key-check --url http://127.0.0.1:30000 --api-key-file /etc/inference-server/api-key.yaml
    HEALTH_GATE_API_KEY=sk-... tools/api-key-check --url http://127.0.0.1:30000 --json

The key comes from ``$HEALTH_GATE_API_KEY`` or ``--api-key-file`` (a plain file holding the
key, or the role's api-key.yaml with its ``api-key: "<key>"`` line), never from the command
line, and is never printed. Checks, each one HTTP request:

* ``GET <path>`` without ``Authorization``: expects 401 or 403 (SGLang answers 401);
* ``GET <path>`` with a wrong key: expects 401 or 403;
* ``GET <path>`` with ``Authorization: Bearer <key>``: expects 200;
* ``GET /health`` without ``Authorization``: expects 200 (SGLang exempts /health and /metrics).

``<path>`` is ``/v1/models`` (``--path`` to change). Prints one line per check (or one JSON
object with ``--json``). Exit status: 0 every check as expected, 1 a check failed (the key is
not enforced, or the key is refused), 2 usage error. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PASSED, FAILED, USAGE = 0, 1, 2
REFUSED = (401, 403)


def read_key(path: str | None) -> str | None:
    """The key from ``path`` (plain or ``api-key: "<key>"`` YAML), else from $HEALTH_GATE_API_KEY."""
    if not path:
        return os.environ.get("HEALTH_GATE_API_KEY") or None
    text = Path(path).read_text(encoding="utf-8")
    found = re.search(r"""^api-key:\s*["']?([^"'\n]+?)["']?\s*$""", text, re.M)
    if found:
        return found.group(1)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return lines[0] if lines else None


def status_of(url: str, key: str | None, timeout: float) -> tuple[int | None, str]:
    """(HTTP status, error text) of one GET; the status is None when no answer came."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (operator's URL)
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def run_checks(base: str, key: str, path: str, timeout: float) -> list[dict[str, Any]]:
    """The four checks, each with what was expected and what came back."""
    base = base.rstrip("/")
    plan = [
        (f"GET {path} without a key is refused", base + path, None, REFUSED),
        (f"GET {path} with a wrong key is refused", base + path, key + "-wrong", REFUSED),
        (f"GET {path} with the key is accepted", base + path, key, (200,)),
        ("GET /health without a key answers", base + "/health", None, (200,)),
    ]
    checks = []
    for name, url, sent, expected in plan:
        status, error = status_of(url, sent, timeout)
        checks.append(
            {"check": name, "expected": list(expected), "status": status, "error": error, "ok": status in expected}
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--api-key-file", help="file holding the key (else $HEALTH_GATE_API_KEY)")
    parser.add_argument("--path", default="/v1/models", help="protected path to try (default /v1/models)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return USAGE if exc.code else PASSED
    try:
        key = read_key(args.api_key_file)
    except OSError as exc:
        print(f"api-key-check: cannot read --api-key-file: {exc}", file=sys.stderr)
        return USAGE
    if not key:
        print("api-key-check: no API key: set HEALTH_GATE_API_KEY or give --api-key-file", file=sys.stderr)
        return USAGE
    checks = run_checks(args.url, key, args.path, args.timeout)
    passed = all(c["ok"] for c in checks)
    if args.json:
        print(json.dumps({"url": args.url, "passed": passed, "checks": checks}, indent=2))
    else:
        for c in checks:
            got = c["status"] if c["status"] is not None else f"no answer ({c['error']})"
            print(
                f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: HTTP {got} "
                f"(expected {' or '.join(map(str, c['expected']))})"
            )
        print(f"api key {'enforced' if passed else 'NOT as expected'} at {args.url}")
    return PASSED if passed else FAILED


if __name__ == "__main__":
    sys.exit(main())
