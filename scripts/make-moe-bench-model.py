#!/usr/bin/env python3
"""Writes a benchmark model with DeepSeek-V2-Lite's layer shapes and random weights.

    python3 scripts/make-moe-bench-model.py models/moe-bench-F16.gguf
    ./llm-quantize models/moe-bench-F16.gguf models/moe-bench-Q4_K_M.gguf Q4_K_M 2

Shapes per layer are DeepSeek-V2-Lite's (n_embd 2048, 16 heads, MLA with kv_lora_rank 512, rope dim 64,
qk_nope 128, v_head 128, 64 routed experts of width 1408 with 6 used, 2 shared experts), but only 3
layers, all of them MoE (no leading dense block), so a run takes seconds and the expert matmuls
dominate the way they do in the full model. The vocabulary is 32000 (not the real 102400) so the output
projection does not swamp the three layers; the tokenizer is `no_vocab` (benchmarks feed token ids).

The tensors use the current converter's split MLA layout: attn_k_b [128, 512, 16] and attn_v_b
[512, 128, 16] (f32, as llama.cpp writes them), key_length 576 / value_length 512 for the absorbed
view, head_count_kv 1. Weights are normal with std 0.02 (norms are 1), the same for every run (seeded).
"""
import sys

import numpy as np
import gguf

from bench_model import RandomWeights, write

ARCH = "deepseek2"
N_LAYER = 3
N_EMBD = 2048
N_HEAD = 16
KV_LORA = 512
ROPE = 64
NOPE = 128
V_HEAD = 128
N_EXPERT = 64
N_USED = 6
N_SHARED = 2
FF_EXP = 1408
N_FF = 10944  # the dense FFN width of V2-Lite; metadata only (no dense blocks here)
VOCAB = 32000


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make-moe-bench-model.py OUT.gguf")
    out = sys.argv[1]
    weights = RandomWeights(1234)
    rand, ones = weights.normal, weights.ones

    w = gguf.GGUFWriter(out, ARCH)
    w.add_name("moe-bench-deepseek2-lite-shapes")
    w.add_vocab_size(VOCAB)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("no_vocab")
    w.add_leading_dense_block_count(0)
    w.add_q_lora_rank(0)
    w.add_kv_lora_rank(KV_LORA)
    w.add_rope_dimension_count(ROPE)
    w.add_key_length(KV_LORA + ROPE)
    w.add_value_length(KV_LORA)
    w.add_uint32(f"{ARCH}.attention.key_length_mla", NOPE + ROPE)
    w.add_uint32(f"{ARCH}.attention.value_length_mla", V_HEAD)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_expert_shared_count(N_SHARED)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(False)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)

    w.add_tensor("token_embd.weight", rand(VOCAB, N_EMBD))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    w.add_tensor("output.weight", rand(VOCAB, N_EMBD))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "attn_q.weight", rand(N_HEAD * (NOPE + ROPE), N_EMBD))
        w.add_tensor(p + "attn_kv_a_mqa.weight", rand(KV_LORA + ROPE, N_EMBD))
        w.add_tensor(p + "attn_kv_a_norm.weight", ones(KV_LORA))
        w.add_tensor(p + "attn_k_b.weight", rand(N_HEAD, KV_LORA, NOPE, dtype=np.float32))
        w.add_tensor(p + "attn_v_b.weight", rand(N_HEAD, V_HEAD, KV_LORA, dtype=np.float32))
        w.add_tensor(p + "attn_output.weight", rand(N_EMBD, N_HEAD * V_HEAD))
        w.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "ffn_gate_inp.weight", rand(N_EXPERT, N_EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", rand(N_EXPERT, FF_EXP, N_EMBD))
        w.add_tensor(p + "ffn_up_exps.weight", rand(N_EXPERT, FF_EXP, N_EMBD))
        w.add_tensor(p + "ffn_down_exps.weight", rand(N_EXPERT, N_EMBD, FF_EXP))
        w.add_tensor(p + "ffn_gate_shexp.weight", rand(N_SHARED * FF_EXP, N_EMBD))
        w.add_tensor(p + "ffn_up_shexp.weight", rand(N_SHARED * FF_EXP, N_EMBD))
        w.add_tensor(p + "ffn_down_shexp.weight", rand(N_EMBD, N_SHARED * FF_EXP))

    write(w, out)


if __name__ == "__main__":
    main()
