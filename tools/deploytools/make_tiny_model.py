"""Generate a tiny random-weight model of Qwen3.6-27B's architecture family, offline.

The rehearsal model mirrors Qwen3.6-27B's shape in miniature: ``qwen3_5`` with
Gated-DeltaNet (linear-attention) and full-attention layers in the same 3:1 pattern,
``mtp_num_hidden_layers: 1``, and a small byte-level BPE tokenizer with Qwen's special
tokens and a ChatML chat template. Everything is seeded, so two runs give the same files.

    tools/make-tiny-model --out DIR [--shards N]

``--vision --with-mtp`` builds the GPU acceptance model instead: Qwen3.6-27B's own nested
config (``files/models/qwen3.6-27b.config.json``, architecture
``Qwen3_5ForConditionalGeneration``) shrunk so that SGLang serves it with tensor
parallelism 2 (4 query / 2 KV heads of head_dim 256, 4 key / 8 value linear heads,
mamba_ssm_dtype float32, mrope, a 1-layer vision tower with no deepstack layers), the
processor configs, and with ``--with-mtp`` hand-made ``mtp.*`` tensors named as in the real
checkpoint (``mtp.fc.weight``, ``mtp.pre_fc_norm_*``, ``mtp.norm``, ``mtp.layers.0.*``), so
SGLang's NEXTN draft worker loads a real MTP layer. Shards get a
``model.safetensors.index.json`` like the real checkpoint.

    tools/make-tiny-model --out DIR --vision --with-mtp [--shards N]

``--layers N`` (a multiple of 4, default 4) deepens the rehearsal model in the same 3:1
pattern: the same tokenizer and shapes, N/4 times the decode work per token (the "slower
model" of the relative gate's molecule case). ``--dflash-drafter`` writes a tiny random
DFlash drafter for the rehearsal model instead: ``DFlashDraftModel`` with the fields of a
real one (``dflash_config``: block size, target layer ids, mask token id; the config of
``files/models/dflash-drafter-27b.config.json`` shrunk to the tiny model's hidden size 128)
and the tensor names SGLang's ``sglang/srt/models/dflash.py`` loads; the CPU engine does
not draft, so it is a second synced artifact to rehearse with.

    tools/make-tiny-model --out DIR --layers 16
    tools/make-tiny-model --out DIR --dflash-drafter

The rehearsal model the tests serve is **trained** (tiny_model_training.py), so that the gate's
correctness probe means something on the CPU (docs/health-gate.md, "Correctness"): ``--train ITEMS`` teaches the seeded
random model the chat questions of ITEMS (JSON lines of ``{"messages", "answer"}``, which
``tools/probe-set training-items`` writes from the rehearsal probe set's eval families), and
``make tiny-model-train`` commits the result as ``files/models/tiny-qwen3.5`` (a few minutes on
two cores, so ``make model`` copies it instead of training on every fresh machine).
``--check ITEMS`` prints the greedy accuracy on ITEMS. From a model directory (``--from DIR``):
``--layers N`` pads it to N layers whose outputs are zero (the same answers, N/4 times the work:
the slower model of the relative gate and the bake-off), ``--perturb SCALE`` adds seeded noise of
SCALE times each weight matrix's spread (same shapes and files, wrong answers: a bad model revision).

    tools/make-tiny-model --out DIR --train ITEMS [--steps N] [--check EVAL]
    tools/make-tiny-model --out DIR --from SRC --layers 32
    tools/make-tiny-model --out DIR --from SRC --perturb 0.5

Needs torch, transformers and tokenizers (the CPU profile's lock; ``make tools-venv``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]
VOCAB_SIZE = 1024
SEED = 20261129
REAL_CONFIG = Path(__file__).resolve().parents[2] / "files" / "models" / "qwen3.6-27b.config.json"
# transformers version recorded in the acceptance config (the SGLang lock's pin), fixed so
# the output does not depend on the generating venv.
CONFIG_TRANSFORMERS_VERSION = "5.6.0"

# The acceptance model: Qwen3.6-27B's config with these sizes (see recipe in docs/gpu.md).
# Heads divide by tensor parallelism 2; head dims stay the real ones (256 / 128).
ACCEPTANCE_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
}
ACCEPTANCE_VISION = {
    "depth": 1,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 2,
    "deepstack_visual_indexes": [],
}
IMAGE_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "merge_size": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "processor_class": "Qwen3VLProcessor",
}
VIDEO_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": True,
    "fps": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768,
    "min_frames": 4,
    "merge_size": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "video_processor_type": "Qwen3VLVideoProcessor",
    "processor_class": "Qwen3VLProcessor",
}
# MTP norms that the real checkpoint has besides mtp.fc and a copy of one decoder layer.
MTP_NORMS = ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]

# A ChatML template like Qwen's, text parts only (images become a vision placeholder).
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for c in message['content'] %}{%- if c['type'] == 'text' %}{{- c['text'] }}"
    "{%- elif c['type'] in ['image', 'image_url'] %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Training text for the tokenizer: code and prose like the gate's prompts.
CORPUS = [
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import json\nfrom pathlib import Path\n\nclass Config:\n"
    "    def __init__(self, path):\n        self.data = json.loads(Path(path).read_text())\n",
    "Write a Python function that parses a log file and returns the ten most frequent errors.",
    "Explain the difference between a process and a thread, with an example in Go.",
    "SELECT name, count(*) FROM requests GROUP BY name ORDER BY 2 DESC LIMIT 10;",
    "The quick brown fox jumps over the lazy dog. Hello, world! 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    'fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }',
]


def train_tokenizer(out: Path) -> dict[str, int]:
    """Train a byte-level BPE tokenizer, write tokenizer files, return special token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - 8,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    if max(ids.values()) >= VOCAB_SIZE:
        raise SystemExit(f"tokenizer grew past the vocabulary: {ids}")
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(ids[s]): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIAL_TOKENS
    }
    write_json(
        out / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "errors": "replace",
            "model_max_length": 4096,
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(out / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    return ids


def text_config(ids: dict[str, int], layers: int = 4) -> dict[str, Any]:
    """The text model's config: Qwen3.6-27B's layout (3 linear : 1 full), shrunk."""
    return {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "attn_output_gate": True,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 4096,
        "mtp_num_hidden_layers": 1,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
    }


def build_text_model(out: Path, ids: dict[str, int], shards: int, layers: int = 4) -> None:
    """Initialise ``Qwen3_5ForCausalLM`` with a fixed seed and save it in ``shards`` files."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**text_config(ids, layers))
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    shard_bytes = max(1, total // shards + 1)
    model.save_pretrained(out, max_shard_size=shard_bytes)
    write_generation_config(out, ids)


def drafter_config(ids: dict[str, int]) -> dict[str, Any]:
    """A DFlash drafter's config.json for the rehearsal model (the real one's fields, shrunk)."""
    target = text_config(ids)
    layer_ids = [0, 1, target["num_hidden_layers"] - 2]  # SGLang captures id + 1: at most L - 2
    block = 16
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target["hidden_size"],
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000,
        "max_position_embeddings": target["max_position_embeddings"],
        "attention_bias": False,
        "vocab_size": VOCAB_SIZE,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "block_size": block,
        "num_target_layers": target["num_hidden_layers"],
        "dflash_config": {
            "block_size": block,
            "target_layer_ids": layer_ids,
            "mask_token_id": ids["<|endoftext|>"],
            "num_target_layers": target["num_hidden_layers"],
        },
    }


def build_dflash_drafter(out: Path, ids: dict[str, int]) -> None:
    """Seeded random weights under the names sglang/srt/models/dflash.py loads, and the config."""
    import torch
    from safetensors.torch import save_file

    cfg = drafter_config(ids)
    hidden, heads, kv, dim, inter = (
        cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    )
    torch.manual_seed(SEED)

    def rand(*shape: int) -> Any:
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    tensors: dict[str, Any] = {
        "fc.weight": rand(hidden, hidden * len(cfg["dflash_config"]["target_layer_ids"])),
        "hidden_norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                p + "self_attn.q_proj.weight": rand(heads * dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv * dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv * dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * dim),
                p + "self_attn.q_norm.weight": torch.ones(dim, dtype=torch.bfloat16),
                p + "self_attn.k_norm.weight": torch.ones(dim, dtype=torch.bfloat16),
                p + "mlp.gate_proj.weight": rand(inter, hidden),
                p + "mlp.up_proj.weight": rand(inter, hidden),
                p + "mlp.down_proj.weight": rand(hidden, inter),
            }
        )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", cfg)


def write_generation_config(out: Path, ids: dict[str, int]) -> None:
    """generation_config.json: stop at ``<|im_end|>`` or ``<|endoftext|>``, greedy by default."""
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": None,
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "do_sample": False,
        },
    )


def acceptance_config(ids: dict[str, int], real: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.6-27B's nested config with the acceptance sizes and the tiny tokenizer's ids.

    Every other key (rope/mrope, attention output gate, mamba_ssm_dtype, MTP layers, ...)
    is the real model's. The layer pattern is the first ``num_hidden_layers`` of the real one.
    """
    cfg = json.loads(json.dumps(real))
    text, vision = cfg["text_config"], cfg["vision_config"]
    text.update(ACCEPTANCE_TEXT)
    text["layer_types"] = real["text_config"]["layer_types"][: text["num_hidden_layers"]]
    if "full_attention" not in text["layer_types"]:
        raise SystemExit("the shrunk layer pattern has no full-attention layer")
    text["bos_token_id"] = text["eos_token_id"] = ids["<|endoftext|>"]
    vision.update(ACCEPTANCE_VISION)
    vision["out_hidden_size"] = text["hidden_size"]
    cfg.update(
        {
            "image_token_id": ids["<|image_pad|>"],
            "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"],
            "vision_end_token_id": ids["<|vision_end|>"],
            "transformers_version": CONFIG_TRANSFORMERS_VERSION,
        }
    )
    return cfg


