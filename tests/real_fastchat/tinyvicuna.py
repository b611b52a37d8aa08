"""Build a tiny random-weight Llama that a real FastChat model worker can serve.

Nothing is downloaded: a small ``LlamaForCausalLM(config)`` is saved with ``transformers``
(random weights, ~3 MB) beside a word-level tokenizer made with ``tokenizers``. The
directory's name must contain ``vicuna``: FastChat picks its adapter and conversation
template from the path.

One trick keeps generation long and its length predictable: the tokenizer's ``</s>`` has an
id *outside* the model's vocabulary, so random weights can never produce the end-of-sequence
token and every request generates exactly ``max_new_tokens`` tokens. A request with a large
``max_new_tokens`` keeps a worker busy for as long as a test needs.

Run with the FastChat venv's python::

    /var/cache/hangwatch/fastchat-venv/bin/python tests/real_fastchat/tinyvicuna.py DIR
    ... tinyvicuna.py --check DIR    # exit 0 when DIR is complete
"""
from __future__ import annotations

import json
import os
import string
import sys

MODEL_VOCAB = 1024          # ids the model can produce
MAX_POSITIONS = 8192        # context length FastChat reads from config.json
MARKER = "hangwatch-tinyvicuna-v1"
SPECIALS = ["<unk>", "<s>", "<pad>"]
COMMON = ["A", "chat", "between", "USER:", "ASSISTANT:", "hello", "ping", "pong", "count"]


def vocab() -> dict[str, int]:
    chars = list(string.punctuation) + list(string.ascii_letters) + list(string.digits)
    words = SPECIALS + [c for c in chars if c not in COMMON] + COMMON
    words += [f"w{i}" for i in range(MODEL_VOCAB - len(words))]
    table = {word: i for i, word in enumerate(words[:MODEL_VOCAB])}
    table["</s>"] = MODEL_VOCAB  # outside the model's vocabulary: never generated
    return table


def is_built(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "hangwatch-model.json")) as f:
            return json.load(f).get("marker") == MARKER
    except (OSError, ValueError):
        return False


def build(directory: str) -> str:
    if "vicuna" not in os.path.basename(os.path.normpath(directory)):
        raise SystemExit(f"{directory}: the directory name must contain 'vicuna'")
    if is_built(directory):
        return directory
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(directory, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=MODEL_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1, eos_token_id=MODEL_VOCAB, pad_token_id=2, tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(SPECIALS + ["</s>"])
    tok.save(os.path.join(directory, "tokenizer.json"))
    files = {
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": MAX_POSITIONS,
        },
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                    "pad_token": "<pad>"},
    }
    for name, content in files.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=2)
    with open(os.path.join(directory, "hangwatch-model.json"), "w") as f:  # written last
        json.dump({"marker": MARKER}, f)
    return directory


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--check":
        return 0 if is_built(argv[2]) else 1
    if len(argv) != 2:
        print(f"usage: {argv[0]} [--check] DIR", file=sys.stderr)
        return 64
    print(build(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
