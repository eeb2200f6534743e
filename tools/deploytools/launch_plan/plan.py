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
                                       settings=_inference_server_settings,
                                       overrides=inference_server_overrides,
                                       environment=inference_server_environment,
                                       cache_dir=inference_server_cache_dir) }}

``settings`` maps each setting to its value (roles/inference_server/vars/main.yml composes it from
the role variables ``inference_server_<setting>``, one a setting; ``null`` is unset); a refusal
names the variable the operator set (``setting_variable``).

``env`` is the whole environment of the server: the derived variables (caches,
``SGLANG_ENABLE_SPEC_V2``, ...) with ``inference_server_environment`` merged in (``null``
removes a derived one), so the engine's check on the host sees what the unit will run.

Unknown flags are refused offline: ``flags/<engine>-<version>.json`` lists
every flag of the engine's real parser (written by
``roles/inference_server/files/check-launch-args.py --dump-flags``; a test keeps it equal
to what that parser accepts).

The plan is split by concern, one module each beside this one in the package
(``deploytools.launch_plan``'s docstring lists them); the Ansible filters ``launch_plan`` and
``memory_budget`` are filter_plugins/launch_plan.py, which turns :class:`PlanError` into
AnsibleFilterError. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deploytools.launch_plan.common import (  # noqa: F401  (the names callers of launch_plan.py use)
    FLAG_TABLE_DIR,
    SETTINGS,
    PlanError,
    PlanInput,
    check_settings,
    load_flag_table,
    setting_variable,
)
from deploytools.launch_plan.engines import engine_version as engine_version_facts
from deploytools.launch_plan.model import model_facts
from deploytools.launch_plan.rehearsal import plan_transformers
from deploytools.launch_plan.sglang import plan_sglang
from deploytools.systemd_unit import CONTROL_CHARACTERS  #  (a newline in a unit's value starts a new unit line)

ENGINES = ("sglang", "transformers")


def build_plan(
    model_config: Mapping[str, Any],
    *,
    engine: str,
    engine_version: str,
    venv_dir: str,
    model_path: str,
    host: str,
    port: int | str,
    gpus: Sequence[Mapping[str, Any]] | None = None,
    weights_bytes: int | None = None,
    settings: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    api_key_file: str | None = None,
    allow_unenforced_api_key: bool = False,
    logging_config_file: str | None = None,
    draft_config: Mapping[str, Any] | None = None,
    draft_path: str | None = None,
    draft_weights_bytes: int | None = None,
    table_dir: Path = FLAG_TABLE_DIR,
) -> dict[str, Any]:
    """Return ``{"argv", "env", "notes"}`` for one host or raise :class:`PlanError`.

    ``api_key_file`` is the path of the file holding the API key when one is set (never the
    key itself: the plan is printed and stored, the key must not be). With it and
    ``logging_config_file``, an SGLang plan also has ``logging_config``: the JSON the role
    writes to that path so that SGLang does not log the key.
    """
    if engine not in ENGINES:
        raise PlanError(f"inference_server_engine is {engine!r}: use one of {', '.join(ENGINES)}.")
    if not engine_version:
        raise PlanError(
            "ml_env_engine_version is empty: the ml_env role records the installed engine "
            "version, run it first (or give offline_plan.engine_version)."
        )
    for name, value in (
        ("ml_env_venv_dir", venv_dir),
        ("model_sync_model_dir", model_path),
        ("inference_server_host", host),
    ):
        if not isinstance(value, str) or not value:
            raise PlanError(f"{name} is empty: it must be a path or address before the launch can be planned.")
    try:
        port_number = int(port)
    except (TypeError, ValueError):
        port_number = 0
    if isinstance(port, bool) or not 0 < port_number < 65536:
        raise PlanError(f"inference_server_port is {port!r}: use a TCP port between 1 and 65535.")
    if not isinstance(settings or {}, Mapping):
        raise PlanError(
            "the launch plan's settings must be a mapping of setting names to values, each set as its "
            "inference_server_<setting> variable: see docs/launch-plan.md for the settings."
        )
    if not isinstance(overrides or {}, Mapping):
        raise PlanError(
            "inference_server_overrides must be a mapping of '--flag' to a value "
            "(true for a bare flag, null or false to remove one)."
        )
    if not isinstance(environment or {}, Mapping):
        raise PlanError("inference_server_environment must be a mapping of variable names to values.")
    settings = check_settings(engine, settings or {})
    if weights_bytes is not None:
        try:
            weights_bytes = int(weights_bytes)
        except (TypeError, ValueError):
            raise PlanError(
                f"model_sync_weights_bytes is {weights_bytes!r}, not a number of bytes: check what model_sync recorded."
            ) from None
    facts = model_facts(model_config)
    table = load_flag_table(engine, str(engine_version), table_dir)
    table.renamed = engine_version_facts(engine, str(engine_version)).renamed_flags
    if weights_bytes is not None and draft_path and draft_weights_bytes:  # the drafter shares the GPUs
        weights_bytes += int(draft_weights_bytes)
    given = PlanInput(
        engine_version=str(engine_version),
        venv_dir=venv_dir,
        model_path=model_path,
        host=host,
        port=port_number,
        settings=settings,
        overrides=dict(overrides or {}),
        environment=dict(environment or {}),
        cache_dir=cache_dir,
        table=table,
        api_key_file=api_key_file or None,
        allow_unenforced_api_key=bool(allow_unenforced_api_key),
        logging_config_file=logging_config_file or None,
        drafter={"model_config": model_config, "draft_config": draft_config, "draft_path": draft_path or None},
        gpus=gpus,
        weights_bytes=weights_bytes,
        model_config=model_config,
    )
    plan = (plan_sglang if engine == "sglang" else plan_transformers)(facts, given)
    plan["notes"] = [facts.summary()] + plan["notes"] + ([table.note] if table.note else [])
    if cache_dir:
        plan["notes"].append(f"JIT and compile caches under {cache_dir.rstrip('/')}")
    origins = {
        "the model's config.json": model_config,
        "the drafter's config.json": draft_config or {},
        **{setting_variable(key): value for key, value in settings.items()},
        "inference_server_overrides": overrides or {},
        "inference_server_environment": environment or {},
    }
    _refuse_control_characters(plan, origins)
    return plan


def _strings(value: Any, path: str) -> list[tuple[str, str]]:
    """Every string in ``value`` (keys and values, nested), with where it sits."""
    if isinstance(value, str):
        return [(path, value)]
    found: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            found += _strings(str(key), f"{path} (a key)") + _strings(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found += _strings(item, f"{path}[{index}]")
    return found


def _refuse_control_characters(plan: Mapping[str, Any], origins: Mapping[str, Any]) -> None:
    """Refuse a plan whose argv, environment or notes hold a control character, naming the
    input it came from (the model's config.json is not trusted: it may come from a hub)."""
    rendered = [(f"argument {i} of the launch", str(word)) for i, word in enumerate(plan["argv"])]
    rendered += [(f"the environment variable {name}", str(value)) for name, value in plan["env"].items()]
    rendered += [("a note of the plan", str(note)) for note in plan["notes"]]
    for where, text in rendered:
        bad = CONTROL_CHARACTERS.search(text)
        if not bad:
            continue
        source = next(
            (
                path
                for name, value in origins.items()
                for path, found in _strings(value, name)
                if CONTROL_CHARACTERS.search(found) and (found in text or text in found)
            ),
            "the launch plan",
        )
        raise PlanError(
            f"{where} holds the control character {bad.group()!r} ({text[:160]!r}), which would break the "
            f"unit's lines: it comes from {source}; remove it there before anything is written."
        )
