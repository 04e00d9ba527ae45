"""A shop assistant built on the OpenAI Agents SDK (`openai-agents`), unmodified, trained by ooze.

The agent answers "How much does one kiwi cost?" with a `lookup_price` function tool over the
shop's catalogue (each question has its own prices, in the task's metadata, so only the tool
knows them). It is an ordinary Agents SDK program: `Agent`, `@function_tool`, `Runner.run`. The
SDK's default client reads OPENAI_BASE_URL and OPENAI_API_KEY, which ooze points at its gateway,
so every model call (OpenAI Responses API) is recorded token-exactly and trained on; the recipe's
[reward] (reward.py) judges the final output.

Run by ooze (`[agent] type = "command"`), once per execution; try it by hand against
`ooze serve --gateway` (see the README).
"""

import asyncio

from agents import Agent, ModelSettings, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

import ooze_agent

INSTRUCTIONS = ("You are the shop's assistant. Prices change every day: look them up with "
                "lookup_price. Answer with the price of one item in dollars.")
MAX_TURNS = 4

# The catalogue of the task being answered (set per execution), and the prices the tool gave.
CATALOGUE = {}
LOOKED_UP = []


@function_tool
def lookup_price(item: str) -> str:
    """The shop's price of one item, in dollars.

    Args:
        item: The item's name, e.g. "apple".
    """
    price = CATALOGUE.get(item.strip().lower().removesuffix("s"))
    LOOKED_UP.append(price)
    return f"${price}" if price is not None else f"The shop does not sell {item!r}."


def shop_agent():
    return Agent(name="shop assistant", instructions=INSTRUCTIONS, tools=[lookup_price],
                 model="policy", model_settings=ModelSettings(max_tokens=96))


def agent(task):
    CATALOGUE.clear()
    CATALOGUE.update(task["metadata"]["prices"])
    LOOKED_UP.clear()
    try:
        result = asyncio.run(Runner.run(shop_agent(), task["prompt"], max_turns=MAX_TURNS))
    except (MaxTurnsExceeded, ModelBehaviorError) as e:
        # Out of turns, or a tool call the SDK could not parse: no answer, reward 0.
        return {"answer": "", "metrics": {"stopped": 1, "stopped_" + type(e).__name__: 1}}
    calls = sum(1 for item in result.new_items if item.type == "tool_call_item")
    # Diagnostics, not reward: did a lookup return the asked item's price (the label)?
    found = float(any(str(price) == str(task["label"]) for price in LOOKED_UP))
    return {"answer": str(result.final_output),
            "metrics": {"tool_calls": calls, "found_price": found, "stopped": 0}}


if __name__ == "__main__":
    ooze_agent.run(agent)
