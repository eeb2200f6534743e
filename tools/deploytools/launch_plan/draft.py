"""Launch plan, drafter part: the separate draft model of DFLASH, EAGLE, EAGLE3 and STANDALONE.

The plan (``common.py``, ``sglang.py``) calls
:func:`apply_draft` on the final flag set, after the overrides and before the mamba and
speculative rules. It

* pins ``--speculative-draft-model-path`` to the drafter's resolved revision directory
  (``model_sync_draft_model_dir``, as ``--model-path`` is pinned to the target's), and
  refuses an algorithm that needs a drafter when none is synced;
* for DFLASH, checks the drafter's ``config.json`` against the target's and the flags,
  with SGLang 0.5.11's own rules (``sglang/srt/server_args.py`` ``_handle_speculative_decoding``,
  ``sglang/srt/speculative/dflash_utils.py`` ``parse_dflash_draft_config`` and
  ``sglang/srt/speculative/dflash_worker.py``), each refusal one sentence naming the
  variable to change.

The mamba rules of the target (extra_buffer with the radix cache, or no_buffer with
``--disable-radix-cache`` on a hybrid model) stay in ``launch_plan.py`` and run after this,
on the draft tokens set here. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Algorithms whose drafter is a separate model (--speculative-draft-model-path). NEXTN
# drafts with the target's own MTP head; NGRAM drafts from the context.
DRAFT_ALGORITHMS = ("DFLASH", "EAGLE", "EAGLE3", "STANDALONE")
DFLASH_ARCHITECTURE = "DFlashDraftModel"
# sglang/srt/server_args.py: no block size in the drafter's config and no draft tokens -> 16.
DFLASH_DEFAULT_BLOCK = 16
DRAFT_FLAG = "--speculative-draft-model-path"
DRAFT_SOURCE = "model_sync_draft_model_dir"
DRAFT_VARIABLE = "model_sync_draft_source"
# What the plan pins: an override of it would bypass the synced drafter.
PINNED_DRAFT = {DRAFT_FLAG: "model_sync_draft_model_dir (the synced drafter, model_sync_draft_source)"}


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text part of a config.json (``text_config`` when nested)."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _int(value: Any) -> int | None:
    """An integer from a config value, None when it is not one."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def dflash_config(draft: Mapping[str, Any]) -> dict[str, Any]:
    """The DFlash fields of a drafter's config.json, ``dflash_config`` first then top level (as SGLang)."""
    nested = draft.get("dflash_config") if isinstance(draft.get("dflash_config"), Mapping) else {}
    text = _text(draft)
    return {
        key: nested.get(key, draft.get(key, text.get(key)))
        for key in ("block_size", "target_layer_ids", "mask_token_id", "num_target_layers")
    }


def _insert_after(flags: Any, anchor: str, flag: str, value: Any, source: str) -> None:
    """Set ``flag`` right after ``anchor`` in the flag order (or replace it where it is)."""
    flags.set(flag, value, source)
    if anchor not in flags.values:
        return
    order = [f for f in flags.values if f != flag]
    order.insert(order.index(anchor) + 1, flag)
    flags.values = {f: flags.values[f] for f in order}


