"""The ``model-sync`` command line (role model_sync's launcher ``files/model-sync`` runs :func:`main`).

The argv parser is hand-written rather than argparse, and the output goes through
:func:`~.compact_json.dumps` rather than ``json``: argparse (with gettext) and json (with
``re``) would add about 10 ms to a no-op ``model-sync deploy`` that otherwise takes about
10 ms under ``python3 -IS`` (``bench/model_sync`` measures it; docs/model-sync.md).
"""

from __future__ import annotations

import os
import sys

from .common import MANIFEST_NAME, SyncError, now, thread_count
from .compact_json import dumps
from .engine import Engine
from .fs import scan
from .hashing import Counter, hash_many

CLI_USAGE = """usage: model-sync COMMAND [options]

commands:
  deploy DEST     sync + switch + prune (what the role does, in one go)
  sync DEST       fetch, verify and stage a revision of DEST (= <root>/<name>)
  switch DEST --revision REV   point DEST/current at revisions/REV
  prune DEST      remove revisions beyond --keep (never current or --protect)
  verify PATH     verify a model directory in place (index, sizes, sha256)
  listing PATH    print the files of PATH with size and mtime (JSON)
  manifest PATH   print a sha256sum-style manifest of PATH

options (sync/deploy/switch/prune):
  --source-type mirror|hub|controller_dir   (default mirror)
  --source-path P  --source-host H  --source-user U     mirror (local dir, or rsync over ssh)
  --repo-id R  --hub-revision REV  --hub-python PY  --hub-endpoint URL  --hf-token-stdin   hub
  --revision LABEL   --owner U  --group G  --mode 0644  --dir-mode 0755
  --keep N  --protect PATH (repeatable)  --reserve-mib N
  --rsync-opt OPT  --ssh-opt OPT (repeatable)
common: --state-dir DIR  --workers N  --verify cached|full  --check

Prints one JSON object. Exit 0 = done, 1 = failed (one sentence on stderr), 2 = usage.
"""

# option -> (key, kind); kinds: str, int, flag, list
CLI_OPTIONS: dict[str, tuple[str, str]] = {
    "--source-type": ("source_type", "str"),
    "--source-path": ("source_path", "str"),
    "--source-host": ("source_host", "str"),
    "--source-user": ("source_user", "str"),
    "--repo-id": ("repo_id", "str"),
    "--hub-revision": ("hub_revision", "str"),
    "--hub-python": ("hub_python", "str"),
    "--hf-token-stdin": ("hf_token_stdin", "flag"),
    "--hub-endpoint": ("hub_endpoint", "str"),
    "--revision": ("revision", "str"),
    "--owner": ("owner", "str"),
    "--group": ("group", "str"),
    "--mode": ("mode", "str"),
    "--dir-mode": ("dir_mode", "str"),
    "--keep": ("keep", "int"),
    "--protect": ("protect", "list"),
    "--reserve-mib": ("reserve_mib", "int"),
    "--rsync-opt": ("rsync_opt", "list"),
    "--ssh-opt": ("ssh_opt", "list"),
    "--state-dir": ("state_dir", "str"),
    "--workers": ("workers", "int"),
    "--verify": ("verify", "str"),
    "--check": ("check", "flag"),
}
CLI_COMMANDS = ("deploy", "sync", "switch", "prune", "verify", "listing", "manifest")
CLI_DEFAULTS: dict = {
    "source_type": "mirror",
    "revision": "",
    "owner": "root",
    "group": "root",
    "mode": "0644",
    "dir_mode": "0755",
    "keep": 1,
    "reserve_mib": 1024,
    "state_dir": "/var/lib/model-sync",
    "workers": 0,
    "verify": "cached",
    "check": False,
    "hf_token_stdin": False,
}
# the keys of the source dict -> the options that give them
SOURCE_OPTIONS = (
    ("path", "source_path"),
    ("host", "source_host"),
    ("user", "source_user"),
    ("repo_id", "repo_id"),
    ("revision", "hub_revision"),
)


class UsageError(Exception):
    """Wrong command line."""


def _value(name: str, kind: str, text: str) -> object:
    """The value of option ``name`` of ``kind`` (str or int) given as ``text``."""
    if kind != "int":
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{name} needs a number, not {text!r}") from None


