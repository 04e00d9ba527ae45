"""SGLang's own router (the `sglang-router` package) in front of `ooze serve`: the router is
started on a free port with the server as its one worker, and `/generate` (text and token ids) and
`/v1/chat/completions` (whole and streamed) are sent through it. The router adds SGLang's own
fields to what it forwards (`model`, `return_hidden_states`, `no_stop_trim`, …); ooze serve
accepts them and counts them as ignored. Usage: sglang_router_check.py http://HOST:PORT/v1"""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def post(url, body, timeout=60):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.status, reply.read().decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    worker = sys.argv[1].removesuffix("/v1")
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
         "--port", str(port), "--worker-urls", worker,
         # Its metrics exporter listens too (on 29000 unless told): a free port, so runs can overlap.
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                status, _ = post(f"{base}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}, 10)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if router.poll() is not None or time.time() > deadline:
                sys.exit(f"the router did not route a request within 90 s:\n{router.stderr.read()[-4000:]}")
            time.sleep(0.5)

        status, text = post(f"{base}/generate", {"text": "Question: Alice has", "sampling_params": {"max_new_tokens": 4}})
        out = json.loads(text)
        assert status == 200 and len(out["output_ids"]) == 4, text
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 4}, text
        status, text = post(f"{base}/generate", {"input_ids": [1, 2, 3], "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
        out = json.loads(text)
        assert status == 200 and len(out["meta_info"]["output_token_logprobs"]) == 3, text

        chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Count"}], "max_tokens": 5}
        status, text = post(f"{base}/v1/chat/completions", chat)
        out = json.loads(text)
        assert status == 200 and out["usage"]["completion_tokens"] == 5, text
        assert out["choices"][0]["message"]["role"] == "assistant", text
        status, text = post(f"{base}/v1/chat/completions", {**chat, "stream": True})
        assert status == 200 and "data: [DONE]" in text and '"role":"assistant"' in text, text

        with urllib.request.urlopen(f"{worker}/get_server_info", timeout=30) as reply:
            ignored = json.loads(reply.read())["ignored_fields"]
        assert ignored.get("model", 0) >= 3, ignored
    finally:
        router.terminate()
        try:
            router.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.kill()
    print(f"sglang-router: /generate and /v1/chat/completions routed to ooze serve; ignored fields {sorted(ignored)}")


if __name__ == "__main__":
    main()
