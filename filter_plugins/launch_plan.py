"""Launch plan: derive an inference engine's argv and environment from the model it serves.

The origin story of this repository failed because the flags a hybrid model needs were
remembered rather than derived, and the first check was a running server falling over.
``launch_plan`` turns what is known about a host (the model's ``config.json``, the GPUs,
the engine version) plus the operator's settings and overrides into the engine's argv,
its environment and human-readable notes, and refuses, with one sentence naming the
variable to change, every combination the engine would refuse at start-up.

    {{ model_sync_config | launch_plan(engine='sglang', engine_version='0.5.11',
                                       venv_dir=..., model_path=..., host=..., port=...,
                                       gpus=preflight_gpus, weights_bytes=...,
                                       settings=inference_server_settings,
                                       overrides=inference_server_overrides,
                                       environment=inference_server_environment,
                                       cache_dir=inference_server_cache_dir) }}

``env`` is the whole environment of the server: the derived variables (caches,
``SGLANG_ENABLE_SPEC_V2``, ...) with ``inference_server_environment`` merged in (``null``
removes a derived one), so the engine's check on the host sees what the unit will run.

Unknown flags are refused offline: ``launch_plan_flags/<engine>-<version>.json`` lists
every flag of the engine's real parser (written by
``roles/inference_server/files/check-launch-args.py --dump-flags``; a test keeps it equal
to the parser). The rules are documented in docs/launch-plan.md.

The module only needs the standard library; Ansible is imported when present so that the
filter raises ``AnsibleFilterError``.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

try:  # Ansible is optional: tools and tests import this module directly.
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - exercised only without ansible-core
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

FLAG_TABLE_DIR = Path(__file__).resolve().parent / "launch_plan_flags"
# The drafter's rules (DFLASH, EAGLE, ...) live beside this file; Ansible loads filter plugins
# under its own names, so it is loaded by path.
_DRAFT_SPEC = importlib.util.spec_from_file_location("launch_plan_draft", Path(__file__).resolve().parent
                                                     / "launch_plan_draft.py")
draft = importlib.util.module_from_spec(_DRAFT_SPEC)  # type: ignore[arg-type]
_DRAFT_SPEC.loader.exec_module(draft)  # type: ignore[union-attr]


def _import_budget() -> Any:
    """launch_plan_budget.py beside this file, by path: Ansible loads filter plugins under its own
    module names, so a plain import would not find it (registered once in sys.modules)."""
    name = "launch_plan_budget"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


budget = _import_budget()

ENGINES = ("sglang", "transformers")
# `sglang serve` exists since 0.5.5; from 0.5.10 `python -m sglang.launch_server` warns.
SGLANG_SERVE_SINCE = (0, 5, 5)
# Algorithms that take --speculative-num-steps/--speculative-eagle-topk/--speculative-num-draft-tokens.
EAGLE_FAMILY = ("NEXTN", "EAGLE", "EAGLE3", "STANDALONE")
# SGLang's own choice (auto_choose_speculative_params) for Qwen3.5/3.6 and most models.
DEFAULT_SPECULATIVE = {"steps": 3, "topk": 1, "draft": budget.DEFAULT_DRAFT_TOKENS}
# GiB per GPU kept free beyond the weights by the quick fit rule that picks the tensor-parallel
# size; the memory budget (launch_plan_budget.py) then sizes SGLang's pools term by term.
# Override with inference_server_settings.gpu_memory_headroom_gib.
DEFAULT_HEADROOM_GIB = 8.0
# Flags that have their own role variable; an override would bypass it.
PINNED = {
    "--model-path": "model_sync_model_dir (the synced model)",
    "--host": "inference_server_host",
    "--port": "inference_server_port",
    **draft.PINNED_DRAFT,
}
# Flags that carry a secret: in an override they would land in the unit file (0644) and in
# the process's argv (/proc/<pid>/cmdline, readable by every user). The API key goes
# through inference_server_api_key instead, which SGLang reads from a root:<group> 0640
# YAML file named by --config (SGLang 0.5.11 reads no environment variable for it).
SECRET_FLAGS = {
    "--api-key": "remove it and set inference_server_api_key (vaulted) instead",
    "--admin-api-key": "remove it (this repository manages no admin key, so SGLang keeps its admin endpoints "
                       "refused)",
}
# The flag the plan uses to hand SGLang the API key file.
CONFIG_FLAG = "--config"


# A refusal: one sentence that names the variable to change and what to do (shared with the budget).
PlanError = budget.PlanError


# --------------------------------------------------------------------------------------
# The engine's flags, as its own parser knows them
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One command-line option of an engine (canonical spelling)."""

    name: str
    dest: str
    takes: str  # "none" (bare), "one", "optional" (nargs ?), "list" (nargs + or *)
    type: str | None = None  # "int", "float", "str" or the name of the parser's callable
    choices: tuple[str, ...] | None = None
    deprecated: bool = False
    replacement: str | None = None


@dataclass
class FlagTable:
    """Every flag of one engine version, with aliases resolved to canonical names."""

    engine: str
    version: str
    flags: dict[str, Flag]
    aliases: dict[str, str]
    constants: dict[str, Any]
    note: str | None = None

    def resolve(self, name: str) -> Flag | None:
        """Return the flag for a canonical name or alias, or None when the engine lacks it."""
        return self.flags.get(self.aliases.get(name, name))


def _version_tuple(version: str) -> tuple[int, ...]:
    """Return the release numbers of a version string ("0.5.11.post1" -> (0, 5, 11))."""
    match = re.match(r"\d+(?:\.\d+)*", str(version).strip().lstrip("v"))
    if not match:
        raise PlanError(
            f"ml_env_engine_version is '{version}', which is not a version number: "
            "check what ml_env recorded for the engine package.")
    return tuple(int(part) for part in match.group(0).split("."))