def parse_cli(argv: list[str]) -> tuple[str, str, dict]:
    """Parse ``COMMAND PATH [--option value ...]``.

    Hand-written rather than argparse: argparse (with gettext and re) costs about 10 ms
    of start-up, a third of a no-op sync.
    """
    opts: dict = {**CLI_DEFAULTS, "protect": [], "rsync_opt": [], "ssh_opt": []}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise UsageError("")
        if not arg.startswith("--"):
            positional.append(arg)
            i += 1
            continue
        name, eq, inline = arg.partition("=")
        if name not in CLI_OPTIONS:
            raise UsageError(f"unknown option {name}")
        key, kind = CLI_OPTIONS[name]
        if kind == "flag":
            opts[key] = True
        else:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{name} needs a value")
                inline = argv[i]
            if kind == "list":
                opts[key].append(inline)
            else:
                opts[key] = _value(name, kind, inline)
        i += 1
    if len(positional) != 2 or positional[0] not in CLI_COMMANDS:
        raise UsageError("expected COMMAND and one path")
    if opts["verify"] not in ("cached", "full"):
        raise UsageError("--verify is cached or full")
    if opts["source_type"] not in ("mirror", "hub", "controller_dir"):
        raise UsageError("--source-type is mirror, hub or controller_dir")
    return positional[0], positional[1], opts


def listing(path: str) -> list[dict]:
    """Files of a directory with size and mtime (``model-sync listing``, run on the controller)."""
    return [{"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns} for rel, st in sorted(scan(path).items())]


def print_manifest(path: str, workers: int) -> None:
    """Print a sha256sum-style manifest of ``path`` (``model-sync manifest``)."""
    files = scan(path)
    todo = [(os.path.join(path, r), st.st_size) for r, st in files.items() if r != MANIFEST_NAME]
    hashes = hash_many(todo, thread_count(workers), Counter())
    prefix = len(path.rstrip("/")) + 1
    for p in sorted(hashes):
        print(f"{hashes[p]}  {p[prefix:]}")


def engine_of(path: str, o: dict) -> Engine:
    """The engine the options ``o`` describe for DEST ``path`` (reads the hub token from stdin if asked)."""
    token = sys.stdin.readline().strip() if o["hf_token_stdin"] else None
    source: dict = {"type": o["source_type"]}
    for key, opt in SOURCE_OPTIONS:
        if o.get(opt):
            source[key] = o[opt]
    return Engine(
        path,
        source=source,
        revision=o["revision"],
        state_dir=o["state_dir"],
        owner=o["owner"],
        group=o["group"],
        mode=o["mode"],
        dir_mode=o["dir_mode"],
        keep=o["keep"],
        protect_paths=o["protect"],
        workers=o["workers"],
        verify=o["verify"],
        reserve_mib=o["reserve_mib"],
        rsync_opts=o["rsync_opt"],
        ssh_opts=o["ssh_opt"],
        hub_python=o.get("hub_python"),
        hf_token=token,
        hub_endpoint=o.get("hub_endpoint") or "",
        check=o["check"],
        log=lambda m: print(m, file=sys.stderr),
    )


def deploy(engine: Engine, t0: float) -> dict:
    """sync + switch + prune in one go (what the role does); counters from ``t0``."""
    result = engine.sync()
    if result.get("revision") and not result.get("refetch"):
        sw = engine.switch(result["revision"])
        pr = engine.prune()
        result["changed"] = result["changed"] or sw["changed"] or pr["changed"]
        result["stats"] = engine.stats(t0)
    return result


def cli(argv: list[str] | None = None) -> int:
    """``model-sync`` command line; prints one JSON object; exit 0 ok, 1 failure, 2 usage."""
    t0 = now()
    try:
        cmd, path, o = parse_cli(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        problem = f"model-sync: {exc}" if str(exc) else ""
        print(f"{CLI_USAGE}\n{problem}".rstrip(), file=sys.stderr if str(exc) else sys.stdout)
        return 2 if str(exc) else 0
    try:
        if cmd == "listing":
            print(dumps(listing(path)))
            return 0
        if cmd == "manifest":
            print_manifest(path, o["workers"])
            return 0
        if cmd == "verify":
            engine = Engine(path, state_dir=o["state_dir"], workers=o["workers"], verify=o["verify"], check=o["check"])
            result = engine.run("verify", path)
        elif cmd == "deploy":
            result = deploy(engine_of(path, o), t0)
        else:
            result = engine_of(path, o).run(cmd)
        result.pop("config", None)
        print(dumps(result))
        return 0
    except SyncError as exc:
        print(dumps({"failed": True, "msg": str(exc)}))
        print(f"model-sync: {exc}", file=sys.stderr)
        return 1


def main() -> None:
    """Run the command line and exit with its status."""
    sys.exit(cli())
