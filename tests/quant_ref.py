#!/usr/bin/env python3
"""Reference data for tests/test_quants.cpp, produced with the `gguf` package (llama.cpp's gguf-py).

usage: quant_ref.py OUTDIR [MODEL.gguf ...]

Writes into OUTDIR, for each type name T:
  deq_T.raw / deq_T.f32   random blocks (with sane fp16 scales) and gguf.quants.dequantize of them
  q_T.in / q_T.raw        random floats and gguf.quants.quantize of them (types gguf can quantize)
  model_N_T.raw / .f32    the first rows of one tensor of type T from each MODEL, and its dequantization
and index.txt listing "kind type_name count_elements file_prefix" per line.
"""
import sys, os
import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
import gguf.quants as gq

rng = np.random.default_rng(1234)

# Byte offsets of the fp16 scale fields in each block: random bytes there could be NaN/Inf/huge.
SCALE_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.IQ4_NL: [0],
}

def random_blocks(t, n_blocks):
    bs, ts = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in SCALE_FIELDS[t]:
        d = (rng.uniform(1e-4, 0.5, size=n_blocks) * rng.choice([-1.0, 1.0], size=n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw

def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    index = []
    for t in SCALE_FIELDS:
        raw = random_blocks(t, 64)
        deq = gq.dequantize(raw, t).astype(np.float32).reshape(-1)
        raw.tofile(os.path.join(out, f"deq_{t.name}.raw"))
        deq.tofile(os.path.join(out, f"deq_{t.name}.f32"))
        index.append(f"deq {t.name} {deq.size} deq_{t.name}")
    for t in [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]:
        x = (rng.standard_normal(32 * 64) * rng.uniform(0.01, 3.0)).astype(np.float32)
        x[:32] = 0.0  # an all-zero block
        x[32:64] = np.float32(1.5)  # a constant block
        q = gq.quantize(x.reshape(-1, 32 * 64), t)
        x.tofile(os.path.join(out, f"q_{t.name}.in"))
        np.ascontiguousarray(q).view(np.uint8).tofile(os.path.join(out, f"q_{t.name}.raw"))
        index.append(f"quant {t.name} {x.size} q_{t.name}")
    for mi, path in enumerate(sys.argv[2:]):
        reader = GGUFReader(path)
        done = set()
        for tensor in reader.tensors:
            t = tensor.tensor_type
            if t in done or t not in SCALE_FIELDS or len(tensor.shape) < 2:
                continue
            done.add(t)
            data = np.asarray(tensor.data)  # (rows, bytes_per_row) for quantized types
            rows = data[: min(8, data.shape[0])]
            deq = gq.dequantize(rows, t).astype(np.float32).reshape(-1)
            prefix = f"model_{mi}_{t.name}"
            np.ascontiguousarray(rows).view(np.uint8).tofile(os.path.join(out, prefix + ".raw"))
            deq.tofile(os.path.join(out, prefix + ".f32"))
            index.append(f"model {t.name} {deq.size} {prefix}")
    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(index) + "\n")

if __name__ == "__main__":
    main()
