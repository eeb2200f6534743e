"""Launch plan, common part: what the plans of both engines (SGLang, transformers) share.

* the engine's flags as its own parser knows them (``flags/<engine>-<version>.json``,
  written by ``roles/inference_server/files/check-launch-args.py --dump-flags``);
* the settings (engine-neutral knobs, one role variable ``inference_server_<key>`` each) and the
  flags they map to;
* the flag set being planned, with the variable each flag came from (for messages that name it),
  ``inference_server_overrides`` applied to it, and its values checked against the table;
* the environment: persistent caches and ``inference_server_environment`` merged in.

Standard library only; ``PlanError`` is the memory budget's (one class for every part).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploytools.launch_plan import draft
from deploytools.launch_plan.errors import PlanError

FLAG_TABLE_DIR = Path(__file__).resolve().parent / "flags"

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
    "--admin-api-key": "remove it and set inference_server_admin_api_key (vaulted) instead",
}
# The flag the plan uses to hand SGLang the API key file.
CONFIG_FLAG = "--config"


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
    renamed: dict[str, str] = field(default_factory=dict)  # old name -> new, for names the table dropped

    def resolve(self, name: str) -> Flag | None:
        """Return the flag for a canonical name or alias, or None when the engine lacks it."""
        return self.flags.get(self.aliases.get(name, name))

    def current(self, name: str) -> str:
        """The spelling this version wants for a flag the plan names (the plan speaks SGLang 0.5.11's
        names): an alias becomes its canonical flag, a flag this version renamed (deprecated, with a
        replacement it has) becomes the replacement, and so does one it dropped after renaming it
        (``renamed``, from engines.json). An unknown flag stays as it is."""
        spec = self.resolve(name)
        if spec is None:
            new_name = self.renamed.get(name)
            return self.resolve(new_name).name if new_name and self.resolve(new_name) else name
        if spec.deprecated and spec.replacement and (new := self.resolve(spec.replacement)) is not None:
            return new.name
        return spec.name


def version_tuple(version: str) -> tuple[int, ...]:
    """Return the release numbers of a version string ("0.5.11.post1" -> (0, 5, 11))."""
    match = re.match(r"\d+(?:\.\d+)*", str(version).strip().lstrip("v"))
    if not match:
        raise PlanError(
            f"ml_env_engine_version is '{version}', which is not a version number: "
            "check what ml_env recorded for the engine package."
        )
    return tuple(int(part) for part in match.group(0).split("."))


def load_flag_table(engine: str, version: str, table_dir: Path = FLAG_TABLE_DIR) -> FlagTable:
    """Load the committed flag table of ``engine`` closest to ``version``.

    The exact version is used when committed; otherwise the newest older table, or the
    oldest one, with a note saying so (the on-host check with the engine's own parser
    still sees the real flags).
    """
    tables = sorted(table_dir.glob(f"{engine}-*.json"), key=lambda p: version_tuple(p.stem.split("-", 1)[1]))
    if not tables:
        raise PlanError(
            f"no flag table for the {engine} engine in {table_dir}: "
            "restore tools/deploytools/launch_plan/flags from the repository."
        )
    wanted = version_tuple(version)
    by_version = {version_tuple(p.stem.split("-", 1)[1]): p for p in tables}
    note = None
    path = by_version.get(wanted)
    if path is None:
        older = [v for v in by_version if v <= wanted]
        chosen = max(older) if older else min(by_version)
        path = by_version[chosen]
        note = (
            f"no flag table for {engine} {version}: flags checked against "
            f"{engine} {'.'.join(map(str, chosen))} "
            "(add one with check-launch-args.py --dump-flags)"
        )
    data = json.loads(path.read_text())
    flags: dict[str, Flag] = {}
    aliases: dict[str, str] = {}
    for name, spec in data["flags"].items():
        flags[name] = Flag(
            name=name,
            dest=spec["dest"],
            takes=spec["takes"],
            type=spec.get("type"),
            choices=tuple(spec["choices"]) if spec.get("choices") is not None else None,
            deprecated=bool(spec.get("deprecated")),
            replacement=spec.get("replacement"),
        )
        for alias in spec.get("aliases", []):
            aliases[alias] = name
    return FlagTable(
        engine=engine,
        version=data["version"],
        flags=flags,
        aliases=aliases,
        constants=data.get("constants", {}),
        note=note,
    )


@dataclass(frozen=True)
class PlanInput:
    """What ``build_plan`` was given, checked: the inputs of either engine's plan."""

    engine_version: str
    venv_dir: str
    model_path: str
    host: str
    port: int
    settings: Mapping[str, Any]
    overrides: Mapping[str, Any]
    environment: Mapping[str, Any]
    cache_dir: str | None
    table: FlagTable
    api_key_file: str | None = None
    allow_unenforced_api_key: bool = False
    logging_config_file: str | None = None
    drafter: Mapping[str, Any] | None = None  # the keyword arguments of draft.apply_draft
    gpus: Sequence[Mapping[str, Any]] | None = None
    weights_bytes: int | None = None  # the target's and the drafter's weights, which share the GPUs
    model_config: Mapping[str, Any] | None = None


