"""Write a random-weight llama GGUF that llama-server can serve: no download needed.

Run by ``.ci/setup-llamacpp.sh`` with ``PYTHONPATH=<llama.cpp tree>/gguf-py`` (the tree's own
``gguf`` package, so the file format always matches the server built from the same tree).
The tokenizer keys are copied from the tree's vocab-only ``models/ggml-vocab-llama-spm.gguf``.

The size is chosen so that decoding is slow enough to watch: 1024 wide × 12 layers, f16
(≈ 440 MB) decodes ≈ 63 tokens/s alone and ≈ 130 tokens/s over 4 slots on this 2-core
machine, so four long generations keep the server observably busy for many seconds. The
weights are random; their values do not change the speed, so one random pool is sliced for
every tensor instead of drawing 220 M numbers (writing takes a few seconds).

    python gguf_model.py --vocab models/ggml-vocab-llama-spm.gguf --out model.gguf
"""
from __future__ import annotations

import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

N_EMBD = 1024
N_LAYER = 12
N_HEAD = 16
N_FF = 2816
N_CTX = 8192  # the server's slot context is capped by the model's own context length


def copy_tokenizer(writer: GGUFWriter, vocab_path: str) -> int:
    """Copy every ``tokenizer.*`` key of the vocab-only model; return the vocabulary size."""
    reader = GGUFReader(vocab_path)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = field.types[0]
        if main == GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_key_value(key, values, main, sub_type=field.types[-1])
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(values)
        else:
            writer.add_key_value(key, field.contents(), main)
    if not n_vocab:
        raise SystemExit(f"{vocab_path}: no tokenizer.ggml.tokens")
    return n_vocab


def write_model(vocab_path: str, out_path: str, seed: int = 0) -> None:
    writer = GGUFWriter(out_path, "llama")
    writer.add_name("hangwatch-random-1024x12")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(writer, vocab_path)
    writer.add_vocab_size(n_vocab)

    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 22, dtype=np.float32) * 0.02).astype(np.float16)

    def weight(*shape: int) -> np.ndarray:
        size = int(np.prod(shape))
        start = int(rng.integers(0, pool.size))
        return np.resize(np.roll(pool, -start), size).reshape(shape)

    norm = np.ones(N_EMBD, dtype=np.float32)
    # numpy shapes are (rows, columns) = (out, in); the writer stores them reversed (ggml order).
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", norm)
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", required=True, help="the tree's models/ggml-vocab-llama-spm.gguf")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    write_model(args.vocab, args.out)


if __name__ == "__main__":
    main()
