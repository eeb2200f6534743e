"""Launch plan, engine versions: what the plan must know of each version beyond its flags.

The flags of each version are its own parser's (``flags/<engine>-<version>.json``);
everything else the plan needs to know of a version is data in ``engines.json``, one
place for each fact:

* ``supported``: the versions the project tests (a lock, a flag table, a check venv each),
  how far the memory budget is known to hold for each (``budget``) and whose budget rules size
  its pools (``budget_rules``: ``pools.RULES``; a version without an entry takes the
  nearest older supported version's);
* ``known_bad``: version ranges that break this project's launches, with the upstream issues
  (the plan refuses them with one sentence naming them);
* ``changes``: what changes from a version on (environment variables removed, running requests
  capped instead of refused, what the default mamba strategy resolves to), each with where in
  SGLang's source it was read.

The plan's rules name flags as SGLang 0.5.11 does; ``FlagTable.current`` spells them the way a
version wants: a table that still has the old name marks it deprecated with its replacement, and
for a version that dropped the old name (0.5.23) the ``renames_flags`` of ``changes`` say what
became of it.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploytools.launch_plan import common

ENGINE_FACTS_FILE = Path(__file__).resolve().parent / "engines.json"


@dataclass(frozen=True)
class KnownBad:
    """A version range that breaks a launch of this project, with the upstream issues."""

    first: tuple[int, ...]
    before: tuple[int, ...]
    when: str  # "always" or "hybrid_speculative" (a hybrid model with speculative decoding)
    what: str
    issues: tuple[str, ...]
    fixed_by: str | None

    def applies(self, *, hybrid: bool, speculative: bool) -> bool:
        """True when this launch is the kind the range breaks."""
        return self.when == "always" or (self.when == "hybrid_speculative" and hybrid and speculative)


@dataclass(frozen=True)
class EngineVersion:
    """What the plan knows of one engine version (from ``engines.json``)."""

    engine: str
    version: str
    supported: tuple[str, ...]  # every version the project tests, oldest first
    budget: str | None  # how far the memory budget holds for this version (None: not a supported version)
    budget_rules: str  # whose memory-budget rules size its pools (pools.RULES)
    known_bad: KnownBad | None
    removed_environment: tuple[str, ...]
    renamed_flags: dict[str, str]  # a flag as the plan (0.5.11) names it -> its name in this version
    caps_running_requests: bool
    auto_strategy_extra_buffer: bool  # --mamba-radix-cache-strategy auto resolves to extra_buffer

    @property
    def is_supported(self) -> bool:
        """True for a version the project tests."""
        return self.budget is not None

    def refuse_known_bad(self, *, hybrid: bool, speculative: bool, variable: str) -> None:
        """Raise PlanError when this version is known to break this launch, naming the issues."""
        bad = self.known_bad
        if bad is None or not bad.applies(hybrid=hybrid, speculative=speculative):
            return
        fixed = f", fixed by {bad.fixed_by} in {_dotted(bad.before)}" if bad.fixed_by else ""
        others = [v for v in self.supported if v != self.version]
        raise common.PlanError(
            f"{variable} gives {self.engine} {self.version}, which is known to {bad.what} "
            f"({', '.join(bad.issues)}{fixed}): use a supported version ({', '.join(others)})."
        )

    def note(self) -> str:
        """One line for the plan's notes: supported or not, and how far the budget holds."""
        if self.is_supported:
            return f"{self.engine} {self.version} is a supported version; memory budget: {self.budget}"
        return (
            f"{self.engine} {self.version} is not a version the project tests ({', '.join(self.supported)}): "
            "its own parser still checks the plan on the host before the switch"
        )


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def load_engine_facts(path: Path = ENGINE_FACTS_FILE) -> dict[str, Any]:
    """The whole facts file (``engines.json``)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise common.PlanError(f"cannot read {path}: {err}: restore it from the repository.") from None


def engine_version(engine: str, version: str, facts: Mapping[str, Any] | None = None) -> EngineVersion:
    """What the plan knows of ``engine`` at ``version`` (an engine with no entry: nothing known)."""
    data = (facts if facts is not None else load_engine_facts()).get(engine, {})
    wanted = common.version_tuple(version)
    supported = sorted(data.get("supported", {}), key=common.version_tuple)
    entry = next((v for v in supported if common.version_tuple(v) == wanted), None)
    bad = next(
        (
            KnownBad(
                first=common.version_tuple(b["from"]),
                before=common.version_tuple(b["before"]),
                when=b.get("when", "always"),
                what=b["what"],
                issues=tuple(b.get("issues", ())),
                fixed_by=b.get("fixed_by"),
            )
            for b in data.get("known_bad", [])
            if common.version_tuple(b["from"]) <= wanted < common.version_tuple(b["before"])
        ),
        None,
    )
    changes = [c for c in data.get("changes", []) if common.version_tuple(c["since"]) <= wanted]
    # Budget rules: the version's own, else the nearest older supported version's (as for flag tables).
    rules_of = entry or next((v for v in reversed(supported) if common.version_tuple(v) <= wanted), None)
    return EngineVersion(
        engine=engine,
        version=str(version),
        supported=tuple(supported),
        budget=data["supported"][entry]["budget"] if entry else None,
        budget_rules=data["supported"][rules_of].get("budget_rules", "0.5.11") if rules_of else "0.5.11",
        known_bad=bad,
        removed_environment=tuple(name for c in changes for name in c.get("removes_environment", ())),
        renamed_flags={old: new for c in changes for old, new in c.get("renames_flags", {}).items()},
        caps_running_requests=any(c.get("caps_running_requests") for c in changes),
        auto_strategy_extra_buffer=any(c.get("auto_strategy_extra_buffer") for c in changes),
    )