# --------------------------------------------------------------------------------------
# Settings (engine-neutral knobs) and how they map to flags
# --------------------------------------------------------------------------------------

# Each setting is a role variable of its own, ``inference_server_<key>`` (documented in
# roles/inference_server/defaults/main.yml), so an operator turns one from -e, host_vars or
# group_vars and keeps the others; the role composes them into the mapping the plan reads
# (roles/inference_server/vars/main.yml, ``_inference_server_settings``).
SETTING_PREFIX = "inference_server_"


def setting_variable(key: str) -> str:
    """The role variable an operator sets for ``key``, as refusals name it
    (``tensor_parallel_size``: ``inference_server_tensor_parallel_size``)."""
    return SETTING_PREFIX + key


@dataclass(frozen=True)
class Setting:
    """One launch setting (the role variable ``inference_server_<key>``)."""

    key: str
    kind: str  # "int", "float", "bool", "str", "map"
    engines: tuple[str, ...]
    flag: dict[str, str] = field(default_factory=dict)  # engine -> flag (none: planner-only knob)
    positive: bool = True

    @property
    def variable(self) -> str:
        """The role variable that sets it."""
        return setting_variable(self.key)


_BOTH = ("sglang", "transformers")
_SGL = ("sglang",)
# Settings passed as the engine flag of the same name (tensor_parallel_size: --tensor-parallel-size),
# in the order of argv (after --model-path, --host and --port): "key:kind", "+" for a setting of
# both engines, the others SGLang's only.
_FLAG_SETTINGS = (
    "+device:str tensor_parallel_size:int +dtype:str +trust_remote_code:bool context_length:int "
    "mem_fraction_static:float max_running_requests:int page_size:int served_model_name:str enable_metrics:bool "
    "disable_radix_cache:bool speculative_algorithm:str speculative_num_steps:int speculative_eagle_topk:int "
    "speculative_num_draft_tokens:int mamba_scheduler_strategy:str mamba_track_interval:int"
)


def _flag_setting(word: str) -> Setting:
    """One word of ``_FLAG_SETTINGS`` as a :class:`Setting`."""
    key, kind = word.lstrip("+").split(":")
    engines = _BOTH if word.startswith("+") else _SGL
    return Setting(key, kind, engines, {engine: "--" + key.replace("_", "-") for engine in engines})


SETTINGS: tuple[Setting, ...] = (
    *map(_flag_setting, _FLAG_SETTINGS.split()),
    # Knobs of the planner itself, no flag.
    Setting("gpu_memory_headroom_gib", "float", _SGL, positive=False),
    Setting("cpu_threads", "int", ("transformers",)),
    Setting("target_concurrency", "int", _SGL),
    Setting("min_context_length", "int", _SGL),
)
SETTING_BY_KEY = {s.key: s for s in SETTINGS}

# How ``-e name=value`` hands a value over: always as text, so '8', '0.8' and 'true' are read as
# the setting's kind (JSON extra variables and YAML keep their types and need none of this).
_TEXT_PATTERNS = {
    "int": re.compile(r"[+-]?\d+"),
    "float": re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"),
}
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")


