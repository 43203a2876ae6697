"""Writes a tiny model folder (config and tokenizer, no weights) for vLLM's dummy loader.

Usage: make_tiny_model.py FOLDER [--moe]. The default is a dense Llama; ``--moe`` writes a tiny
Mixtral (4 experts, top-2), the kind of model whose data-parallel ranks vLLM steps together.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 16_384
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,  # 16 crashes vLLM's CPU attention backend at the first request
    "intermediate_size": 256,
    "vocab_size": VOCAB,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MOE_CONFIG = {
    **CONFIG,
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 16384,
    "router_aux_loss_coef": 0.0,
    "output_router_logits": False,
    "sliding_window": None,
}
SPECIALS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def corpus() -> list[str]:
    """Text to train the tokenizer on: English-like words and digits, enough for the vocabulary."""
    words = [f"{a}{b}{c}" for a in "bcdfghjklmnprstvwz" for b in "aeiou" for c in "nrstlm"]
    lines = [" ".join(words[i : i + 40]) for i in range(0, len(words), 40)]
    lines += [" ".join(str(n) for n in range(k, k + 50)) for k in range(0, 5000, 50)]
    lines += ["hello world the quick brown fox jumps over the lazy dog " * 4]
    return lines


def build_tokenizer(path: Path) -> None:
    """Train a byte-level BPE tokenizer of exactly VOCAB entries and save it as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    # pad the vocabulary to VOCAB so every id the random weights may sample decodes
    missing = VOCAB - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<extra_{i}>" for i in range(missing)])
    tok.save(str(path))


def main(folder: str, moe: bool = False) -> int:
    """Build the model folder unless it is already complete."""
    out = Path(folder)
    if (out / "tokenizer_config.json").exists():
        return 0
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out / "tokenizer.json")
    (out / "config.json").write_text(json.dumps(MOE_CONFIG if moe else CONFIG, indent=1))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 8192,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2) or (len(args) == 2 and args[1] != "--moe"):
        sys.exit("usage: make_tiny_model.py FOLDER [--moe]")
    sys.exit(main(args[0], moe=len(args) == 2))
