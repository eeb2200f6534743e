"""Training and checking the tiny models of make_tiny_model.py (``--train``, ``--mtp-steps``, ``--check``).

The rehearsal model (``Qwen3_5ForCausalLM``) and the GPU acceptance model
(``Qwen3_5ForConditionalGeneration``, text only) learn the chat questions of a JSON lines file
(``{"messages", "answer"}``), greedy, the loss on the answer's tokens only; the acceptance model's
MTP layer is then trained on the frozen model as SGLang's NEXTN draft worker runs it. Seeded
throughout. Needs torch and transformers (imported where used).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .make_tiny_model import SEED, load_state, save_shards


def read_items(path: Path) -> list[dict[str, Any]]:
    """Chat questions with their answers, one JSON object a line (``{"messages", "answer", ...}``)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` through the model's chat template, ready for the answer."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _encode_items(tokenizer: Any, items: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """Each item as (prompt + answer + ``<|im_end|>`` ids, labels: -100 over the prompt, the answer's ids)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encoded = []
    for item in items:
        prompt = _chat_prompt(tokenizer, item["messages"])
        answer = tokenizer(str(item["answer"]), add_special_tokens=False)["input_ids"] + [end]
        encoded.append((prompt + answer, [-100] * len(prompt) + answer))
    return encoded


def _batches(encoded: list[tuple[list[int], list[int]]], batch: int, pad: int, device: str) -> Any:
    """Seeded batches of ``encoded`` for ever: (input_ids, attention_mask, labels), right-padded."""
    import random

    import torch

    rng = random.Random(SEED)
    while True:
        rows = [encoded[rng.randrange(len(encoded))] for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], device=device)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], device=device)
        yield input_ids, mask, labels


def _optimise(params: Any, steps: int, lr: float, loss_of: Any, what: str, seconds: float | None = None) -> int:
    """AdamW in float32 over ``params`` for ``steps`` steps of ``loss_of(step)``: ``lr`` after a 30-step
    warm-up, decaying linearly to 5 %. With ``seconds``, the pace of the first 20 steps sets fewer steps
    when all of them would take longer (a GPU session's time is counted). Prints the loss every 100
    steps; returns the steps taken."""
    import torch

    total = [steps]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 30) * max(0.05, 1 - step / total[0])
    )
    started = time.monotonic()
    step = 0
    while step < total[0]:
        loss = loss_of(step)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
        took = time.monotonic() - started
        if seconds and step == 20 and took * total[0] / 20 > seconds:
            total[0] = max(40, int(seconds * 20 / took))
            print(f"{what}: {took / 20:.3f} s a step, {total[0]} steps fit in {seconds:.0f} s", flush=True)
        if step % 100 == 0 or step == total[0]:
            print(f"{what} step {step}/{total[0]}: loss {loss.item():.4f} ({took:.0f} s)", flush=True)
    return total[0]


def _device(asked: str) -> str:
    """``asked``, or with ``auto`` the first CUDA GPU when torch sees one, else the CPU."""
    import torch

    if asked != "auto":
        return asked
    return "cuda" if torch.cuda.is_available() else "cpu"


def train_model(
    out: Path,
    items: list[dict[str, Any]],
    steps: int,
    batch: int = 32,
    lr: float = 3e-3,
    device: str = "auto",
    mtp_steps: int = 0,
    seconds: float | None = None,
) -> dict[str, Any]:
    """Teach the model in ``out`` to answer ``items`` (greedy, then ``<|im_end|>``); saved in place, bf16.

    Seeded batches drawn from ``items``, the loss on the answer's tokens only (:func:`_optimise`). The
    rehearsal model (``Qwen3_5ForCausalLM``) and the acceptance model (``Qwen3_5ForConditionalGeneration``,
    text only) alike; with ``mtp_steps`` the acceptance model's ``mtp.*`` layer is then trained on the
    frozen model (:func:`train_mtp`), so that NEXTN's drafts mean something. ``seconds`` bounds each of
    the two trainings (:func:`_optimise`). Returns the final losses and the steps taken.
    """
    import torch
    from transformers import AutoTokenizer

    device = _device(device)
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    model = _load_model(out, device)
    model.train()
    encoded = _encode_items(tokenizer, items)
    batches = _batches(encoded, batch, tokenizer.pad_token_id, device)
    losses: dict[str, Any] = {}

    def answer_loss(_step: int) -> Any:
        input_ids, mask, labels = next(batches)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False).loss
        losses["answer"] = round(loss.item(), 4)
        return loss

    losses["steps"] = _optimise(model.parameters(), steps, lr, answer_loss, "model", seconds)
    state = {name: value.detach().to(torch.bfloat16).contiguous().cpu() for name, value in model.state_dict().items()}
    files = sorted(out.glob("model*.safetensors"))
    old = load_state(out)
    if set(state) != {name for name in old if not name.startswith("mtp.")}:
        raise SystemExit("this transformers names the model's tensors otherwise than its files: nothing saved")
    state.update({name: value for name, value in old.items() if name.startswith("mtp.")})
    if mtp_steps:
        model.eval()
        mtp_losses, mtp_state = train_mtp(
            model, config["text_config"], encoded, mtp_steps, batch, lr, tokenizer.pad_token_id, device, seconds
        )
        if set(mtp_state) != {name for name in old if name.startswith("mtp.")}:
            raise SystemExit(f"the trained MTP layer's tensors are not the checkpoint's: {sorted(mtp_state)}")
        losses.update(mtp_losses)
        state.update(mtp_state)
    for path in files + list(out.glob("model.safetensors.index.json")):
        path.unlink()
    save_shards(state, out, len(files))  # the same files as before: tests name its last shard
    return losses


def train_mtp(
    model: Any,
    text: dict[str, Any],
    encoded: list[tuple[list[int], list[int]]],
    steps: int,
    batch: int,
    lr: float,
    pad: int,
    device: str,
    seconds: float | None = None,
    depth: int = 3,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train the acceptance model's MTP layer as SGLang's NEXTN draft worker runs it, on the frozen model.

    ``sglang/srt/models/qwen3_5_mtp.py``: at position t the layer takes the target's final-norm hidden
    state h_t (Qwen3_5's ``self.norm`` output, what the logits processor keeps for the draft) and the
    embedding of token t+1, ``fc([pre_fc_norm_embedding(embed); pre_fc_norm_hidden(h)])``, one
    full-attention decoder layer, ``norm``, and the target's ``lm_head``: it predicts token t+2. Each
    further draft step (``--speculative-num-steps``) feeds the layer's own output back as the hidden
    state, one position on: ``depth`` steps are trained, the k-th weighted 1/2^(k-1). The loss is over
    every real token (prompt and answer). Returns the last losses and the ``mtp.*`` tensors (bf16, on the
    CPU) under the real checkpoint's names.
    """
    import torch
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5TextModel

    torch.manual_seed(SEED + 3)
    layer_config = dict(text, num_hidden_layers=1, layer_types=["full_attention"])
    body = Qwen3_5TextModel(Qwen3_5TextConfig(**layer_config)).to(device)
    hidden = int(text["hidden_size"])
    eps = float(text["rms_norm_eps"])
    heads = torch.nn.ModuleDict(
        {
            "fc": torch.nn.Linear(2 * hidden, hidden, bias=False),
            "pre_fc_norm_embedding": Qwen3_5RMSNorm(hidden, eps=eps),
            "pre_fc_norm_hidden": Qwen3_5RMSNorm(hidden, eps=eps),
        }
    ).to(device)
    language = model.model.language_model
    for param in model.parameters():
        param.requires_grad_(False)
    batches = _batches(encoded, batch, pad, device)
    losses: dict[str, Any] = {}

    def draft_loss(_step: int) -> Any:
        input_ids, mask, _labels = next(batches)
        with torch.no_grad():
            states = language(input_ids=input_ids, attention_mask=mask).last_hidden_state
            embeds = language.embed_tokens(input_ids)
        total = torch.zeros((), device=device)
        length = input_ids.shape[1]
        for k in range(1, depth + 1):
            # step k at index t: hidden of the step before (target's h_t for k = 1), token t + k -> t + k + 1
            width = length - k - 1
            if width <= 0:
                break
            x = heads["fc"](
                torch.cat(
                    [
                        heads["pre_fc_norm_embedding"](embeds[:, k : k + width]),
                        heads["pre_fc_norm_hidden"](states[:, :width]),
                    ],
                    dim=-1,
                )
            )
            positions = torch.arange(k - 1, k - 1 + width, device=device).expand(input_ids.shape[0], -1)
            out = body(inputs_embeds=x, attention_mask=mask[:, k : k + width], position_ids=positions, use_cache=False)
            states = out.last_hidden_state
            logits = model.lm_head(states)
            target = input_ids[:, k + 1 : k + 1 + width].masked_fill(mask[:, k + 1 : k + 1 + width] == 0, -100)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
            losses[f"draft_{k}"] = round(loss.item(), 4)
            total = total + loss / 2 ** (k - 1)
        return total

    losses["mtp_steps"] = _optimise([*body.parameters(), *heads.parameters()], steps, lr, draft_loss, "mtp", seconds)
    trained = {f"mtp.{name}": value for name, value in heads.state_dict().items()}
    trained.update(
        {f"mtp.{name}": value for name, value in body.state_dict().items() if name.startswith(("layers.0.", "norm."))}
    )
    return losses, {name: value.detach().to(torch.bfloat16).contiguous().cpu() for name, value in trained.items()}


def _load_model(model_dir: Path, device: str) -> Any:
    """The model of ``model_dir`` in float32 on ``device``: the acceptance model (a nested config) as
    ``Qwen3_5ForConditionalGeneration``, the rehearsal model as a causal LM."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    multimodal = "text_config" in json.loads((model_dir / "config.json").read_text())
    loader = Qwen3_5ForConditionalGeneration if multimodal else AutoModelForCausalLM
    return loader.from_pretrained(model_dir, dtype=torch.float32).to(device)


def check_model(model_dir: Path, items: list[dict[str, Any]], device: str = "auto") -> float:
    """The share of ``items`` the model in ``model_dir`` answers exactly (greedy, as the gate asks)."""
    import torch
    from transformers import AutoTokenizer

    device = _device(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = _load_model(model_dir, device)
    model.eval()
    right = 0
    with torch.no_grad():
        for item in items:
            ids = torch.tensor([_chat_prompt(tokenizer, item["messages"])], device=device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
            reply = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
            right += reply == str(item["answer"])
    return right / len(items)