def _from_text(kind: str, value: Any) -> Any:
    """A setting given as text (``-e inference_server_target_concurrency=8``) as its kind; any
    other value, and text that is not of that kind, as it is (the type check names it)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind in _TEXT_PATTERNS and _TEXT_PATTERNS[kind].fullmatch(text):
        return int(text) if kind == "int" else float(text)
    if kind == "bool" and text.lower() in _TRUE_WORDS + _FALSE_WORDS:
        return text.lower() in _TRUE_WORDS
    return value


def check_settings(engine: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that are set (``null`` is unset), each of its kind; refuse unknown keys, keys of
    the other engine and values of the wrong type, naming the role variable that set them."""
    checked: dict[str, Any] = {}
    for key in sorted(settings):
        spec = SETTING_BY_KEY.get(key)
        if spec is None:
            known = ", ".join(s.key for s in SETTINGS if engine in s.engines)
            raise PlanError(
                f"the launch plan has no setting '{key}': use one of {known} (each set as {SETTING_PREFIX}<setting>), "
                "or pass the engine flag through inference_server_overrides."
            )
        value = _from_text(spec.kind, settings[key])
        if value is None:
            continue
        if engine not in spec.engines:
            raise PlanError(
                f"{spec.variable} does not apply to the {engine} engine: "
                "remove it from this host's group_vars or host_vars."
            )
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool) and (value > 0 or not spec.positive),
            "float": isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (value > 0 or not spec.positive),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str) and value != "",
            "map": isinstance(value, Mapping),
        }[spec.kind]
        if key == "gpu_memory_headroom_gib" and ok:
            ok = value >= 0
        if not ok:
            expected = {
                "int": "a positive integer",
                "float": "a positive number",
                "bool": "true or false",
                "str": "a non-empty string",
                "map": "a mapping of variable names to values",
            }[spec.kind]
            if key == "gpu_memory_headroom_gib":
                expected = "a number of GiB (0 or more)"
            raise PlanError(
                f"{spec.variable} is {value!r}, but it must be {expected}: "
                "correct it in the host's group_vars or host_vars."
            )
        checked[key] = value
    return checked


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
        """Set (or replace in place) a flag, dropping others that write the same dest.

        Here and in every method below, a flag the engine version renamed is read and written
        under its new name (``FlagTable.current``), so the plan's rules name flags one way."""
        name = self.table.current(flag)
        spec = self.table.resolve(name)
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
        flag = self.table.current(flag)
        spec = self.table.resolve(flag)
        self.removed[spec.name if spec else flag] = source
        for name in [f for f in self.values if f == flag or (spec and self.table.resolve(f) == spec)]:
            del self.values[name]
            self.sources.pop(name, None)

    def get(self, flag: str) -> Any:
        """Return the value of a flag or None."""
        return self.values.get(self.table.current(flag))

    def has(self, flag: str) -> bool:
        """True when the flag is present (a bare flag counts when true; 0 is a value)."""
        value = self.values.get(self.table.current(flag))
        return value is not None and value is not False

    def source(self, flag: str) -> str:
        """The variable a flag came from, for messages."""
        return self.sources.get(self.table.current(flag), "the plan")

    def number(self, flag: str, kind: Callable[[Any], Any] = int, value: Any = None) -> Any:
        """Return a flag's value (or one ``value`` of it) as int/float, refusing what is not a number.

        Flags whose parser type is ``human_readable_int`` (``--context-length``) also accept
        SGLang's suffixes: ``64k`` is 64000, ``64Ki`` is 65536.
        """
        flag = self.table.current(flag)
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
            raise PlanError(
                f"{self.source(flag)} sets {flag} to {value!r}, which is not {noun}: give {flag} {noun}."
            ) from None

    def argv(self, added: Sequence[str]) -> list[str]:
        """The flags as argv elements: the plan's in their order, then those the overrides added, sorted."""
        argv: list[str] = []
        for name in [f for f in self.values if f not in added] + sorted(added):
            if self.has(name):
                argv.append(name)
                argv.extend(argv_values(self.values[name]))
        return argv


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
    """How messages name the override of ``flag``."""
    return f"inference_server_overrides['{flag}']"


def apply_overrides(flags: FlagSet, overrides: Mapping[str, Any], pinned: Mapping[str, str]) -> list[str]:
    """Apply inference_server_overrides; return the canonical names of flags they added."""
    added: list[str] = []
    for given in sorted(overrides):
        value = overrides[given]
        label = _override_label(given)
        if not isinstance(given, str) or not given.startswith("--"):
            raise PlanError(
                f"inference_server_overrides has the key {given!r}, which is not a flag: "
                "write flags in full, for example '--mem-fraction-static'."
            )
        spec = flags.table.resolve(given)
        if spec is None and given in flags.table.renamed:
            raise PlanError(
                f"{label}: {flags.table.engine} {flags.table.version} has no flag {given}, which became "
                f"{flags.table.renamed[given]}: use that name."
            )
        if spec is None:
            hint = _closest(given, list(flags.table.flags) + list(flags.table.aliases))
            hint = f" (did you mean {hint}? write flags in full)" if hint else ""
            raise PlanError(
                f"{label}: {flags.table.engine} {flags.table.version} has no flag {given}{hint}: fix or remove it."
            )
        if spec.name in SECRET_FLAGS:
            raise PlanError(
                f"{label} would put a secret in the unit file and in the server's argv, which every "
                f"user of the host can read: {SECRET_FLAGS[spec.name]}."
            )
        if spec.name == CONFIG_FLAG and flags.table.engine == "sglang":
            raise PlanError(
                f"{label}: the plan passes the API key file with {CONFIG_FLAG}, and SGLang takes only "
                "one: remove it and give those flags through their inference_server_<setting> variables or "
                "inference_server_overrides."
            )
        if spec.name in pinned:
            raise PlanError(
                f"{label} would replace {spec.name}, which the plan takes from "
                f"{pinned[spec.name]}: set that variable instead."
            )
        if spec.deprecated:
            instead = f", use {spec.replacement} instead" if spec.replacement else ""
            raise PlanError(
                f"{label}: {spec.name} is deprecated in {flags.table.engine} {flags.table.version}{instead}: remove it."
            )
        if value is None or value is False:
            flags.remove(spec.name, label)
            continue
        if spec.takes == "none":
            if value is not True:
                raise PlanError(
                    f"{label} is {value!r}, but {spec.name} takes no value: "
                    "set it to true to pass the flag or to null to remove it."
                )
        elif value is True and spec.takes != "optional":
            raise PlanError(f"{label} is true, but {spec.name} needs a value: give the value instead of true.")
        elif isinstance(value, (list, tuple)) and spec.takes != "list":
            raise PlanError(f"{label} is a list, but {spec.name} takes one value: give a single value.")
        elif isinstance(value, Mapping):
            raise PlanError(
                f"{label} is a mapping: give {spec.name} a string or a number (JSON arguments as a quoted string)."
            )
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