def apply_draft(
    flags: Any,
    model_config: Mapping[str, Any],
    draft_config: Mapping[str, Any] | None,
    draft_path: str | None,
    notes: list[str],
    error: Callable[[str], Exception],
) -> None:
    """Pin the drafter's path for the algorithms that need one, and check a DFLASH plan.

    ``flags`` is launch_plan's FlagSet (final: settings and overrides applied), ``model_config``
    the target's config.json, ``draft_config`` the drafter's ({} when it could not be read, None
    when it is not known yet: a mirror or Hub drafter before the sync),
    ``draft_path`` its resolved revision directory; ``error`` is the PlanError class to raise.
    """
    algo = flags.get("--speculative-algorithm")
    algo_source = flags.source("--speculative-algorithm")
    if algo not in DRAFT_ALGORITHMS:
        if draft_path:
            notes.append(
                f"a drafter is synced ({draft_path}), but speculative decoding {algo or 'off'} does not "
                "use one: it is not passed to the server"
            )
        return
    if not draft_path:
        raise error(
            f"{algo_source} is {algo}, which drafts with a separate model, but no drafter is synced: set "
            f"{DRAFT_VARIABLE} and model_sync_draft_name to the drafter, or choose NEXTN (the model's own "
            "MTP head) or null."
        )
    _insert_after(flags, "--speculative-algorithm", DRAFT_FLAG, draft_path, DRAFT_SOURCE)
    if algo != "DFLASH":
        notes.append(f"speculative decoding {algo} with the drafter {draft_path} ({DRAFT_FLAG})")
        return
    if draft_config is None:  # a mirror or Hub drafter before the sync: plan.yml checks it after
        notes.append("the DFlash drafter's config.json is read after the sync: its rules are checked then")
        return
    _dflash_rules(flags, model_config, draft_config, draft_path, notes, error)


def _dflash_rules(
    flags: Any,
    target: Mapping[str, Any],
    draft: Mapping[str, Any],
    draft_path: str,
    notes: list[str],
    error: Callable[[str], Exception],
) -> None:
    """SGLang 0.5.11's DFLASH rules, in its own order where it has them, then the config checks."""
    algo_source = flags.source("--speculative-algorithm")
    if flags.has("--enable-dp-attention"):
        raise error(
            f"{flags.source('--enable-dp-attention')} enables DP attention, which SGLang 0.5.11 refuses "
            f"with DFLASH speculative decoding: remove it, or set {algo_source} to another algorithm."
        )
    pp_size = flags.number("--pipeline-parallel-size")
    if pp_size is not None and pp_size != 1:
        raise error(
            f"{flags.source('--pipeline-parallel-size')} is {pp_size}, but SGLang 0.5.11 runs DFLASH "
            "speculative decoding only with pipeline size 1: remove it or set it to 1."
        )
    if not draft:
        raise error(
            f"the drafter's config.json ({DRAFT_VARIABLE}) could not be read, so the DFLASH plan cannot "
            "be checked: point model_sync_draft_source at a directory that holds the drafter's config.json."
        )
    archs = draft.get("architectures") or []
    arch = str(archs[0]) if archs else "none"
    if arch != DFLASH_ARCHITECTURE:
        raise error(
            f"{algo_source} is DFLASH, but the drafter of {DRAFT_VARIABLE} has the architecture {arch}, "
            f"not {DFLASH_ARCHITECTURE}: point {DRAFT_VARIABLE} at a DFlash drafter, or choose the "
            "algorithm the drafter was trained for (EAGLE, EAGLE3)."
        )
    target_text, draft_text = _text(target), _text(draft)
    hidden, draft_hidden = _int(target_text.get("hidden_size")), _int(draft_text.get("hidden_size"))
    if hidden is not None and draft_hidden != hidden:
        raise error(
            f"the DFlash drafter of {DRAFT_VARIABLE} has hidden_size {draft_hidden}, but the target's is "
            f"{hidden}: a DFlash drafter reads the target's hidden states, so point {DRAFT_VARIABLE} at "
            "the drafter trained for this target."
        )
    fields = dflash_config(draft)
    _dflash_draft_tokens(flags, fields, notes, error)
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk"):
        value = flags.number(flag)
        if value is not None and value != 1:
            raise error(
                f"{flags.source(flag)} sets {flag} to {value}, but DFLASH drafts a whole block in one "
                f"step with top-k 1 and SGLang 0.5.11 would silently change it to 1: remove it or set "
                "it to 1."
            )
    layers = _int(target_text.get("num_hidden_layers"))
    layer_ids = fields["target_layer_ids"]
    if layer_ids is not None and layers is not None:
        bad = [
            i
            for i in (layer_ids if isinstance(layer_ids, (list, tuple)) else [layer_ids])
            if _int(i) is None or not 0 <= i <= layers - 2
        ]
        if bad or not layer_ids:
            raise error(
                f"the DFlash drafter of {DRAFT_VARIABLE} reads target_layer_ids {list(layer_ids)!r}, but "
                f"the target has {layers} layers and SGLang captures the output of layer id + 1, so every "
                f"id must lie between 0 and {layers - 2}: point {DRAFT_VARIABLE} at the drafter trained "
                "for this target."
            )
    trained_for = _int(fields["num_target_layers"])
    if trained_for is not None and layers is not None and trained_for != layers:
        notes.append(
            f"the DFlash drafter says num_target_layers {trained_for}, the target has {layers} layers: "
            "it was trained for another target, expect a low accept length"
        )
    vocab = _int(target_text.get("vocab_size")) or _int(target.get("vocab_size"))
    mask = fields["mask_token_id"]
    if mask is not None and (_int(mask) is None or mask < 0 or (vocab is not None and mask >= vocab)):
        raise error(
            f"the DFlash drafter of {DRAFT_VARIABLE} has mask_token_id {mask!r}, but it must be a token "
            f"of the target's vocabulary (0 to {vocab - 1 if vocab else '?'}), or SGLang 0.5.11 stops when "
            f"the drafter loads: point {DRAFT_VARIABLE} at the drafter trained for this target."
        )
    tp = flags.number("--tensor-parallel-size") or 1
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = _int(draft_text.get(key))
        if heads and heads % tp and not (key == "num_key_value_heads" and tp % heads == 0):
            raise error(
                f"{flags.source('--tensor-parallel-size')} is {tp}, which does not divide the DFlash "
                f"drafter's {heads} {key.replace('num_', '').replace('_', ' ')} ({key}): set the "
                "tensor-parallel size to one that divides both the target's and the drafter's heads."
            )
    notes.append(
        f"DFLASH with the drafter {draft_path}: block size {flags.get('--speculative-num-draft-tokens')}"
        f" (--speculative-num-draft-tokens), target layers {list(layer_ids) if layer_ids else 'SGLang'}"
        f"{'' if mask is None else f', mask token {mask}'}; SGLang 0.5.11 turns the overlap scheduler "
        "and mixed chunked prefill off itself, and sets --max-running-requests to 48 unless it is set"
    )