def load_flag_table(engine: str, version: str, table_dir: Path = FLAG_TABLE_DIR) -> FlagTable:
    """Load the committed flag table of ``engine`` closest to ``version``.

    The exact version is used when committed; otherwise the newest older table, or the
    oldest one, with a note saying so (the on-host check with the engine's own parser
    still sees the real flags).
    """
    tables = sorted(table_dir.glob(f"{engine}-*.json"),
                    key=lambda p: _version_tuple(p.stem.split("-", 1)[1]))
    if not tables:
        raise PlanError(f"no flag table for the {engine} engine in {table_dir}: "
                        "restore filter_plugins/launch_plan_flags from the repository.")
    wanted = _version_tuple(version)
    by_version = {_version_tuple(p.stem.split("-", 1)[1]): p for p in tables}
    note = None
    path = by_version.get(wanted)
    if path is None:
        older = [v for v in by_version if v <= wanted]
        chosen = max(older) if older else min(by_version)
        path = by_version[chosen]
        note = (f"no flag table for {engine} {version}: flags checked against "
                f"{engine} {'.'.join(map(str, chosen))} "
                "(add one with check-launch-args.py --dump-flags)")
    data = json.loads(path.read_text())
    flags: dict[str, Flag] = {}
    aliases: dict[str, str] = {}
    for name, spec in data["flags"].items():
        flags[name] = Flag(name=name, dest=spec["dest"], takes=spec["takes"], type=spec.get("type"),
                           choices=tuple(spec["choices"]) if spec.get("choices") is not None else None,
                           deprecated=bool(spec.get("deprecated")), replacement=spec.get("replacement"))
        for alias in spec.get("aliases", []):
            aliases[alias] = name
    return FlagTable(engine=engine, version=data["version"], flags=flags, aliases=aliases,
                     constants=data.get("constants", {}), note=note)


# --------------------------------------------------------------------------------------
# What the model's config.json says
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """The parts of a model's config.json that decide its launch flags."""

    architecture: str
    model_type: str
    num_layers: int | None
    layer_types: tuple[str, ...]
    attention_heads: int | None
    kv_heads: int | None
    linear_key_heads: int | None
    linear_value_heads: int | None
    mtp_layers: int
    max_positions: int | None

    @property
    def linear_layers(self) -> int:
        """Number of linear-attention (Gated-DeltaNet / mamba-style) layers."""
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def hybrid(self) -> bool:
        """True when any layer is linear attention (SGLang's mamba scheduler applies)."""
        return self.linear_layers > 0


def model_facts(config: Mapping[str, Any]) -> ModelFacts:
    """Read a nested (``text_config``) or flat ``config.json`` into :class:`ModelFacts`."""
    if not isinstance(config, Mapping) or not config:
        raise PlanError("model_sync_config is empty or not a mapping: "
                        "the model's config.json must be read before planning the launch.")
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        text = config
    archs = config.get("architectures") or text.get("architectures") or []
    if not archs:
        raise PlanError("the model's config.json names no architectures: "
                        "check that model_sync_model_dir holds a Hugging Face model.")

    def as_int(key: str, source: Mapping[str, Any] = text) -> int | None:
        value = source.get(key)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    mtp = as_int("mtp_num_hidden_layers")
    if mtp is None:
        mtp = as_int("num_nextn_predict_layers")  # DeepSeek-style MTP heads
    layer_types = tuple(str(t) for t in (text.get("layer_types") or ()))
    return ModelFacts(
        architecture=str(archs[0]),
        model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
        num_layers=as_int("num_hidden_layers"),
        layer_types=layer_types,
        attention_heads=as_int("num_attention_heads"),
        kv_heads=as_int("num_key_value_heads"),
        linear_key_heads=as_int("linear_num_key_heads"),
        linear_value_heads=as_int("linear_num_value_heads"),
        mtp_layers=mtp or 0,
        max_positions=as_int("max_position_embeddings"),
    )


