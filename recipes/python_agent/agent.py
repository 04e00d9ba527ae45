"""A Python agent with a tool loop, trained by ooze through the agent gateway.

It answers arithmetic questions and may call a `calculator` tool: the policy writes the tool call,
this program runs it and sends the result back, until the policy answers with \\boxed{...}. Nothing
here knows about RL: the calls go to an OpenAI-compatible endpoint (ooze's gateway), which records
them token-exactly; the recipe's [reward] judges the answer.

Run by ooze (`[agent] type = "command"`), once per execution; try it by hand with
`ooze serve --gateway` (see the README).
"""

import ast
import json
import operator

import ooze_agent

SYSTEM = ("Answer the question. You may call the calculator for exact arithmetic. "
          "End with the answer as \\boxed{...}.")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}]

MAX_TURNS = 4

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression):
    """The value of an arithmetic expression, or an error message for the model."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")
    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return f"error: {e}"
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


def messages_for(question):
    """The conversation the agent starts with (make_data.py writes its demonstrations the same
    way)."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def agent(task):
    client = ooze_agent.openai_client()
    messages = messages_for(task["prompt"])
    tool_calls = 0
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            tool_calls += 1
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = call.function.arguments
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(expression)})
    answers = [m.get("content") or "" for m in messages if m["role"] == "assistant"]
    return {"answer": answers[-1], "metrics": {"tool_calls": tool_calls}}


if __name__ == "__main__":
    ooze_agent.run(agent)
