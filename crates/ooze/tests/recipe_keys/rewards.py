"""Reward functions for the recipe-key rows of `[reward] type = "python"` (cases/inputs.rs)."""
import os
import sys
import time

_calls = 0


def quarter(sample):
    return 0.25


def by_length(sample):
    return len(sample["response"]) / 1000


def either(x):
    """Per sample 0.25; as a group function, each sample's index in its group."""
    if isinstance(x, list):
        return [float(i) for i in range(len(x))]
    return 0.25


def calls_in_this_worker(sample):
    """How many samples this worker process has scored, this one included, after a pause long
    enough for the pool's other calls to start: with one worker 1, 2, 3, 4; with more, the calls
    spread over fresh workers and count again from 1."""
    global _calls
    _calls += 1
    time.sleep(0.3)
    return float(_calls)


def wrapped(sample):
    """1 under the interpreter wrapper `py` that the harness writes (it sets OOZE_TEST_WRAPPED)."""
    print("scored by", sys.executable, file=sys.stderr)
    return float(os.environ.get("OOZE_TEST_WRAPPED") == "1")