# --------------------------------------------------------------------------------------
# Settings (engine-neutral knobs) and how they map to flags
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One key of inference_server_settings."""

    key: str
    kind: str  # "int", "float", "bool", "str", "map"
    engines: tuple[str, ...]
    flag: dict[str, str] = field(default_factory=dict)  # engine -> flag (none: planner-only knob)
    positive: bool = True


_BOTH = ("sglang", "transformers")
_SGL = ("sglang",)
# Order here is the order of the flags in argv (after --model-path, --host and --port).
SETTINGS: tuple[Setting, ...] = (
    Setting("device", "str", _BOTH, {"sglang": "--device", "transformers": "--device"}),
    Setting("tensor_parallel_size", "int", _SGL, {"sglang": "--tensor-parallel-size"}),
    Setting("dtype", "str", _BOTH, {"sglang": "--dtype", "transformers": "--dtype"}),
    Setting("trust_remote_code", "bool", _BOTH,
            {"sglang": "--trust-remote-code", "transformers": "--trust-remote-code"}),
    Setting("context_length", "int", _SGL, {"sglang": "--context-length"}),
    Setting("mem_fraction_static", "float", _SGL, {"sglang": "--mem-fraction-static"}),
    Setting("max_running_requests", "int", _SGL, {"sglang": "--max-running-requests"}),
    Setting("page_size", "int", _SGL, {"sglang": "--page-size"}),
    Setting("served_model_name", "str", _SGL, {"sglang": "--served-model-name"}),
    Setting("enable_metrics", "bool", _SGL, {"sglang": "--enable-metrics"}),
    Setting("disable_radix_cache", "bool", _SGL, {"sglang": "--disable-radix-cache"}),
    Setting("speculative_algorithm", "str", _SGL, {"sglang": "--speculative-algorithm"}),
    Setting("speculative_num_steps", "int", _SGL, {"sglang": "--speculative-num-steps"}),
    Setting("speculative_eagle_topk", "int", _SGL, {"sglang": "--speculative-eagle-topk"}),
    Setting("speculative_num_draft_tokens", "int", _SGL, {"sglang": "--speculative-num-draft-tokens"}),
    Setting("mamba_scheduler_strategy", "str", _SGL, {"sglang": "--mamba-scheduler-strategy"}),
    Setting("mamba_track_interval", "int", _SGL, {"sglang": "--mamba-track-interval"}),
    Setting("gpu_memory_headroom_gib", "float", _SGL, positive=False),
    Setting("cpu_threads", "int", ("transformers",)),
    Setting("target_concurrency", "int", _SGL),
    Setting("min_context_length", "int", _SGL),
)
SETTING_BY_KEY = {s.key: s for s in SETTINGS}


def _check_setting_types(engine: str, settings: Mapping[str, Any]) -> None:
    """Refuse unknown keys, keys of the other engine, and values of the wrong type."""
    for key in sorted(settings):
        value = settings[key]
        spec = SETTING_BY_KEY.get(key)
        if spec is None:
            known = ", ".join(s.key for s in SETTINGS if engine in s.engines)
            raise PlanError(f"inference_server_settings has no key '{key}': use one of {known}, "
                            "or pass the engine flag through inference_server_overrides.")
        if engine not in spec.engines:
            raise PlanError(f"inference_server_settings.{key} does not apply to the {engine} engine: "
                            "remove it from this host's settings.")
        if value is None:
            continue
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool) and (value > 0 or not spec.positive),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool)
            and (value > 0 or not spec.positive),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str) and value != "",
            "map": isinstance(value, Mapping),
        }[spec.kind]
        if key == "gpu_memory_headroom_gib" and ok:
            ok = value >= 0
        if not ok:
            expected = {"int": "a positive integer", "float": "a positive number", "bool": "true or false",
                        "str": "a non-empty string", "map": "a mapping of variable names to values"}[spec.kind]
            if key == "gpu_memory_headroom_gib":
                expected = "a number of GiB (0 or more)"
            raise PlanError(f"inference_server_settings.{key} is {value!r}, but it must be {expected}: "
                            "correct it in the host's group_vars or host_vars.")


# --------------------------------------------------------------------------------------
# The flag set being planned: canonical flag -> value, plus where each came from
# --------------------------------------------------------------------------------------


@dataclass
class FlagSet:
    """Ordered flags with the variable each came from (for messages that name it)."""

    table: FlagTable
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)  # flag -> the override that removed it

    def set(self, flag: str, value: Any, source: str) -> None:
        """Set (or replace in place) a flag, dropping others that write the same dest."""
        spec = self.table.resolve(flag)
        name = spec.name if spec else flag
        if spec is not None:
            for other in [f for f in self.values if f != name]:
                other_spec = self.table.resolve(other)
                if other_spec is not None and other_spec.dest == spec.dest:
                    del self.values[other]
                    self.sources.pop(other, None)
        self.values[name] = value
        self.sources[name] = source

    def remove(self, flag: str, source: str) -> None:
        """Remove a flag (and its aliases) if present, remembering which variable removed it."""
        spec = self.table.resolve(flag)
        self.removed[spec.name if spec else flag] = source
        for name in [f for f in self.values if f == flag or (spec and self.table.resolve(f) == spec)]:
            del self.values[name]
            self.sources.pop(name, None)

    def get(self, flag: str) -> Any:
        """Return the value of a flag or None."""
        return self.values.get(flag)

    def has(self, flag: str) -> bool:
        """True when the flag is present (a bare flag counts when true; 0 is a value)."""
        value = self.values.get(flag)
        return value is not None and value is not False

    def source(self, flag: str) -> str:
        """The variable a flag came from, for messages."""
        return self.sources.get(flag, "the plan")

    def number(self, flag: str, kind: Callable[[Any], Any] = int, value: Any = None) -> Any:
        """Return a flag's value (or one ``value`` of it) as int/float, refusing what is not a number.

        Flags whose parser type is ``human_readable_int`` (``--context-length``) also accept
        SGLang's suffixes: ``64k`` is 64000, ``64Ki`` is 65536.
        """
        if value is None:
            value = self.values.get(flag)
        if value is None:
            return None
        spec = self.table.resolve(flag)
        try:
            if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError
            if spec is not None and spec.type == "human_readable_int" and isinstance(value, str):
                return _human_readable_int(value)
            return kind(value)
        except (TypeError, ValueError):
            noun = "an integer" if kind is int else "a number"
            raise PlanError(f"{self.source(flag)} sets {flag} to {value!r}, which is not {noun}: "
                            f"give {flag} {noun}.") from None


def _human_readable_int(value: str) -> int:
    """Parse SGLang's human_readable_int: 64000, 64k (SI, decimals allowed) or 64Ki (IEC)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", value.strip())
    if not match:
        raise ValueError(value)
    number, suffix = match.groups()
    if suffix is None:
        return int(number)
    if suffix.endswith("i"):
        if "." in number:
            raise ValueError(value)
        return int(number) * 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
    return int(float(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))


def _override_label(flag: str) -> str:
    return f"inference_server_overrides['{flag}']"


