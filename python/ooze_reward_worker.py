"""A worker of ooze's Python reward (`[reward] type = "python"`): loads the recipe's reward
function once and answers scoring requests, one JSON line each, until stdin closes.

ooze starts it as ``python -c <this file> PATH FUNCTION`` (PATH: the reward's Python file;
FUNCTION: its function's name) and speaks a line protocol on a private pipe, so what the
function prints (stdout is pointed at stderr) never mixes with the answers:

- first line out: ``{"ready": true}`` once the module is loaded and FUNCTION found, or
  ``{"error": "..."}`` (the traceback) when it cannot be;
- each line in: ``{"samples": [{"prompt", "response", "label", "metadata"}, ...], "group": bool}``;
- each line out: ``{"rewards": [number, ...]}`` or ``{"error": "..."}`` with the traceback.

Per sample (``group`` false) the function is called as ``FUNCTION(sample)`` for each sample; as a
group function, once as ``FUNCTION(samples)`` returning one reward per sample. A reward is a
number (``bool`` counts), or a dict with ``score`` or ``reward``. ``async def`` functions run on
one event loop kept for the worker's life.
"""

import asyncio
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback


def _answers():
    """The private pipe for answers, with fd 1 and ``sys.stdout`` moved to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _trace(error):
    """The traceback of `error` in the reward's own code: this worker's frames and importlib's are
    left out."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if f.filename != "<string>" and not f.filename.startswith("<frozen")]
    head = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
    return "".join(head + traceback.format_exception_only(type(error), error))


def _load(path, name):
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("ooze_reward", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ooze_reward"] = module
    spec.loader.exec_module(module)
    function = getattr(module, name, None)
    if function is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise AttributeError(f"{path} has no function {name!r}; it defines: {', '.join(found) or 'none'}")
    if not callable(function):
        raise TypeError(f"{path}: {name} is a {type(function).__name__}, not a function")
    return function


def _number(value, where):
    if isinstance(value, dict):
        value = value.get("score", value.get("reward"))
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number (or a dict with score or reward), "
                        f"got {type(value).__name__}: {value!r:.200}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: the reward is not finite: {value}")
    return value


def main():
    answers = _answers()
    path, name = sys.argv[1], sys.argv[2]
    try:
        function = _load(path, name)
    except BaseException as error:
        answers.write(json.dumps({"error": _trace(error)}) + "\n")
        return
    loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(function) else None

    def call(argument):
        result = function(argument)
        if loop is not None or inspect.isawaitable(result):
            result = (loop or asyncio.new_event_loop()).run_until_complete(result)
        return result

    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            samples = request["samples"]
            if request.get("group"):
                rewards = call(samples)
                if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
                    raise ValueError(f"{name}: a group function returns one reward per sample "
                                     f"({len(samples)}), got {rewards!r:.200}")
                rewards = [_number(r, f"{name}(samples)[{i}]") for i, r in enumerate(rewards)]
            else:
                rewards = [_number(call(s), f"{name}(sample)") for s in samples]
            answers.write(json.dumps({"rewards": rewards}) + "\n")
        except Exception as error:
            answers.write(json.dumps({"error": _trace(error)}) + "\n")


if __name__ == "__main__":
    main()