def _dflash_draft_tokens(
    flags: Any, fields: Mapping[str, Any], notes: list[str], error: Callable[[str], Exception]
) -> None:
    """The drafter's block size is the number of draft tokens; another value is refused."""
    block = fields["block_size"]
    if block is not None and (_int(block) is None or block < 1):
        raise error(
            f"the DFlash drafter of {DRAFT_VARIABLE} has block_size {block!r}, which is not a positive "
            "integer: point model_sync_draft_source at a complete DFlash drafter."
        )
    for flag in ("--speculative-num-draft-tokens", "--speculative-dflash-block-size"):
        value = flags.number(flag)
        if value is not None and block is not None and value != block:
            raise error(
                f"{flags.source(flag)} sets {flag} to {value}, but the DFlash drafter verifies blocks of "
                f"{block} tokens (block_size in its config.json): remove it or set it to {block}."
            )
    if block is None:
        block = flags.number("--speculative-num-draft-tokens") or flags.number("--speculative-dflash-block-size")
        if block is None:
            block = DFLASH_DEFAULT_BLOCK
            notes.append(f"the DFlash drafter's config.json has no block_size: {block} draft tokens, SGLang's default")
    if not flags.has("--speculative-num-draft-tokens"):
        _insert_after(
            flags, DRAFT_FLAG, "--speculative-num-draft-tokens", block, "the plan (block_size of the DFlash drafter)"
        )
