#!/usr/bin/env python3
"""Router mode over HTTP (run by tests/test_embeddings.cpp after tests/embd_ref.py wrote WORKDIR).

A preset INI with two models, a chat model (SmolLM2) and an embedding model (all-MiniLM-L6-v2 with
`embedding = 1`, `pooling = mean`, `device = none`), behind one ./llm-server --models-preset ... --models-max 1:
both listed unloaded; a chat request loads the chat model on demand (load time measured); an embedding
request loads the other and unloads the chat model (LRU, --models-max 1); a streamed chat request is
relayed event by event; a child killed with SIGKILL shows `failed` with the reason while the other
model is still served, and the next request loads it again; /models/load and /models/unload; the
proxy's overhead per request against the child's own port. Exit status 1 on a failure.
Usage: router_test.py WORKDIR
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embd_server import FAILURES, ROOT, check, http_request as request  # noqa: E402


def statuses(port):
    _, body = request(port, "GET", "/models")
    return {m["id"]: m["status"] for m in body["data"]}


def child_pids(router_pid):
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(router_pid)], capture_output=True, text=True).stdout
    return {("chat" if "SmolLM2" in line else "embed"): int(line.split()[0]) for line in out.splitlines() if line.strip()}


def main():
    work = Path(sys.argv[1])
    chat_model = ROOT / "models" / "SmolLM2-135M-Instruct-Q4_1.gguf"
    preset = work / "router.ini"
    preset.write_text(f"""# two models behind one port
[*]
ctx-size = 1024
threads = 2

[chat]
model = {chat_model}
parallel = 2

[embed]
model = {work / 'minilm-f32.gguf'}
embedding = 1
pooling = mean
device = none
""")
    log = open(work / "router.log", "w+")
    router = subprocess.Popen([str(ROOT / "llm-server"), "--models-preset", str(preset), "--models-max", "1", "--host", "127.0.0.1",
                               "--port", "0", "--no-warmup"], stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(200):
            log.seek(0)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)\n", log.read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        if port is None:
            log.seek(0)
            sys.exit("router did not start:\n" + log.read())
        check(request(port, "GET", "/health") == (200, {"status": "ok"}), "router /health")
        st = statuses(port)
        check(st["chat"]["value"] == "unloaded" and st["embed"]["value"] == "unloaded", f"both unloaded at start: {st}")

        chat = {"model": "chat", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}
        t0 = time.time()
        code, body = request(port, "POST", "/v1/chat/completions", chat)
        first_ms = (time.time() - t0) * 1000
        check(code == 200 and body["choices"][0]["message"]["content"], f"chat through the router: {code} {body}")
        st = statuses(port)
        check(st["chat"]["value"] == "loaded" and st["embed"]["value"] == "unloaded", f"chat loaded on demand: {st}")
        print(f"chat model loaded on demand: first request {first_ms:.0f} ms (load {st['chat'].get('load_ms', 0):.0f} ms)")

        t0 = time.time()
        code, body = request(port, "POST", "/v1/embeddings", {"model": "embed", "input": ["hello", "world"]})
        embed_ms = (time.time() - t0) * 1000
        check(code == 200 and len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 384, f"embeddings through the router: {code}")
        st = statuses(port)
        check(st["embed"]["value"] == "loaded" and st["chat"]["value"] == "unloaded", f"--models-max 1 unloads the LRU model: {st}")
        print(f"embedding model loaded on demand (chat model unloaded first): {embed_ms:.0f} ms")

        # proxy overhead: the same request through the router and straight to the child
        log.seek(0)
        child_port = int(re.findall(r"\[embed\] .*listening on 127\.0\.0\.1:(\d+)", log.read())[-1])
        def timed(p, n=20):
            t = time.time()
            for _ in range(n):
                request(p, "POST", "/v1/embeddings", {"model": "embed", "input": "hello"})
            return (time.time() - t) * 1000 / n
        direct, routed = timed(child_port), timed(port)
        print(f"proxy overhead per /v1/embeddings request: {routed - direct:.2f} ms ({direct:.2f} ms direct, {routed:.2f} ms routed)")

        # streaming is relayed as server-sent events
        code, text = request(port, "POST", "/v1/chat/completions", {**chat, "stream": True}, raw=True)
        events = [line for line in text.splitlines() if line.startswith("data: ")]
        check(code == 200 and len(events) >= 2 and events[-1] == "data: [DONE]", f"streamed chat: {code} {events[-1:]}")
        st = statuses(port)
        check(st["chat"]["value"] == "loaded" and st["embed"]["value"] == "unloaded", f"chat back, embed unloaded: {st}")

        # a child killed with SIGKILL: failed with the reason, the router and the other model go on
        pids = child_pids(router.pid)
        check("chat" in pids, f"chat child running: {pids}")
        os.kill(pids["chat"], signal.SIGKILL)
        for _ in range(100):
            st = statuses(port)
            if st["chat"]["value"] == "failed":
                break
            time.sleep(0.05)
        check(st["chat"]["value"] == "failed" and "signal 9" in st["chat"].get("reason", ""), f"killed child is failed: {st}")
        code, body = request(port, "POST", "/v1/embeddings", {"model": "embed", "input": "still here"})
        check(code == 200, "the other model is served after the crash")
        code, body = request(port, "POST", "/v1/chat/completions", chat)
        check(code == 200 and statuses(port)["chat"]["value"] == "loaded", "the crashed model loads again on the next request")

        # explicit load / unload, autoload off per request, unknown models
        check(request(port, "POST", "/models/unload", {"model": "chat"})[0] == 200 and statuses(port)["chat"]["value"] == "unloaded",
              "/models/unload")
        code, _ = request(port, "POST", "/v1/chat/completions?autoload=false", chat)
        check(code == 400, f"?autoload=false on an unloaded model: {code}")
        check(request(port, "POST", "/models/load", {"model": "chat"})[0] == 200 and statuses(port)["chat"]["value"] == "loaded",
              "/models/load")
        check(request(port, "POST", "/v1/chat/completions", {**chat, "model": "nope"})[0] == 404, "unknown model is a 404")
        check(request(port, "GET", "/v1/models")[0] == 200, "/v1/models")
    finally:
        children = child_pids(router.pid)
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(timeout=30)
        except subprocess.TimeoutExpired:
            router.kill()
            check(False, "router did not stop on SIGTERM")
        def alive(pid):
            try:
                os.kill(pid, 0)
                return True
            except OSError:
                return False
        left = [pid for pid in children.values() if alive(pid)]
        check(not left, f"children stopped with the router: {left}")
        log.close()
    if FAILURES:
        print((work / "router.log").read_text()[-3000:])
    print(f"{len(FAILURES)} failures")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