def _apply_overrides(flags: FlagSet, overrides: Mapping[str, Any], pinned: Mapping[str, str]) -> list[str]:
    """Apply inference_server_overrides; return the canonical names of flags they added."""
    added: list[str] = []
    for given in sorted(overrides):
        value = overrides[given]
        label = _override_label(given)
        if not isinstance(given, str) or not given.startswith("--"):
            raise PlanError(f"inference_server_overrides has the key {given!r}, which is not a flag: "
                            "write flags in full, for example '--mem-fraction-static'.")
        spec = flags.table.resolve(given)
        if spec is None:
            hint = _closest(given, list(flags.table.flags) + list(flags.table.aliases))
            hint = f" (did you mean {hint}? write flags in full)" if hint else ""
            raise PlanError(f"{label}: {flags.table.engine} {flags.table.version} has no flag {given}{hint}: "
                            "fix or remove it.")
        if spec.name in SECRET_FLAGS:
            raise PlanError(f"{label} would put a secret in the unit file and in the server's argv, which every "
                            f"user of the host can read: {SECRET_FLAGS[spec.name]}.")
        if spec.name == CONFIG_FLAG and flags.table.engine == "sglang":
            raise PlanError(f"{label}: the plan passes the API key file with {CONFIG_FLAG}, and SGLang takes only "
                            "one: remove it and give those flags through inference_server_settings or "
                            "inference_server_overrides.")
        if spec.name in pinned:
            raise PlanError(f"{label} would replace {spec.name}, which the plan takes from "
                            f"{pinned[spec.name]}: set that variable instead.")
        if spec.deprecated:
            instead = f", use {spec.replacement} instead" if spec.replacement else ""
            raise PlanError(f"{label}: {spec.name} is deprecated in {flags.table.engine} "
                            f"{flags.table.version}{instead}: remove it.")
        if value is None or value is False:
            flags.remove(spec.name, label)
            continue
        if spec.takes == "none":
            if value is not True:
                raise PlanError(f"{label} is {value!r}, but {spec.name} takes no value: "
                                "set it to true to pass the flag or to null to remove it.")
        elif value is True and spec.takes != "optional":
            raise PlanError(f"{label} is true, but {spec.name} needs a value: give the value instead of true.")
        elif isinstance(value, (list, tuple)) and spec.takes != "list":
            raise PlanError(f"{label} is a list, but {spec.name} takes one value: give a single value.")
        elif isinstance(value, Mapping):
            raise PlanError(f"{label} is a mapping: give {spec.name} a string or a number "
                            "(JSON arguments as a quoted string).")
        if spec.name not in flags.values:
            added.append(spec.name)
        flags.set(spec.name, value, label)
    return added


def _closest(name: str, candidates: Sequence[str]) -> str | None:
    """Return the flag ``name`` abbreviates, or the one that differs least (for 'did you mean')."""
    import difflib

    prefixed = sorted(c for c in candidates if c.startswith(name))
    if prefixed:
        return prefixed[0]
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return matches[0] if matches else None


def _check_values(flags: FlagSet) -> None:
    """Refuse flags the engine does not know and values its parser would reject."""
    for name, value in flags.values.items():
        spec = flags.table.resolve(name)
        source = flags.source(name)
        if spec is None:
            raise PlanError(f"{source}: {flags.table.engine} {flags.table.version} has no flag {name}: "
                            "remove it or upgrade the engine.")
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is True:
                continue
            if spec.type in ("int", "float", "human_readable_int"):
                flags.number(name, float if spec.type == "float" else int, item)
            if spec.choices is not None and str(item) not in spec.choices:
                raise PlanError(f"{source} sets {name} to {item!r}, but {flags.table.engine} accepts only "
                                f"{', '.join(spec.choices)}: use one of them.")


def _argv_values(value: Any) -> list[str]:
    """Render a flag value as argv elements (no element for a bare flag)."""
    if value is True:
        return []
    if isinstance(value, (list, tuple)):
        return [_scalar(v) for v in value]
    return [_scalar(value)]


def _scalar(value: Any) -> str:
    """One argv element for a scalar value."""
    return str(value)


# --------------------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------------------


def _gpu_rules(flags: FlagSet, facts: ModelFacts, gpus: Sequence[Mapping[str, Any]] | None,
               weights_bytes: int | None, headroom_gib: float, notes: list[str]) -> tuple[int, int] | None:
    """The tensor-parallel and memory-fit rules of launch_plan_budget.gpu_rules, for the model's heads."""
    heads = {"attention heads (num_attention_heads)": facts.attention_heads}
    if facts.hybrid:
        heads["linear-attention key heads (linear_num_key_heads)"] = facts.linear_key_heads
        heads["linear-attention value heads (linear_num_value_heads)"] = facts.linear_value_heads
    return budget.gpu_rules(flags, {k: v for k, v in heads.items() if v}, gpus, weights_bytes, headroom_gib, notes)


def _nextn_rule(flags: FlagSet, facts: ModelFacts, notes: list[str]) -> None:
    """NEXTN drafts with the model's own MTP head, so the model must have one."""
    if flags.get("--speculative-algorithm") == "NEXTN":
        if facts.mtp_layers < 1:
            raise PlanError(f"{flags.source('--speculative-algorithm')} is NEXTN, which drafts with the model's "
                            f"own MTP head, but {facts.architecture} has mtp_num_hidden_layers "
                            f"{facts.mtp_layers} in config.json: set speculative_algorithm to null, or to EAGLE "
                            "or DFLASH with a drafter in model_sync_draft_source.")
        notes.append(f"NEXTN drafts with the model's own MTP head (mtp_num_hidden_layers {facts.mtp_layers}); "
                     "SGLang reports it as EAGLE")


def _speculative_rules(flags: FlagSet, notes: list[str]) -> None:
    """Steps/topk/draft tokens go together; with topk 1, draft = steps + 1."""
    algo = flags.get("--speculative-algorithm")
    if algo is None:
        stray = [f for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                             "--speculative-num-draft-tokens") if flags.has(f)]
        if stray:
            raise PlanError(f"{flags.source(stray[0])} sets {stray[0]} without a speculative algorithm: "
                            "set inference_server_settings.speculative_algorithm or remove it.")
        return
    if algo not in EAGLE_FAMILY:
        return
    trio = {"steps": "--speculative-num-steps", "topk": "--speculative-eagle-topk",
            "draft": "--speculative-num-draft-tokens"}
    present = {k: f for k, f in trio.items() if flags.has(f)}
    if present and len(present) < 3:
        missing = [f for k, f in trio.items() if k not in present]
        first = next(iter(present.values()))
        raise PlanError(f"{flags.source(first)} sets {first} without {' and '.join(missing)}: "
                        "SGLang needs all three or none, so set all three (3, 1, 4 is SGLang's own choice) "
                        "or none.")
    if not present:
        notes.append(f"speculative decoding {algo}: steps, top-k and draft tokens left to SGLang, which picks "
                     "3/1/4 for most models")
        return
    steps, topk, draft = (flags.number(trio[k]) for k in ("steps", "topk", "draft"))
    if topk == 1 and draft != steps + 1:
        raise PlanError(f"{flags.source(trio['draft'])} is {draft}, but with speculative_eagle_topk 1 SGLang "
                        f"uses speculative_num_steps + 1 = {steps + 1} draft tokens: set it to {steps + 1}.")
    if topk is not None and topk > 1:
        notes.append(f"speculative_eagle_topk {topk} > 1: SGLang falls back to spec v1 "
                     "(no overlap scheduler)")
    notes.append(f"speculative decoding {algo}: {steps} steps, top-k {topk}, {draft} draft tokens; SGLang "
                 "sets --max-running-requests to 48 unless it is set")


