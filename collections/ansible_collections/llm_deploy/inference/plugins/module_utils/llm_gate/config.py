# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The gate's options: their defaults, their rules (checked once) and the typed result.

:data:`DEFAULTS` is the one list of options and their defaults, shared by the module's
argument_spec, the CLI and the role's defaults; it is read off :class:`GateConfig`'s
fields, and so are the number options' ranges (:data:`RANGE_RULES`). :func:`validate_config`
checks every rule at once and returns a frozen :class:`GateConfig`, which every later step
reads instead of a dict.
"""

from __future__ import annotations

import dataclasses
import math
import urllib.parse
from typing import Any

from .correctness import CONFIDENCES
from .errors import GateUsageError
from .probeset import load_probe_set
from .prompts import load_prompts

SCHEMA_VERSION = 1
ENGINES = ("auto", "sglang", "transformers", "generic")
TTFT_STATISTIC = "p95"
# The figures a baseline (the last-known-good's gate) carries, and whether lower is worse.
BASELINE_FIGURES = {
    "decode_tps_mean": True,
    "ttft_p95_s": False,
    "accept_length": True,
    "effective_max_running_requests": True,
}
# Of those, the counts where any drop is worse (not a drop of more than max_regression_pct).
BASELINE_COUNTS = ("effective_max_running_requests",)
# What must be equal for two gates to be compared: the same measurement on the same prompts
# (the warm-up decides what the prefix cache holds; ``fixed_output``: how the engine was asked for
# exactly max_tokens tokens, None when it could not be). A baseline that lacks one is compared.
BASELINE_SETTINGS = ("requests", "concurrency", "max_tokens", "prompts", "warmup_requests", "fixed_output")
# The ``reference`` option: a reference server's decode tok/s and how this gate is held to it,
# a floor (min_share, adoption) or a lead (margin_pct, bake-off); verdict.compare_reference.
REFERENCE_KEYS = ("decode_tps_mean", "min_share", "margin_pct")
# When the correctness probe runs (llm_gate/correctness.py, wanted): auto (when the unit changed or no
# outputs are recorded yet), always, off.
CORRECTNESS_MODES = ("auto", "always", "off")


def _ranged(default: float, low: int, must: str, strict: bool = False) -> Any:
    """A number option's field: its default and its range (``low``, ``must`` and ``strict`` of a :class:`RangeRule`).

    :data:`RANGE_RULES` is read off these fields: an option's default and its rule stand on one line.
    """
    return dataclasses.field(default=default, metadata={"low": low, "must": must, "strict": strict})


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """A checked set of gate options (built by :func:`validate_config`); the defaults are :data:`DEFAULTS`.

    ``prompts`` holds the loaded ``[{"id", "messages"}, ...]`` once validated.
    """

    url: str = "http://127.0.0.1:30000"
    unit: str | None = None
    pid: int | None = None
    log_file: str | None = None
    model: str | None = None
    api_key: str | None = None
    # The account that runs the server: a local listener on the URL's port of any other account is
    # refused before a key is sent to it (llm_gate/listener.py). None: not checked.
    listener_user: str | None = None
    # The API front's public bind, where clients reach the API while the server listens on loopback
    # behind it (docs/security.md). With an admin key of its own, the gate asks the front's
    # /server_info and /get_server_info with the API key, as a client would, and fails when they hand
    # the admin key over (gate._discover). "": not asked (the server's own routes are, a warning).
    public_url: str = ""
    # The account that runs the front: the public URL's listener guard, as listener_user's for url.
    # None: not checked.
    public_listener_user: str | None = None
    # TLS (docs/security.md, "TLS"): the CA (a PEM file) that an https URL's certificate is verified with
    # ("": the system's CAs) and the name it must be issued to ("": the URL's host).
    ca_file: str = ""
    tls_server_name: str = ""
    engine: str = "auto"
    ready_timeout_s: float = _ranged(1800.0, 0, "more than 0 seconds", strict=True)
    poll_interval_s: float = _ranged(1.0, 0, "more than 0 seconds", strict=True)
    health_timeout_s: float = _ranged(30.0, 0, "more than 0 seconds", strict=True)
    request_timeout_s: float = _ranged(300.0, 0, "more than 0 seconds", strict=True)
    warmup_requests: int = _ranged(2, 0, "0 or more")
    requests: int = _ranged(8, 1, "at least 1 measured request")
    concurrency: int = _ranged(1, 1, "at least 1")
    max_tokens: int = _ranged(256, 2, "at least 2 (decode speed needs two tokens)")
    prompts: Any = None
    min_decode_tps: float = _ranged(0.0, 0, "0 (no check) or positive (tokens/s)")
    max_ttft_s: float = _ranged(0.0, 0, "0 (no check) or positive (seconds)")
    min_accept_length: float = _ranged(0.0, 0, "0 (no check) or positive")
    min_running_requests: int = _ranged(0, 0, "0 (no check) or a number of requests at once")
    baseline: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    max_regression_pct: float = _ranged(0.0, 0, "0 (off) or a percentage")
    regression_min_ttft_delta_s: float = _ranged(0.1, 0, "0 or more seconds")
    allow_prior_restarts: bool = False
    journal_max_lines: int = _ranged(3000, 10, "at least 10")
    journal_max_bytes: int = _ranged(512 * 1024, 1024, "at least 1024 bytes")
    report_dir: str | None = None
    keep_reports: int = _ranged(20, 1, "at least 1")
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The correctness probe (llm_gate/probe.py, judged by llm_gate/correctness.py).
    correctness: str = "auto"
    probe_set: Any = None
    admin_api_key: str | None = None
    min_eval_score: float = _ranged(0.0, 0, "0 (no floor) or a share of the eval answered right, up to 1")
    eval_concurrency: int = _ranged(4, 1, "at least 1")
    eval_margin_pct: float = _ranged(5.0, 0, "0 (off) or percentage points of accuracy")
    eval_confidence: float = 0.95
    golden_min_match_share: float = _ranged(1.0, 0, "a share of the golden prompts, from 0 to 1")
    max_logprob_drift: float = _ranged(0.05, 0, "0 or more (nats per token)")
    max_rescore_kl: float = _ranged(0.0025, 0, "0 or more (nats per token, SGLang's KL estimate)")
    tie_margin: float = _ranged(0.2, 0, "0 or more (nats)")
    require_cache_hit: bool = True
    accept_output_change: bool = False

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> GateConfig:
        """Merge ``options`` over the defaults and check them (:class:`GateUsageError` if bad)."""
        return validate_config(make_config(options))

    @property
    def prompt_ids(self) -> list[str]:
        """The ids of the prompts, in the order they are sent."""
        return [p["id"] for p in self.prompts]

    def settings(self) -> dict[str, Any]:
        """How the gate measures, as the report shows it (no secrets)."""
        shown = {name: getattr(self, name) for name in ("warmup_requests", "requests", "concurrency", "max_tokens")}
        shown["temperature"] = 0
        shown.update(
            {name: getattr(self, name) for name in ("request_timeout_s", "ready_timeout_s", "poll_interval_s")}
        )
        shown.update(prompts=self.prompt_ids, api_key_set=bool(self.api_key))
        return shown

    def thresholds(self) -> dict[str, Any]:
        """The absolute and relative limits, as the report shows them."""
        return {
            "min_decode_tps": self.min_decode_tps,
            "max_ttft_s": self.max_ttft_s,
            "ttft_statistic": TTFT_STATISTIC,
            "min_accept_length": self.min_accept_length,
            "min_running_requests": self.min_running_requests,
            "decode_statistic": "mean",
            "max_regression_pct": self.max_regression_pct,
            "min_eval_score": self.min_eval_score,
            "eval_margin_pct": self.eval_margin_pct,
            "eval_confidence": self.eval_confidence,
            "golden_min_match_share": self.golden_min_match_share,
            "max_logprob_drift": self.max_logprob_drift,
            "max_rescore_kl": self.max_rescore_kl,
            "tie_margin": self.tie_margin,
            "require_cache_hit": self.require_cache_hit,
        }


# Option defaults, shared by the module's argument_spec, the CLI and the role's defaults.
DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(GateConfig)
}


def make_config(options: dict[str, Any]) -> dict[str, Any]:
    """Merge ``options`` over :data:`DEFAULTS` (``None`` values fall back to the default)."""
    cfg = dict(DEFAULTS)
    for key, value in options.items():
        if key not in DEFAULTS:
            raise GateUsageError(f"unknown option {key!r}")
        if value is not None:
            cfg[key] = value
    cfg["metadata"] = dict(cfg.get("metadata") or {})
    return cfg


def _number(cfg: dict[str, Any], key: str, errors: list[str], integer: bool = False) -> float | None:
    """``cfg[key]`` as a finite float (or an int), converted in ``cfg``; None and a note in ``errors`` if not."""
    value = cfg.get(key)
    if isinstance(value, bool):
        errors.append(f"{key} must be a number, not {value!r}")
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        errors.append(f"{key} must be {'an integer' if integer else 'a number'}, got {value!r}")
        return None
    if integer and float(value) != number:
        errors.append(f"{key} must be an integer, got {value!r}")
        return None
    if not integer and (math.isnan(number) or math.isinf(number)):
        errors.append(f"{key} must be finite, got {value!r}")
        return None
    cfg[key] = number
    return number


# Why an integer option's floor is what it is, added to its message.
INTEGER_WHY = {
    "max_tokens": " (decode speed needs at least 2 tokens)",
    "min_running_requests": " (0: no check)",
}


@dataclasses.dataclass(frozen=True)
class RangeRule:
    """The range of one number option: at least ``low``, or more than ``low`` when ``strict``.

    ``must`` says what the value must be in the words of the role's variable
    (``health_gate_<key>``), for :func:`variable_problems`.
    """

    key: str
    low: int
    must: str
    integer: bool = False
    strict: bool = False

    def error(self, value: float) -> str | None:
        """The option's message for ``value`` (already a number), None when it is in range."""
        if value > self.low or (value == self.low and not self.strict):
            return None
        if self.strict:
            return f"{self.key} must be greater than {self.low}, got {value}"
        if self.integer:
            why = INTEGER_WHY.get(self.key, "")
            return f"{self.key} must be at least {self.low}, got {value}{why}"
        return f"{self.key} must be 0 (no check) or positive, got {value}"