def mtp_tensors(state: dict[str, Any], text: dict[str, Any], seed: int) -> dict[str, Any]:
    """Hand-made ``mtp.*`` tensors with the real checkpoint's names and shapes.

    ``mtp.layers.0`` copies the shapes of the last full-attention decoder layer (random
    matrices, the layer's own norm weights); ``mtp.fc`` maps [embedding; hidden] (2H) to H;
    the MTP norms are zero (Qwen3.5's RMSNorm scales by 1 + weight).
    """
    import torch

    full = max(i for i, t in enumerate(text["layer_types"]) if t == "full_attention")
    prefix = f"model.language_model.layers.{full}."
    gen = torch.Generator().manual_seed(seed)
    hidden = text["hidden_size"]
    mtp: dict[str, Any] = {}
    for name in sorted(state):
        if name.startswith(prefix):
            value = state[name]
            key = "mtp.layers.0." + name[len(prefix) :]
            if value.dim() >= 2:
                mtp[key] = (torch.randn(value.shape, generator=gen) * 0.02).to(torch.bfloat16)
            else:
                mtp[key] = value.clone()
    mtp["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.02).to(torch.bfloat16)
    for norm in MTP_NORMS:
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
    return mtp


def save_shards(state: dict[str, Any], out: Path, shards: int) -> list[str]:
    """Save a state dict as ``model.safetensors`` or N shards plus the index, in name order."""
    from safetensors.torch import save_file

    names = sorted(state)
    if shards <= 1:
        save_file({n: state[n] for n in names}, str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    total = sum(state[n].numel() * state[n].element_size() for n in names)
    budget = total / shards
    groups: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = state[n].numel() * state[n].element_size()
        if groups[-1] and size + nbytes > budget and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += nbytes
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map = {}
    for fname, group in zip(files, groups, strict=True):
        save_file({n: state[n] for n in group}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def build_acceptance_model(
    out: Path, ids: dict[str, int], shards: int, with_mtp: bool, real_config: Path = REAL_CONFIG
) -> None:
    """Initialise ``Qwen3_5ForConditionalGeneration`` from the acceptance config (seeded),
    add the MTP tensors if asked, and write weights, config and processor configs."""
    import torch
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    cfg = acceptance_config(ids, json.loads(real_config.read_text()))
    write_json(out / "config.json", cfg)
    torch.manual_seed(SEED)
    model = Qwen3_5ForConditionalGeneration(AutoConfig.from_pretrained(out)).to(torch.float32)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    if with_mtp:
        state.update(mtp_tensors(state, cfg["text_config"], SEED + 1))
    bad = [k for k, v in state.items() if not torch.isfinite(v.float()).all()]
    if bad:
        raise SystemExit(f"non-finite values in {', '.join(bad)}")
    save_shards(state, out, shards)
    write_generation_config(out, ids)
    write_json(out / "preprocessor_config.json", IMAGE_PROCESSOR)
    write_json(out / "video_preprocessor_config.json", VIDEO_PROCESSOR)


def _copy_model_files(src: Path, out: Path) -> None:
    """Everything of ``src`` but its weights and their index into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and not path.name.startswith("model") and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)


def load_state(src: Path) -> dict[str, Any]:
    """All tensors of ``src``'s safetensors files."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state


def deepen_model(src: Path, out: Path, layers: int) -> None:
    """``src`` padded to ``layers`` layers in its 3:1 pattern; every new layer's output projections
    (attention, linear attention, MLP) are zero, so it adds nothing to the residual stream: the same
    answers as ``src``, ``layers / 4`` times its decode work."""
    import torch

    _copy_model_files(src, out)
    config = json.loads((src / "config.json").read_text())
    base = int(config["num_hidden_layers"])
    state = load_state(src)
    for layer in range(base, layers):
        twin = layer % base
        for name in [n for n in state if n.startswith(f"model.layers.{twin}.")]:
            value = state[name].clone()
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                value = torch.zeros_like(value)
            state[name.replace(f"model.layers.{twin}.", f"model.layers.{layer}.", 1)] = value
    config.update(num_hidden_layers=layers, layer_types=(config["layer_types"][:4]) * (layers // 4))
    write_json(out / "config.json", config)
    save_shards(state, out, len(list(src.glob("*.safetensors"))))


def perturb_model(src: Path, out: Path, scale: float) -> None:
    """``src`` with seeded Gaussian noise of ``scale`` times each matrix's standard deviation added to
    every weight matrix: the same shapes, names and files, other answers."""
    import torch

    _copy_model_files(src, out)
    state = load_state(src)
    gen = torch.Generator().manual_seed(SEED + 7)
    for name in sorted(state):
        value = state[name]
        if value.dim() >= 2:
            noise = torch.randn(value.shape, generator=gen) * value.float().std() * scale
            state[name] = (value.float() + noise).to(value.dtype)
    save_shards(state, out, len(list(src.glob("*.safetensors"))))


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as stable, indented JSON."""
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and generate the model directory."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="directory to create")
    ap.add_argument("--shards", type=int, default=3, help="about how many safetensors shards to write (default 3)")
    ap.add_argument(
        "--vision",
        action="store_true",
        help="build the GPU acceptance model: Qwen3_5ForConditionalGeneration from "
        "Qwen3.6-27B's config, shrunk, with a 1-layer vision tower and processor configs",
    )
    ap.add_argument(
        "--with-mtp", action="store_true", help="add hand-made mtp.* tensors (real checkpoint names); needs --vision"
    )
    ap.add_argument(
        "--layers",
        type=int,
        default=4,
        help="layers of the rehearsal model, a multiple of 4 (3 linear : 1 full; default 4)",
    )
    ap.add_argument(
        "--dflash-drafter",
        action="store_true",
        help="write a tiny random DFlash drafter for the rehearsal model instead",
    )
    ap.add_argument("--train", type=Path, help="teach the model the chat questions of this JSON lines file")
    ap.add_argument("--steps", type=int, default=1500, help="training steps with --train (default 1500)")
    ap.add_argument("--batch", type=int, default=32, help="questions per training step (default 32)")
    ap.add_argument(
        "--mtp-steps",
        type=int,
        default=0,
        help="with --train and --with-mtp: then train the MTP layer this many steps on the trained model",
    )
    ap.add_argument("--device", default="auto", help="torch device for --train (default auto: cuda when present)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of --train (default 0.003)")
    ap.add_argument(
        "--train-seconds",
        type=float,
        help="with --train: fewer steps when the pace of the first 20 says they would take longer than this",
    )
    ap.add_argument("--check", type=Path, help="print the greedy accuracy on the questions of this JSON lines file")
    ap.add_argument("--from", dest="source", type=Path, help="start from this model directory (--layers, --perturb)")
    ap.add_argument("--perturb", type=float, help="with --from: add seeded noise of this many standard deviations")
    args = ap.parse_args(argv)
    from .tiny_model_training import check_model, read_items, train_model  # torch only where asked

    if args.source:
        if (args.perturb is None) == (args.layers == 4):
            ap.error("--from needs exactly one of --layers N (N > 4) and --perturb SCALE")
        if args.perturb is not None:
            perturb_model(args.source, args.out, args.perturb)
        else:
            deepen_model(args.source, args.out, args.layers)
        print(f"{args.out}: {args.source} {'perturbed' if args.perturb is not None else f'in {args.layers} layers'}")
        if args.check:
            print(f"greedy accuracy on {args.check}: {check_model(args.out, read_items(args.check)):.3f}")
        return 0
    if args.layers < 4 or args.layers % 4:
        ap.error("--layers must be a multiple of 4 (the 3 linear : 1 full pattern)")
    if args.dflash_drafter and (args.vision or args.layers != 4):
        ap.error("--dflash-drafter writes a drafter for the 4-layer rehearsal model: drop --vision and --layers")
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    if args.with_mtp and not args.vision:
        ap.error("--with-mtp needs --vision: the MTP tensors follow the Qwen3_5ForConditionalGeneration layout")
    if args.mtp_steps and not (args.train and args.with_mtp):
        ap.error("--mtp-steps needs --train and --with-mtp: it trains the MTP layer of the trained model")
    args.out.mkdir(parents=True, exist_ok=True)
    ids = train_tokenizer(args.out)
    if args.dflash_drafter:
        build_dflash_drafter(args.out, ids)
    elif args.vision:
        build_acceptance_model(args.out, ids, args.shards, args.with_mtp)
    else:
        build_text_model(args.out, ids, args.shards, args.layers)
    if args.train:
        started = time.monotonic()
        losses = train_model(
            args.out,
            read_items(args.train),
            args.steps,
            args.batch,
            args.lr,
            device=args.device,
            mtp_steps=args.mtp_steps,
            seconds=args.train_seconds,
        )
        print(f"trained in {time.monotonic() - started:.0f} s, last losses {json.dumps(losses, sort_keys=True)}")
    if args.check:
        print(f"greedy accuracy on {args.check}: {check_model(args.out, read_items(args.check)):.3f}")
    files = sorted(p.name for p in args.out.iterdir())
    print(f"tiny qwen3_5 model in {args.out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