def _mamba_rules(flags: FlagSet, facts: ModelFacts, env: Mapping[str, str], notes: list[str],
                 constants: Mapping[str, Any]) -> None:
    """Hybrid + speculative decoding: extra_buffer with the radix cache, and its limits."""
    algo = flags.get("--speculative-algorithm")
    strategy = flags.get("--mamba-scheduler-strategy") or "auto"
    radix = not flags.has("--disable-radix-cache")
    if not facts.hybrid:
        if flags.has("--mamba-scheduler-strategy"):
            notes.append(f"--mamba-scheduler-strategy has no effect: {facts.architecture} has no "
                         "linear-attention layers")
        return
    if strategy == "extra_buffer":
        if not radix:
            strategy_source = flags.source("--mamba-scheduler-strategy")
            todo = ("set disable_radix_cache: true in inference_server_settings instead, so the plan keeps "
                    "no_buffer" if strategy_source.startswith("the plan") else "drop one of the two")
            raise PlanError(f"{flags.source('--disable-radix-cache')} disables the radix cache, which SGLang "
                            "refuses together with --mamba-scheduler-strategy extra_buffer, set by "
                            f"{strategy_source}: {todo}.")
        interval = flags.number("--mamba-track-interval")
        interval_source = (flags.source("--mamba-track-interval") if interval is not None
                           else "the default --mamba-track-interval")
        if interval is None:
            interval = int(constants.get("mamba_track_interval_default", 256))
        draft = flags.number("--speculative-num-draft-tokens")
        if algo is not None and draft is not None and interval < draft:
            raise PlanError(f"{interval_source} is {interval}, less than the {draft} speculative draft tokens, "
                            f"which SGLang refuses with extra_buffer: set it to at least {draft}.")
        page = flags.number("--page-size")
        if page is not None:
            chunk = int(constants.get("fla_chunk_size", 64))
            if max(chunk, page) % min(chunk, page):
                raise PlanError(f"{flags.source('--page-size')} is {page}, but with extra_buffer the page size "
                                f"and SGLang's linear-attention chunk size {chunk} must divide one another: "
                                "use a power of two such as 16, 32, 64 or 128.")
            if interval % page:
                raise PlanError(f"{interval_source} is {interval}, which is not divisible by --page-size {page} "
                                f"(set by {flags.source('--page-size')}): set mamba_track_interval to a multiple "
                                f"of {page}.")
    if algo is None:
        return
    if strategy != "extra_buffer" and radix:
        given = flags.get("--mamba-scheduler-strategy")
        if given is not None:
            source = flags.source("--mamba-scheduler-strategy")
            todo = f"set {source} to extra_buffer" + (
                " or leave it unset so the plan derives it" if source.startswith("inference_server_settings") else "")
        elif "--mamba-scheduler-strategy" in flags.removed:
            todo = (f"remove {flags.removed['--mamba-scheduler-strategy']}, which removes the extra_buffer "
                    "the plan derived")
        else:
            todo = ("set speculative_algorithm in inference_server_settings rather than in "
                    "inference_server_overrides so the plan derives extra_buffer, or add "
                    "'--mamba-scheduler-strategy: extra_buffer' to inference_server_overrides")
        current = given or "no_buffer (the default auto)"
        raise PlanError(f"speculative decoding ({flags.source('--speculative-algorithm')}: {algo}) on the hybrid "
                        f"model {facts.architecture} with the radix cache needs --mamba-scheduler-strategy "
                        f"extra_buffer and SGLANG_ENABLE_SPEC_V2=1, not {current}, and SGLang refuses it at "
                        f"start-up: {todo}, or set disable_radix_cache: true in inference_server_settings.")
    if strategy == "extra_buffer" and str(env.get("SGLANG_ENABLE_SPEC_V2", "")).lower() not in ("1", "true"):
        raise PlanError("inference_server_environment sets SGLANG_ENABLE_SPEC_V2 to "
                        f"{env.get('SGLANG_ENABLE_SPEC_V2')!r}, but speculative decoding with extra_buffer on the "
                        f"hybrid model {facts.architecture} needs it at 1: remove it from "
                        "inference_server_environment.")
    if strategy == "extra_buffer":
        notes.append(f"hybrid model ({facts.linear_layers} of {len(facts.layer_types)} layers linear_attention) "
                     "+ speculative decoding + radix cache: --mamba-scheduler-strategy extra_buffer and "
                     "SGLANG_ENABLE_SPEC_V2=1 (5 mamba state slots per running request with the overlap "
                     "scheduler: see the memory budget)")
    else:
        notes.append(f"hybrid model + speculative decoding with the radix cache disabled "
                     f"(--mamba-scheduler-strategy {strategy}): no prefix caching")