# The ranges of the number options, read off GateConfig's fields (:func:`_ranged`; ``integer`` for
# an int field): checked by validate_config (the module, the CLI) and by variable_problems (the
# role's preflight, before anything changes), nowhere else.
RANGE_RULES: tuple[RangeRule, ...] = tuple(
    RangeRule(f.name, integer=f.type == "int", **f.metadata) for f in dataclasses.fields(GateConfig) if f.metadata
)
# The options that are shares (0 to 1), checked on top of their range rule.
SHARE_OPTIONS = ("min_eval_score", "golden_min_match_share")
# The options with a list of values, checked by variable_problems too.
CHOICE_OPTIONS = ("correctness", "eval_confidence")


def url_error(url: str) -> str | None:
    """Why ``url`` is not an http(s)://HOST[:PORT] URL, None when it is one."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url must look like http://HOST:PORT, got {url!r}"
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return f"url has an invalid port: {url!r}"
    return None


def variable_problems(values: dict[str, Any], prefix: str) -> list[str]:
    """One sentence per option in ``values`` that breaks its rule, naming it ``<prefix><key>``.

    ``values`` holds the options as the role's variables set them (strings from ``-e``
    included); the rules are :data:`RANGE_RULES` and :func:`url_error`, as in
    :func:`validate_config`.
    """
    problems = []
    if "url" in values and url_error(str(values["url"] or "")):
        problems.append(f"{prefix}url is {values['url']}, but it must be a URL starting with http:// or https://")
    for rule in RANGE_RULES:
        if rule.key not in values:
            continue
        checked = {rule.key: values[rule.key]}
        errors: list[str] = []
        number = _number(checked, rule.key, errors, integer=rule.integer)
        if errors or (number is not None and rule.error(number)):
            kind = "a whole number, " if rule.integer and errors else ""
            problems.append(f"{prefix}{rule.key} is {values[rule.key]}, but it must be {kind}{rule.must}")
        elif rule.key in SHARE_OPTIONS and number is not None and number > 1:
            problems.append(f"{prefix}{rule.key} is {values[rule.key]}, but it must be {rule.must}")
    if "eval_confidence" in values and _confidence_error(values["eval_confidence"]):
        problems.append(
            f"{prefix}eval_confidence is {values['eval_confidence']}, but it must be one of {_CONFIDENCE_TEXT}"
        )
    if "correctness" in values and values["correctness"] not in CORRECTNESS_MODES:
        problems.append(
            f"{prefix}correctness is {values['correctness']}, but it must be one of {', '.join(CORRECTNESS_MODES)}"
        )
    return problems


_CONFIDENCE_TEXT = ", ".join(f"{c:g}" for c in CONFIDENCES)


def _confidence_error(value: Any) -> str | None:
    """Why ``value`` is not an eval confidence the Wilson bound knows (:data:`.correctness.CONFIDENCES`)."""
    try:
        if float(value) in CONFIDENCES and not isinstance(value, bool):
            return None
    except (TypeError, ValueError):
        pass
    return f"eval_confidence must be one of {_CONFIDENCE_TEXT}, got {value!r}"


def _check_reference(cfg: dict[str, Any], errors: list[str]) -> None:
    """The ``reference`` option: a mapping of ``decode_tps_mean`` (a number, or null when the reference
    server has none) and exactly one of ``min_share`` and ``margin_pct`` (0 or more); numbers converted
    in ``cfg``, problems noted in ``errors``. An empty mapping is no reference.
    """
    reference = cfg.get("reference")
    if not reference:
        cfg["reference"] = None
        return
    if not isinstance(reference, dict):
        errors.append("reference must be a mapping of decode_tps_mean and min_share or margin_pct")
        return
    checked = {key: value for key, value in reference.items() if value is not None}
    unknown = sorted(set(reference) - set(REFERENCE_KEYS))
    if unknown:
        errors.append(f"reference has unknown keys {', '.join(unknown)} (known: {', '.join(REFERENCE_KEYS)})")
    if ("min_share" in checked) == ("margin_pct" in checked):
        errors.append("reference needs exactly one of min_share and margin_pct")
    for key in sorted(set(checked) & set(REFERENCE_KEYS)):
        found: list[str] = []
        value = _number(checked, key, found)
        if found:
            errors.append("reference." + found[0])
        elif key != "decode_tps_mean" and value < 0:
            errors.append(f"reference.{key} must be 0 or more, got {value}")
    cfg["reference"] = checked


def validate_config(options: dict[str, Any]) -> GateConfig:
    """Check every option of a :func:`make_config` result; raise :class:`GateUsageError` listing all problems.

    Converts numbers, loads ``prompts`` (path or list) into a list of ``{"id", "messages"}``
    and returns the frozen :class:`GateConfig`; ``options`` itself is left as it was.
    """
    cfg = dict(options)
    errors: list[str] = []
    problem = url_error(str(cfg.get("url") or ""))
    if problem:
        errors.append(problem)
    if cfg.get("engine") not in ENGINES:
        errors.append(f"engine must be one of {', '.join(ENGINES)}, got {cfg.get('engine')!r}")
    for rule in RANGE_RULES:
        value = _number(cfg, rule.key, errors, integer=rule.integer)
        problem = None if value is None else rule.error(value)
        if problem:
            errors.append(problem)
    baseline = cfg.get("baseline")
    if baseline is not None and not isinstance(baseline, dict):
        errors.append("baseline must be a mapping of the last-known-good's figures")
    elif baseline:
        for key in BASELINE_FIGURES:
            if baseline.get(key) is not None and (
                isinstance(baseline[key], bool) or not isinstance(baseline[key], (int, float))
            ):
                errors.append(f"baseline.{key} must be a number, got {baseline[key]!r}")
        if baseline.get("correctness") is not None and not isinstance(baseline["correctness"], dict):
            errors.append("baseline.correctness must be a mapping (the last-known-good's probe record)")
    _check_reference(cfg, errors)
    if cfg.get("pid") is not None:
        pid = _number(cfg, "pid", errors, integer=True)
        if pid is not None and pid <= 0:
            errors.append(f"pid must be a positive process id, got {pid}")
        if cfg.get("unit"):
            errors.append("watch either a unit or a pid, not both")
    if not isinstance(cfg.get("metadata"), dict):
        errors.append("metadata must be a mapping")
    if cfg.get("unit") is not None and not isinstance(cfg.get("unit"), str):
        errors.append("unit must be a string")
    if cfg.get("listener_user") is not None and not isinstance(cfg.get("listener_user"), str):
        errors.append("listener_user must be an account name or uid")
    public_url = cfg.get("public_url")
    if public_url != "" and (not isinstance(public_url, str) or url_error(public_url)):
        errors.append(
            "public_url must be an http:// or https:// URL of the API front's public bind "
            f"(such as http://127.0.0.1:30000), or empty to not ask it, got {public_url!r}"
        )
    if cfg.get("public_listener_user") is not None and not isinstance(cfg.get("public_listener_user"), str):
        errors.append("public_listener_user must be an account name or uid")
    for name in ("ca_file", "tls_server_name"):
        if not isinstance(cfg.get(name), str):
            errors.append(f"{name} must be a string ('' for none), got {cfg.get(name)!r}")
    try:
        cfg["prompts"] = load_prompts(cfg.get("prompts"))
    except GateUsageError as exc:
        errors.append(str(exc))
    try:
        cfg["probe_set"] = load_probe_set(cfg.get("probe_set"))
    except GateUsageError as exc:
        errors.append(str(exc))
    if cfg.get("correctness") not in CORRECTNESS_MODES:
        errors.append(f"correctness must be one of {', '.join(CORRECTNESS_MODES)}, got {cfg.get('correctness')!r}")
    problem = _confidence_error(cfg.get("eval_confidence"))
    if problem:
        errors.append(problem)
    else:
        cfg["eval_confidence"] = float(cfg["eval_confidence"])
    errors.extend(f"{key} must be at most 1, got {cfg[key]}" for key in SHARE_OPTIONS if (cfg.get(key) or 0) > 1)
    if errors:
        raise GateUsageError("; ".join(errors))
    cfg["allow_prior_restarts"] = bool(cfg.get("allow_prior_restarts"))
    cfg["accept_output_change"] = bool(cfg.get("accept_output_change"))
    cfg["require_cache_hit"] = bool(cfg.get("require_cache_hit", True))
    return GateConfig(**cfg)
