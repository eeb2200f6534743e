"""The docs agree with the repository (issue 45: docs named `tasks/await_restart.yml` long after it was
gone, README's scenario table left out `exposure`): every repository path that docs/*.md and
README.md mention exists, and README lists every molecule scenario.

A path is a word that starts with one of the repository's top-level folders (`roles/...`,
`tools/...`) or with a folder of a role (`tasks/restart.yml`, `library/...`: it must exist in
some role). `<placeholder>`, `*` and `{a,b}` stand for any part: the mention needs one match.
Paths an operator creates beside the repository are listed in OPERATOR_PATHS with why.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
# Folders of a role, named in the docs relative to the role (tasks/restart.yml); files/ is also the
# repository's own (files/models/).
ROLE_FOLDERS = ("tasks", "templates", "library", "module_utils", "vars", "defaults", "meta", "action_plugins", "files")
# Paths the docs name that the operator creates, never the repository.
OPERATOR_PATHS = {
    "group_vars/gateways": "the gateways' vaulted keys, the operator's own file (README's variable table)",
    "inventory/host_vars/ct129/vault.yml": "ct129's vaulted keys, the operator's own file (docs/security.md)",
}


def tracked() -> list[str]:
    """The repository's files and the folders that hold them (git ls-files)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}
    return sorted(set(files) | folders)


def mentioned(text: str, tops: list[str]) -> list[str]:
    """The words of ``text`` that are repository paths, as written (placeholders and globs kept)."""
    starts = "|".join(re.escape(top) for top in [*tops, *ROLE_FOLDERS])
    word = re.compile(rf"(?<![\w./<>{{}}*-])(?:{starts})/(?:[\w.*/-]|<[^<>\s]+>|\{{[\w.,-]+\}})*(?<=[\w*>}}])")
    return [m.group(0) for m in word.finditer(text)]


def patterns(path: str) -> list[str]:
    """fnmatch patterns for a mention: a placeholder is any part, {a,b} each of a and b."""
    path = re.sub(r"<[^<>]+>", "*", path)
    parts = re.split(r"\{([^{}]+)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def exists(path: str, known: list[str]) -> bool:
    """A tracked file or folder matches the mention (a role folder's mention: also within some role)."""
    role_relative = path.split("/")[0] in ROLE_FOLDERS
    wanted = [w for p in patterns(path) for w in ([p, f"roles/*/{p}"] if role_relative else [p])]
    return any(fnmatch.fnmatchcase(name, w) for w in wanted for name in known)


def test_the_scanner_finds_and_resolves_the_kinds_of_mention():
    known = [
        "roles/r/tasks/restart.yml",
        "bench/results/gate.json",
        "bench/results/gate.md",
        "tools/flags/sglang-0.5.11.json",
    ]
    text = (
        "`tasks/restart.yml` and tasks/await_restart.yml, /var/lib/roles/x, `bench/results/gate.{json,md}`, "
        "tools/flags/sglang-<version>.json, bench/results/gate.*, roles/r/tasks/restart.yml."
    )
    found = mentioned(text, ["bench", "roles", "tools"])
    assert found == [
        "tasks/restart.yml",
        "tasks/await_restart.yml",
        "bench/results/gate.{json,md}",
        "tools/flags/sglang-<version>.json",
        "bench/results/gate.*",
        "roles/r/tasks/restart.yml",
    ]
    assert [exists(p, known) for p in found] == [True, False, True, True, True, True]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_repository_path_a_doc_mentions_exists(doc: Path):
    known = tracked()
    tops = sorted({name.split("/")[0] for name in known if "/" in name})
    missing = [
        f"line {number}: {path}"
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        for path in mentioned(line, tops)
        if path.rstrip("/.") not in OPERATOR_PATHS and not exists(path.rstrip("/."), known)
    ]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_readme_lists_every_molecule_scenario():
    """README's scenario table and its `molecule test -s` line name each scenario of molecule/."""
    scenarios = sorted(path.parent.name for path in (ROOT / "molecule").glob("*/molecule.yml"))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| scenario | proves |") :].split("\n\n", 1)[0].splitlines()[2:]
    rows = [line.split(" | ")[0].removeprefix("| ") for line in table]
    assert sorted(rows) == scenarios, "README's scenario table"
    command = re.search(r"molecule test -s default +# or: (.*)", readme)
    assert command and sorted(["default", *command.group(1).split(", ")]) == scenarios, "README's molecule test line"
