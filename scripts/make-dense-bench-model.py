#!/usr/bin/env python3
"""Writes a benchmark model with a real dense model's shapes and random weights (F16).

    python3 scripts/make-dense-bench-model.py smollm2-135m models/bench-smollm2-135m-F16.gguf
    ./llm-quantize models/bench-smollm2-135m-F16.gguf models/bench-smollm2-135m-Q8_0.gguf Q8_0 2

Shapes (llama architecture, tied output as the real models have it):
  smollm2-135m   n_embd 576, 30 layers, 9 heads / 3 KV heads, FFN 1536, vocab 49152
  llama-3.2-1b   n_embd 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192, vocab 128256

Weights are normal with std 0.02 (norms are 1), seeded, so every run writes the same file; the tokenizer
is `no_vocab` (benchmarks feed token ids). Used by scripts/bench-cpu.
"""
import sys

import gguf

from bench_model import RandomWeights, write

SHAPES = {
    "smollm2-135m": dict(n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536, vocab=49152, rope_base=100000.0),
    "llama-3.2-1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, vocab=128256, rope_base=500000.0),
}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit("usage: make-dense-bench-model.py {%s} OUT.gguf" % ",".join(SHAPES))
    name, out = sys.argv[1], sys.argv[2]
    s = SHAPES[name]
    weights = RandomWeights(4321)
    rand, ones = weights.normal, weights.ones
    head_dim = s["n_embd"] // s["n_head"]

    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"bench-{name}-shapes")
    w.add_vocab_size(s["vocab"])
    w.add_context_length(8192)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(s["rope_base"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("no_vocab")

    w.add_tensor("token_embd.weight", rand(s["vocab"], s["n_embd"]))
    w.add_tensor("output_norm.weight", ones(s["n_embd"]))
    kv = s["n_head_kv"] * head_dim
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones(s["n_embd"]))
        w.add_tensor(p + "attn_q.weight", rand(s["n_embd"], s["n_embd"]))
        w.add_tensor(p + "attn_k.weight", rand(kv, s["n_embd"]))
        w.add_tensor(p + "attn_v.weight", rand(kv, s["n_embd"]))
        w.add_tensor(p + "attn_output.weight", rand(s["n_embd"], s["n_embd"]))
        w.add_tensor(p + "ffn_norm.weight", ones(s["n_embd"]))
        w.add_tensor(p + "ffn_gate.weight", rand(s["n_ff"], s["n_embd"]))
        w.add_tensor(p + "ffn_up.weight", rand(s["n_ff"], s["n_embd"]))
        w.add_tensor(p + "ffn_down.weight", rand(s["n_embd"], s["n_ff"]))

    write(w, out)


if __name__ == "__main__":
    main()
