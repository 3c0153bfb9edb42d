"""Make the tiny random-weight chat model the real-engine tests serve with `vllm serve`.

Nothing here comes from a model hub (these machines reach none): the weights are drawn from a
seeded generator and the tokenizer is a byte-level BPE trained, in seconds, on the Python
standard library's own ``.py`` files. The model is a ``Qwen2ForCausalLM`` of 2 layers, hidden
256, 4 query / 2 KV heads of head_dim 64 (a head size vLLM's CPU attention backend supports) —
about 3.3 M parameters in bf16 — with ChatML special tokens and chat template, so vLLM's OpenAI
server renders chat requests as it does for Qwen2 models. Its output is noise; the tests are
about scheduling, streaming, metrics and faults, which need real engine steps, not sense.

The result is deterministic for a given Python (the training text) and library versions; a
stamp file records the recipe so callers can reuse a cached copy (``--check`` exits 1 when the
directory is missing or stale).

Usage (in an environment with torch, transformers and tokenizers, e.g. the real-engine venv):
    python scripts/make_tiny_model.py OUT_DIR [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

RECIPE = 1
"""Bump when anything below changes what is written."""
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MAX_POSITIONS = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ARCHITECTURE = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": MAX_POSITIONS,
    "max_window_layers": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
    "torch_dtype": "bfloat16",
}
STAMP = ".tiergate-tiny-model"
TRAINING_FILES = 400
"""Standard-library files the tokenizer trains on (sorted by path: the same on every machine
with this Python)."""


def recipe_stamp() -> str:
    """What the output depends on: this recipe, the Python (training text) and library versions."""
    import tokenizers
    import torch
    import transformers

    parts = [
        f"recipe={RECIPE}",
        sys.version.split()[0],
        f"torch={torch.__version__}",
        f"transformers={transformers.__version__}",
        f"tokenizers={tokenizers.__version__}",
        json.dumps(ARCHITECTURE, sort_keys=True),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def training_text() -> list[str]:
    """The standard library's ``.py`` sources, first TRAINING_FILES by sorted path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())[:TRAINING_FILES]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = Qwen2Config(
        **{k: v for k, v in ARCHITECTURE.items() if k not in ("architectures", "torch_dtype")},
        bos_token_id=vocab.token_to_id("<|endoftext|>"),
        eos_token_id=vocab.token_to_id("<|im_end|>"),
    )
    config.architectures = ARCHITECTURE["architectures"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id
    ).save_pretrained(out)


def is_current(out: Path) -> bool:
    stamp = out / STAMP
    return stamp.is_file() and stamp.read_text().strip() == recipe_stamp()


def make(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    build_tokenizer(out)
    build_model(out)
    (out / STAMP).write_text(recipe_stamp() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if missing or stale")
    args = parser.parse_args(argv)
    if is_current(args.out):
        print(f"{args.out}: up to date")
        return 0
    if args.check:
        print(f"{args.out}: missing or stale")
        return 1
    make(args.out)
    print(f"{args.out}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