def _sglang_flags(table: FlagTable, facts: ModelFacts, settings: Mapping[str, Any], model_path: str,
                  host: str, port: int, notes: list[str]) -> FlagSet:
    """Flags derived from the settings and the model, before overrides."""
    flags = FlagSet(table)
    flags.set("--model-path", model_path, "model_sync_model_dir")
    flags.set("--host", host, "inference_server_host")
    flags.set("--port", port, "inference_server_port")
    for spec in SETTINGS:
        flag = spec.flag.get("sglang")
        value = settings.get(spec.key)
        if flag is None or value is None or value is False:
            continue
        flags.set(flag, value, f"inference_server_settings.{spec.key}")
        if spec.key == "speculative_algorithm":
            spec_keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
            if value in EAGLE_FAMILY and all(settings.get(k) is None for k in spec_keys):
                for key, default in zip(spec_keys, DEFAULT_SPECULATIVE.values(), strict=True):
                    flags.set(SETTING_BY_KEY[key].flag["sglang"], default,
                              f"the plan (default for inference_server_settings.{key})")
                notes.append("speculative steps/top-k/draft tokens not set: the plan uses SGLang's own "
                             "choice 3/1/4")
    speculative = settings.get("speculative_algorithm") is not None
    if (facts.hybrid and speculative and settings.get("mamba_scheduler_strategy") is None
            and not settings.get("disable_radix_cache")):
        flags.set("--mamba-scheduler-strategy", "extra_buffer",
                  "the plan (derived from inference_server_settings.speculative_algorithm)")
    _settings_order(flags, [])
    return flags


def _settings_order(flags: FlagSet, added: Sequence[str]) -> None:
    """Put the plan's flags in SETTINGS order (the speculative trio and mamba flags after the
    algorithm); flags that overrides added keep their place after them."""
    order = [f for s in SETTINGS for f in [s.flag.get("sglang")] if f]
    head = ["--model-path", "--host", "--port"]
    ranked = head + [f for f in order if f not in head]
    flags.values = dict(sorted(flags.values.items(),
                               key=lambda kv: ranked.index(kv[0]) if kv[0] in ranked and kv[0] not in added
                               else len(ranked)))


def _cache_env(engine: str, cache_dir: str | None) -> dict[str, str]:
    """Persistent JIT/compile caches under one directory (names checked in each project's source)."""
    if not cache_dir:
        return {}
    base = cache_dir.rstrip("/")
    env = {
        "HF_HOME": f"{base}/huggingface",  # huggingface_hub; transformers serve's /v1/models scans it
        "TORCHINDUCTOR_CACHE_DIR": f"{base}/torchinductor",  # torch/_inductor/runtime/cache_dir_utils.py
        "TRITON_CACHE_DIR": f"{base}/triton",  # triton/knobs.py cache_knobs.dir
        "XDG_CACHE_HOME": base,  # everything else that defaults to ~/.cache
    }
    if engine == "sglang":
        env.update({
            "FLASHINFER_WORKSPACE_BASE": base,  # flashinfer/jit/env.py: <base>/.cache/flashinfer
            "TVM_FFI_CACHE_DIR": f"{base}/tvm-ffi",  # tvm_ffi/cpp/extension.py (FlashInfer, sglang.jit_kernel)
            "SGLANG_CACHE_DIR": f"{base}/sglang",  # sglang/srt/environ.py
            "SGLANG_DG_CACHE_DIR": f"{base}/deep_gemm",  # sglang/srt/environ.py (DeepGEMM JIT)
            "CUDA_CACHE_PATH": f"{base}/nv-compute",  # NVIDIA driver's PTX JIT cache (~/.nv/ComputeCache)
        })
    return env


