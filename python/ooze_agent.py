"""The Python side of an ooze agent program (`[agent] type = "command"`).

ooze starts the program once per execution with the task as one JSON object on stdin and the
agent gateway's address in the environment; whatever the program asks the policy through the
OpenAI or Anthropic clients below is recorded token-exactly and trained on. The program ends by
printing its result as the last line of stdout (``finish``). A whole agent::

    import ooze_agent

    task = ooze_agent.task()
    client = ooze_agent.openai_client()
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}])
    ooze_agent.finish(answer=reply.choices[0].message.content)

With ``answer``, the recipe's ``[reward]`` judges it; ``reward`` (a number, or named parts that
are summed) replaces that; ``metrics`` are logged per step. ``run(agent)`` does the reading,
the printing and the error handling around a function ``agent(task) -> answer | dict``.

The task's keys: ``prompt`` (the question: the last user message's text), ``messages`` (the
dataset's chat, system prompt included), ``label``, ``metadata``, ``tools`` (the row's, if any),
``group``, ``index``, ``source_line``, ``session``, ``base_url``, ``gateway_url``.

Only the standard library is imported here; ``openai`` and ``anthropic`` are imported when their
clients are asked for. ooze puts this file on the program's ``PYTHONPATH``; outside ooze (trying
an agent by hand against ``ooze serve --gateway``) set the variables yourself.
"""

import json
import os
import sys
import traceback

__all__ = ["task", "openai_client", "async_openai_client", "anthropic_client",
           "async_anthropic_client", "finish", "run"]

_task = None


def task():
    """The task ooze sent on stdin (read once)."""
    global _task
    if _task is None:
        text = sys.stdin.readline()
        if not text.strip():
            raise RuntimeError("no task on stdin: this program is meant to be started by ooze "
                               "([agent] type = \"command\")")
        _task = json.loads(text)
    return _task


def _session():
    key = os.environ.get("OOZE_SESSION_ID")
    url = os.environ.get("OOZE_GATEWAY_URL")
    if not key or not url:
        raise RuntimeError("OOZE_SESSION_ID and OOZE_GATEWAY_URL are not set: this program is "
                           "meant to be started by ooze ([agent] type = \"command\")")
    return url, key


def openai_client(**kwargs):
    """An ``openai.OpenAI`` client for this execution's session (no retries: a failed call is
    the agent's to handle, and a budget refusal stays a refusal)."""
    import openai
    url, key = _session()
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=url + "/v1", api_key=key, **kwargs)


def async_openai_client(**kwargs):
    """An ``openai.AsyncOpenAI`` client for this execution's session."""
    import openai
    url, key = _session()
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, **kwargs)


def anthropic_client(**kwargs):
    """An ``anthropic.Anthropic`` client for this execution's session."""
    import anthropic
    url, key = _session()
    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=url, api_key=key, **kwargs)


def async_anthropic_client(**kwargs):
    """An ``anthropic.AsyncAnthropic`` client for this execution's session."""
    import anthropic
    url, key = _session()
    kwargs.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, **kwargs)


def finish(answer=None, reward=None, metrics=None):
    """Prints the result line ooze reads (the last line of stdout)."""
    result = {}
    if answer is not None:
        result["answer"] = str(answer)
    if reward is not None:
        result["reward"] = reward if isinstance(reward, dict) else float(reward)
    if metrics:
        result["metrics"] = {k: float(v) for k, v in metrics.items()}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


def run(agent):
    """Runs ``agent(task)`` and prints its result: a string is the answer, a dict holds
    ``answer`` / ``reward`` / ``metrics``, ``None`` leaves the judging to the last assistant
    text. An exception is printed with its traceback on stderr (kept in the run directory) and
    fails the execution."""
    try:
        out = agent(task())
        if asyncio_coroutine(out):
            import asyncio
            out = asyncio.run(out)
    except Exception:  # noqa: BLE001 - reported, then the execution fails
        traceback.print_exc()
        sys.exit(1)
    if isinstance(out, dict):
        finish(answer=out.get("answer"), reward=out.get("reward"), metrics=out.get("metrics"))
    elif out is not None:
        finish(answer=out)


def asyncio_coroutine(value):
    """Whether ``value`` is a coroutine (an ``async def`` agent)."""
    import inspect
    return inspect.iscoroutine(value)