def check_values(flags: FlagSet) -> None:
    """Refuse flags the engine does not know and values its parser would reject."""
    for name, value in flags.values.items():
        spec = flags.table.resolve(name)
        source = flags.source(name)
        if spec is None:
            raise PlanError(
                f"{source}: {flags.table.engine} {flags.table.version} has no flag {name}: "
                "remove it or upgrade the engine."
            )
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is True:
                continue
            if spec.type in ("int", "float", "human_readable_int"):
                flags.number(name, float if spec.type == "float" else int, item)
            if spec.choices is not None and str(item) not in spec.choices:
                raise PlanError(
                    f"{source} sets {name} to {item!r}, but {flags.table.engine} accepts only "
                    f"{', '.join(spec.choices)}: use one of them."
                )


def argv_values(value: Any) -> list[str]:
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
# The environment
# --------------------------------------------------------------------------------------


# What every server runs with: the model and the drafter are synced, never fetched; logs unbuffered.
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def cache_env(engine: str, cache_dir: str | None) -> dict[str, str]:
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
        env.update(
            {
                "FLASHINFER_WORKSPACE_BASE": base,  # flashinfer/jit/env.py: <base>/.cache/flashinfer
                "TVM_FFI_CACHE_DIR": f"{base}/tvm-ffi",  # tvm_ffi/cpp/extension.py (FlashInfer, sglang.jit_kernel)
                "SGLANG_CACHE_DIR": f"{base}/sglang",  # sglang/srt/environ.py
                "SGLANG_DG_CACHE_DIR": f"{base}/deep_gemm",  # sglang/srt/environ.py (DeepGEMM JIT)
                "CUDA_CACHE_PATH": f"{base}/nv-compute",  # NVIDIA driver's PTX JIT cache (~/.nv/ComputeCache)
            }
        )
    return env


def root_only_environment(env: Mapping[str, str], root_dir: str, service_dirs: Mapping[str, str]) -> dict[str, str]:
    """The plan's environment for a program root runs with it (the engine's check), with no path into
    a directory the service account can write.

    ``service_dirs`` maps a name to each such directory (the state and cache directories, the
    unit's ``ReadWritePaths``); a value that is such a path, or a colon-separated list holding
    one (``PYTHONPATH``), gets ``<root_dir>/<name>/<the rest>`` instead: HF_HOME, the JIT caches,
    XDG_CACHE_HOME or a HOME there would let root import or load what the account put there.
    Other values stay as they are; relative paths resolve where the program runs.
    """
    dirs = sorted(
        ((posixpath.normpath(path), name) for name, path in service_dirs.items() if path.startswith("/")),
        key=lambda pair: -len(pair[0]),
    )

    def moved(element: str) -> str:
        path = posixpath.normpath(element) if element.startswith("/") else ""
        for top, name in dirs:
            if path == top or path.startswith(top.rstrip("/") + "/"):
                return posixpath.normpath(posixpath.join(root_dir, name, posixpath.relpath(path, top)))
        return element

    return {name: ":".join(moved(element) for element in value.split(":")) for name, value in env.items()}


def merge_environment(base: Mapping[str, str], extra: Mapping[str, Any]) -> dict[str, str]:
    """Merge inference_server_environment (null removes a variable) into the derived environment."""
    env = dict(base)
    for name, value in sorted(extra.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise PlanError(
                f"inference_server_environment has the key {name!r}, which is not an environment "
                "variable name: use letters, digits and underscores."
            )
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
