"""Build a tiny random-weight Llama model directory that a real vLLM can serve.

Nothing is downloaded: ``config.json`` describes a small ``LlamaForCausalLM`` (vLLM serves it
with ``--load-format dummy``, i.e. random weights) and the tokenizer is a word-level
tokenizer built with the ``tokenizers`` package.

Every word ``w0`` … ``w{N}`` of the vocabulary is exactly one token, and words are split on
whitespace, so ``" ".join(f"w{i % N}" for i in range(k))`` is exactly ``k`` prompt tokens
(plus nothing: no BOS is added). :func:`long_prompt` builds such prompts.

Run with the vLLM venv's python (it has ``tokenizers``)::

    /var/cache/hangwatch/vllm-venv/bin/python harness/tinymodel.py DIR

The main test process imports this module only for :func:`long_prompt` and the constants,
which need nothing beyond the standard library.
"""
from __future__ import annotations

import json
import os
import string
import sys

VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 131072
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
# Single characters (punctuation, letters, digits) so a chat template and ordinary text
# tokenize to something other than <unk>.
CHARS = list(string.punctuation) + list(string.ascii_letters) + list(string.digits)
COMMON = ["system", "user", "assistant", "hello", "world", "the", "is", "ping", "pong"]
N_WORDS = VOCAB_SIZE - len(SPECIALS) - len(CHARS) - len(COMMON)
MARKER = "hangwatch-tinymodel-v2"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }} : {{ message['content'] }} </s> "
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def serving_dtype(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The ``--dtype`` the test servers run: bfloat16, except on a CPU that offers AMX tiles.
    There vLLM 0.32 picks its AMX attention kernel for bfloat16, and on an Intel Xeon VM here
    whose cpuid offers AMX the worker died of SIGILL (exit -4) at the first request; float32
    takes the vector kernel every x86 machine runs. ``HANGWATCH_VLLM_DTYPE`` overrides."""
    chosen = os.environ.get("HANGWATCH_VLLM_DTYPE")
    if chosen:
        return chosen
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "float32" if "amx_tile" in flags else "bfloat16"


def vocab() -> dict[str, int]:
    tokens = SPECIALS + CHARS + COMMON + [f"w{i}" for i in range(N_WORDS)]
    assert len(tokens) == VOCAB_SIZE, len(tokens)
    assert len(set(tokens)) == VOCAB_SIZE
    return {tok: i for i, tok in enumerate(tokens)}


def long_prompt(n_tokens: int, offset: int = 0) -> str:
    """A prompt of exactly ``n_tokens`` tokens for the tiny tokenizer (1 word = 1 token)."""
    return " ".join(f"w{(offset + i) % N_WORDS}" for i in range(n_tokens))


def config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "intermediate_size": 256,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def is_built(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "hangwatch-tinymodel.json")) as f:
            return json.load(f).get("marker") == MARKER
    except (OSError, ValueError):
        return False


def build(directory: str) -> str:
    """Write the model directory (idempotent). Needs the ``tokenizers`` package."""
    if is_built(directory):
        return directory
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    os.makedirs(directory, exist_ok=True)
    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    # Split on whitespace only: "w12 w13" -> ["w12", "w13"]; specials are matched first.
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens(SPECIALS)
    tok.save(os.path.join(directory, "tokenizer.json"))

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "chat_template": CHAT_TEMPLATE,
    }
    special_tokens_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                          "pad_token": "<pad>"}
    generation_config = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    files = {
        "config.json": config(),
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special_tokens_map,
        "generation_config.json": generation_config,
    }
    for name, content in files.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=2)
    # Written last: marks the directory complete.
    with open(os.path.join(directory, "hangwatch-tinymodel.json"), "w") as f:
        json.dump({"marker": MARKER}, f)
    return directory


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} DIR", file=sys.stderr)
        return 64
    directory = build(argv[1])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    n = len(tok.encode(long_prompt(1000), add_special_tokens=False).ids)
    assert n == 1000, f"long_prompt(1000) is {n} tokens"
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