def _environment(base: Mapping[str, str], extra: Mapping[str, Any]) -> dict[str, str]:
    """Merge inference_server_environment (null removes a variable) into the derived environment."""
    env = dict(base)
    for name, value in sorted(extra.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise PlanError(f"inference_server_environment has the key {name!r}, which is not an environment "
                            "variable name: use letters, digits and underscores.")
        if value is None:
            env.pop(name, None)
        elif isinstance(value, (Mapping, list, tuple)):
            raise PlanError(f"inference_server_environment.{name} is not a scalar: give it a string.")
        else:
            env[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return dict(sorted(env.items()))


# SGLang logs its whole ServerArgs at INFO when it starts (``logger.info(f"{server_args=}")``
# in sglang.srt.entrypoints.engine, the module's only INFO lines), the API key included:
# seen in the journal of a real SGLang 0.5.11 run (bench/results/gpu_api_key.md). With a key
# set, the unit points SGLANG_LOGGING_CONFIG_PATH at this dictConfig, which keeps that one
# logger at WARNING and otherwise logs as SGLang does (less its " TPn" line prefix, which
# SGLang only adds when it configures logging itself).
SGLANG_SILENT_LOGGERS = ("sglang.srt.entrypoints.engine", "httpx", "httpcore")


def sglang_logging_config(level: str) -> dict[str, Any]:
    """The dictConfig SGLang loads from SGLANG_LOGGING_CONFIG_PATH: its own format and level,
    without the logger that prints the server arguments."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"sglang": {"format": "[%(asctime)s] %(message)s", "datefmt": "%Y-%m-%d %H:%M:%S"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "sglang",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {name: {"level": "WARNING"} for name in SGLANG_SILENT_LOGGERS},
    }


def _keep_key_out_of_logs(flags: FlagSet, env: dict[str, str], environment: Mapping[str, Any],
                          logging_config_file: str | None, notes: list[str]) -> dict[str, Any] | None:
    """With an API key: the logging configuration (returned) and its variable in ``env``."""
    if "SGLANG_LOGGING_CONFIG_PATH" in environment:
        notes.append("SGLANG_LOGGING_CONFIG_PATH comes from inference_server_environment: that configuration "
                     "must keep the logger sglang.srt.entrypoints.engine at WARNING, or SGLang logs the API key")
        return None
    if not logging_config_file:
        notes.append("no logging_config_file: SGLang will log its arguments, the API key included, when it starts")
        return None
    level = _argv_values(flags.values["--log-level"])[0] if flags.has("--log-level") else "info"
    env["SGLANG_LOGGING_CONFIG_PATH"] = logging_config_file
    notes.append(f"SGLang's start-up dump of its arguments (the API key included) is kept out of the journal: "
                 f"{logging_config_file} (SGLANG_LOGGING_CONFIG_PATH) logs at {level} without the logger "
                 "sglang.srt.entrypoints.engine")
    return sglang_logging_config(level)


def plan_sglang(facts: ModelFacts, *, engine_version: str, venv_dir: str, model_path: str, host: str,
                port: int, gpus: Sequence[Mapping[str, Any]] | None, weights_bytes: int | None,
                settings: Mapping[str, Any], overrides: Mapping[str, Any], environment: Mapping[str, Any],
                cache_dir: str | None, table: FlagTable, api_key_file: str | None = None,
                logging_config_file: str | None = None, model_config: Mapping[str, Any] | None = None,
                drafter: Mapping[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    """The SGLang plan: entry point, flags, environment, notes, the memory budget (``budget``, when
    the weights' size is known) and with an API key the logging configuration that keeps it out of
    the logs (``logging_config``)."""
    notes: list[str] = []
    flags = _sglang_flags(table, facts, settings, model_path, host, port, notes)
    added = _apply_overrides(flags, overrides, PINNED)
    _check_values(flags)
    draft.apply_draft(flags, notes=notes, error=PlanError, **(drafter or {}))
    speculative = flags.get("--speculative-algorithm") is not None
    env = dict(_cache_env("sglang", cache_dir))
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    if facts.hybrid and speculative:
        env["SGLANG_ENABLE_SPEC_V2"] = "1"
    env = _environment(env, environment)

    headroom = settings.get("gpu_memory_headroom_gib")
    sized = _gpu_rules(flags, facts, gpus, weights_bytes,
                       DEFAULT_HEADROOM_GIB if headroom is None else float(headroom), notes)
    context = flags.number("--context-length") if "--context-length" in flags.values else None
    if context is not None and facts.max_positions and context > facts.max_positions \
            and env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1":
        raise PlanError(f"{flags.source('--context-length')} is {context}, more than the model's "
                        f"max_position_embeddings {facts.max_positions}: lower it (SGLang refuses it unless "
                        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is in inference_server_environment).")
    _nextn_rule(flags, facts, notes)
    _mamba_rules(flags, facts, env, notes, table.constants)
    _speculative_rules(flags, notes)
    memory = None
    if sized is not None:  # the budget sets --mem-fraction-static, --max-running-requests, --context-length
        memory = budget.plan_memory(flags, model_config, tp=sized[0], gpu_mib=sized[1], weights_bytes=weights_bytes,
                                    settings=settings, env=env, notes=notes)
        _settings_order(flags, added)

    version = _version_tuple(engine_version)
    venv = venv_dir.rstrip("/")
    if version >= SGLANG_SERVE_SINCE:
        entry = [f"{venv}/bin/sglang", "serve"]
        notes.append(f"entry point: sglang serve (SGLang {engine_version} >= 0.5.5)")
    else:
        entry = [f"{venv}/bin/python", "-m", "sglang.launch_server"]
        notes.append(f"entry point: python -m sglang.launch_server (SGLang {engine_version} has no "
                     "`sglang serve`)")
    ordered = [f for f in flags.values if f not in added] + sorted(added)
    argv = list(entry)
    for name in ordered:
        if flags.has(name):
            argv.append(name)
            argv.extend(_argv_values(flags.values[name]))
    plan: dict[str, Any] = {"argv": argv, "env": env, "notes": notes}
    if memory is not None:
        plan["budget"] = memory
    if api_key_file:
        argv.extend([CONFIG_FLAG, api_key_file])
        notes.append(f"API key (inference_server_api_key) read by SGLang from {api_key_file} ({CONFIG_FLAG}), so it "
                     "is in neither the unit file nor the argv; /health and /metrics stay open, /v1/* needs the key")
        logging_config = _keep_key_out_of_logs(flags, env, environment, logging_config_file, notes)
        if logging_config is not None:
            plan["env"] = dict(sorted(env.items()))
            plan["logging_config"] = logging_config
    return plan


# --------------------------------------------------------------------------------------
# transformers serve (CPU rehearsal)
# --------------------------------------------------------------------------------------


def plan_transformers(facts: ModelFacts, *, engine_version: str, venv_dir: str, model_path: str, host: str,
                      port: int, settings: Mapping[str, Any], overrides: Mapping[str, Any],
                      environment: Mapping[str, Any], cache_dir: str | None, table: FlagTable,
                      api_key_file: str | None = None, allow_unenforced_api_key: bool = False,
                      **_: Any) -> dict[str, Any]:
    """The ``transformers serve`` plan: pinned to the model directory, CPU by default.

    ``transformers serve`` has no API key: a key is refused (it would leave /v1/* open while
    looking protected) unless ``allow_unenforced_api_key`` says the operator knows.
    """
    notes: list[str] = []
    if api_key_file and not allow_unenforced_api_key:
        raise PlanError("inference_server_api_key is set, but transformers serve has no API key support and would "
                        "leave /v1/* open: leave it empty for this engine, or set "
                        "inference_server_allow_unenforced_api_key to true to rehearse the key's path unenforced.")
    if api_key_file:
        notes.append("transformers serve has no API key support: /v1/* is NOT protected on this host; the key is "
                     f"written to {api_key_file} and sent by the gate only (inference_server_allow_unenforced_api_key)")
    flags = FlagSet(table)
    flags.set("--host", host, "inference_server_host")
    flags.set("--port", port, "inference_server_port")
    flags.set("--device", settings.get("device") or "cpu",
              "inference_server_settings.device" if settings.get("device") else "the plan (default cpu)")
    for spec in SETTINGS:
        flag = spec.flag.get("transformers")
        value = settings.get(spec.key)
        if flag and spec.key != "device" and value is not None and value is not False:
            flags.set(flag, value, f"inference_server_settings.{spec.key}")
    pinned = {"--host": PINNED["--host"], "--port": PINNED["--port"]}
    added = _apply_overrides(flags, overrides, pinned)
    _check_values(flags)
    _version_tuple(engine_version)
    env = _cache_env("transformers", cache_dir)
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    threads = settings.get("cpu_threads")
    if threads:
        # torch sizes its intra-op pool from OMP_NUM_THREADS (MKL's from MKL_NUM_THREADS);
        # unset, every server takes every core, and several on one machine oversubscribe it.
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
        notes.append(f"CPU threads per server: {threads} (inference_server_settings.cpu_threads: "
                     "OMP_NUM_THREADS, MKL_NUM_THREADS)")
    env = _environment(env, environment)
    if facts.mtp_layers:
        notes.append(f"transformers serve ignores the model's MTP head (mtp_num_hidden_layers {facts.mtp_layers}):"
                     " no speculative decoding in this profile")
    if facts.hybrid:
        notes.append(f"hybrid model ({facts.linear_layers} of {len(facts.layer_types)} layers linear_attention): "
                     "transformers runs the Gated-DeltaNet layers in torch (slow without flash-linear-attention)")
    notes.append(f"entry point: transformers serve (transformers {engine_version}), pinned to the model "
                 "directory (its positional argument, right after serve)")
    ordered = [f for f in flags.values if f not in added] + sorted(added)
    argv = [f"{venv_dir.rstrip('/')}/bin/transformers", "serve", model_path]
    for name in ordered:
        if flags.has(name):
            argv.append(name)
            argv.extend(_argv_values(flags.values[name]))
    return {"argv": argv, "env": env, "notes": notes}


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def build_plan(model_config: Mapping[str, Any], *, engine: str, engine_version: str, venv_dir: str,
               model_path: str, host: str, port: int | str,
               gpus: Sequence[Mapping[str, Any]] | None = None, weights_bytes: int | None = None,
               settings: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None,
               environment: Mapping[str, Any] | None = None, cache_dir: str | None = None,
               api_key_file: str | None = None, allow_unenforced_api_key: bool = False,
               logging_config_file: str | None = None, draft_config: Mapping[str, Any] | None = None,
               draft_path: str | None = None, draft_weights_bytes: int | None = None,
               table_dir: Path = FLAG_TABLE_DIR) -> dict[str, Any]:
    """Return ``{"argv", "env", "notes"}`` for one host or raise :class:`PlanError`.

    ``api_key_file`` is the path of the file holding the API key when one is set (never the
    key itself: the plan is printed and stored, the key must not be). With it and
    ``logging_config_file``, an SGLang plan also has ``logging_config``: the JSON the role
    writes to that path so that SGLang does not log the key.
    """
    if engine not in ENGINES:
        raise PlanError(f"inference_server_engine is {engine!r}: use one of {', '.join(ENGINES)}.")
    if not engine_version:
        raise PlanError("ml_env_engine_version is empty: the ml_env role records the installed engine "
                        "version, run it first (or give offline_plan.engine_version).")
    for name, value in (("ml_env_venv_dir", venv_dir), ("model_sync_model_dir", model_path),
                        ("inference_server_host", host)):
        if not isinstance(value, str) or not value:
            raise PlanError(f"{name} is empty: it must be a path or address before the launch can be planned.")
    try:
        port_number = int(port)
    except (TypeError, ValueError):
        port_number = 0
    if isinstance(port, bool) or not 0 < port_number < 65536:
        raise PlanError(f"inference_server_port is {port!r}: use a TCP port between 1 and 65535.")
    if not isinstance(settings or {}, Mapping):
        raise PlanError("inference_server_settings must be a mapping of setting names to values: "
                        "see docs/launch-plan.md for the keys.")
    if not isinstance(overrides or {}, Mapping):
        raise PlanError("inference_server_overrides must be a mapping of '--flag' to a value "
                        "(true for a bare flag, null or false to remove one).")
    if not isinstance(environment or {}, Mapping):
        raise PlanError("inference_server_environment must be a mapping of variable names to values.")
    settings = dict(settings or {})
    _check_setting_types(engine, settings)
    if weights_bytes is not None:
        try:
            weights_bytes = int(weights_bytes)
        except (TypeError, ValueError):
            raise PlanError(f"model_sync_weights_bytes is {weights_bytes!r}, not a number of bytes: "
                            "check what model_sync recorded.") from None
    facts = model_facts(model_config)
    table = load_flag_table(engine, str(engine_version), table_dir)
    kwargs: dict[str, Any] = {
        "engine_version": str(engine_version), "venv_dir": venv_dir, "model_path": model_path, "host": host,
        "port": port_number, "settings": settings, "overrides": dict(overrides or {}),
        "environment": dict(environment or {}), "cache_dir": cache_dir,
        "table": table, "api_key_file": api_key_file or None,
        "allow_unenforced_api_key": bool(allow_unenforced_api_key),
        "logging_config_file": logging_config_file or None,
        "drafter": {"model_config": model_config, "draft_config": draft_config, "draft_path": draft_path or None},
    }
    if weights_bytes is not None and draft_path and draft_weights_bytes:  # the drafter shares the GPUs
        kwargs["weights_bytes"] = weights_bytes + int(draft_weights_bytes)
    if engine == "sglang":
        plan = plan_sglang(facts, gpus=gpus, **{"weights_bytes": weights_bytes, "model_config": model_config,
                                                **kwargs})
    else:
        plan = plan_transformers(facts, **kwargs)
    head = (f"model {facts.architecture} ({facts.model_type}): {facts.num_layers} layers"
            + (f", {facts.linear_layers} linear_attention + {len(facts.layer_types) - facts.linear_layers} "
               "full_attention (hybrid)" if facts.hybrid else "")
            + f", {facts.attention_heads} attention heads, MTP layers {facts.mtp_layers}")
    plan["notes"] = [head] + plan["notes"] + ([table.note] if table.note else [])
    if cache_dir:
        plan["notes"].append(f"JIT and compile caches under {cache_dir.rstrip('/')}")
    return plan


def launch_plan(model_config: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Ansible filter entry point: the arguments of :func:`build_plan`, refusals as AnsibleFilterError."""
    try:
        return build_plan(model_config, **kwargs)
    except PlanError as err:
        raise AnsibleFilterError(str(err)) from None
    except TypeError as err:  # a missing or misspelt keyword argument
        raise AnsibleFilterError(f"launch_plan: {err}") from None


class FilterModule:
    """Ansible filters for the inference server's launch plan."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """Map filter names to functions."""
        return {"launch_plan": launch_plan}
