"""Writes a tiny Llama model folder (config and tokenizer, no weights) for vLLM's dummy loader."""

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


def main(folder: str) -> int:
    """Build the model folder unless it is already complete."""
    out = Path(folder)
    if (out / "tokenizer_config.json").exists():
        return 0
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out / "tokenizer.json")
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))
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
    sys.exit(main(sys.argv[1]))
