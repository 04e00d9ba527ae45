#!/usr/bin/env python3
"""What the agent gateway adds to a model call: the same Chat Completions request timed against
`ooze serve` (the engine's OpenAI endpoint) and against `ooze serve --gateway` (a session per
request: the chat rendered through the session's transcript, budgets checked, the call logged and
recorded as a sample), at each concurrency. Prints p50 and p99 latency per mode and their
difference. Sessions are opened before the clock starts; only the calls are timed.

Usage: gateway_overhead.py OOZE MODEL_DIR [--requests 256] [--concurrency 1 32] [--max-tokens 16]
       [--device cuda]
"""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def post(url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.load(reply)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(ooze, model, device, gateway):
    port = free_port()
    args = [ooze, "serve", "--model", model, "--port", str(port), "--device", device,
            "--max-running", "64", "--dtype", "bf16" if device.startswith("cuda") else "fp32"]
    if gateway:
        args.append("--gateway")
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{root}/v1/models", timeout=2)
            return server, root
        except OSError:
            if server.poll() is not None:
                sys.exit(f"ooze serve exited: {server.stderr.read()[-2000:]}")
            time.sleep(0.5)
    sys.exit("ooze serve did not start")


def messages(i):
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Question {i}: what is {i} plus {i}? Think step by step."}]


def timed(root, requests, concurrency, max_tokens, keys):
    latencies, lock = [], threading.Lock()
    queue = list(range(requests))

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            body = {"model": "m", "messages": messages(i), "max_tokens": max_tokens}
            start = time.perf_counter()
            reply = post(f"{root}/v1/chat/completions", body, keys[i] if keys else None)
            elapsed = time.perf_counter() - start
            assert reply["usage"]["completion_tokens"] > 0, reply
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ooze")
    p.add_argument("model")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    results = {}
    for gateway in (False, True):
        server, root = serve(a.ooze, a.model, a.device, gateway)
        try:
            mode = "gateway" if gateway else "direct"
            # Warm-up: the engine's first batches (CUDA graphs, caches).
            warm_keys = [post(f"{root}/gateway/sessions", {"session": f"warm-{i}"})["session"]
                         for i in range(8)] if gateway else None
            timed(root, 8, 8, a.max_tokens, warm_keys)
            for c in a.concurrency:
                keys = None
                if gateway:
                    keys = [post(f"{root}/gateway/sessions", {"session": f"c{c}-{i}"})["session"]
                            for i in range(a.requests)]
                start = time.perf_counter()
                lat = timed(root, a.requests, c, a.max_tokens, keys)
                wall = time.perf_counter() - start
                results[(mode, c)] = (percentile(lat, 50), percentile(lat, 99), statistics.mean(lat), wall)
        finally:
            server.terminate()
            server.wait()
    print(f"{a.requests} requests of {a.max_tokens} tokens, model {a.model}, device {a.device}")
    print(f"{'mode':8} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>7}")
    for (mode, c), (p50, p99, mean, wall) in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{mode:8} {c:>4} {p50 * 1e3:8.1f} {p99 * 1e3:8.1f} {mean * 1e3:8.1f} {a.requests / wall:7.1f}")
    for c in a.concurrency:
        d, g = results[("direct", c)], results[("gateway", c)]
        print(f"gateway overhead at concurrency {c}: p50 {1e3 * (g[0] - d[0]):+.2f} ms, "
              f"p99 {1e3 * (g[1] - d[1]):+.2f} ms ({100 * (g[0] / d[0] - 1):+.1f}% at p50)")


if __name__ == "__main__":
    main()
