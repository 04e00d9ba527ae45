"""Conversations and texts the chat-template and tokenizer references are computed on.

Each conversation is rendered with every family's official template unless `families` limits it.
Cases a template rejects are kept: ooze must raise the same exception.
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
PYTHON = {"type": "function", "function": {
    "name": "python", "description": "Run Python code and return stdout.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    {"name": "single user turn, generation prompt", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    {"name": "system, multi-turn, generation prompt", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are a careful math tutor."},
                  {"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": "2 + 2 = 4."},
                  {"role": "user", "content": "And times 3?"}]},
    {"name": "multi-turn without system, no generation prompt",
     "messages": [{"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello. How can I help?"},
                  {"role": "user", "content": "Tell me a joke."},
                  {"role": "assistant", "content": "Why did the tensor cross the road? To broadcast."}]},
    {"name": "tools offered, generation prompt", "add_generation_prompt": True, "tools": [WEATHER, PYTHON],
     "messages": [{"role": "user", "content": "Weather in Zürich?"}]},
    {"name": "tools with system prompt", "add_generation_prompt": True, "tools": [WEATHER],
     "messages": [{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "Is it raining in Paris?"}]},
    {"name": "tool call and result, final answer", "tools": [WEATHER],
     "messages": [{"role": "user", "content": "Weather in Zürich?"},
                  {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich", "unit": "celsius"})]},
                  {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
                  {"role": "assistant", "content": "It is 21.5 °C and clear in Zürich."}]},
    {"name": "two parallel tool calls", "tools": [WEATHER], "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Compare Oslo and Rome."},
                  {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Oslo"}), call("get_weather", {"city": "Rome"})]},
                  {"role": "tool", "name": "get_weather", "content": "3 degrees"},
                  {"role": "tool", "name": "get_weather", "content": "24 degrees"}]},
    {"name": "assistant text with a tool call", "tools": [PYTHON], "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Compute 17 * 23 with Python."},
                  {"role": "assistant", "content": "Let me run that.", "tool_calls": [call("python", {"code": "print(17 * 23)\n"})]},
                  {"role": "tool", "name": "python", "content": "391\n"}]},
    {"name": "non-ASCII and special characters", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "Réponds en français. 用中文也可以。"},
                  {"role": "user", "content": "Ça va? 😀 — \"quotes\", tabs\tand\nnewlines; <b>tags</b> & \\backslash"}]},
    {"name": "reasoning content in history", "families": ["qwen3"],
     "messages": [{"role": "user", "content": "What is 6 * 7?"},
                  {"role": "assistant", "reasoning_content": "6 times 7 is 42.", "content": "42"},
                  {"role": "user", "content": "And 6 * 8?"},
                  {"role": "assistant", "reasoning_content": "6 * 8 = 48.", "content": "48"}]},
    {"name": "inline think tags in content", "families": ["qwen3"], "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "<think>\nThe user wants a greeting.\n</think>\n\nHi!"},
                  {"role": "user", "content": "Again."}]},
    {"name": "thinking disabled", "families": ["qwen3"], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": False},
     "messages": [{"role": "user", "content": "Quick: capital of Japan?"}]},
    {"name": "thinking enabled explicitly", "families": ["qwen3"], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": True},
     "messages": [{"role": "user", "content": "Quick: capital of Japan?"}]},
    {"name": "tools in system message with a date", "families": ["llama3.1"], "add_generation_prompt": True,
     "tools": [WEATHER], "kwargs": {"tools_in_user_message": False, "date_string": "21 Nov 2026"},
     "messages": [{"role": "system", "content": "  You are helpful.  "},
                  {"role": "user", "content": "Weather in Lima?"}]},
    {"name": "ipython tool result", "families": ["llama3.1"], "tools": [WEATHER], "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Weather in Lima?"},
                  {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Lima"})]},
                  {"role": "ipython", "content": {"temperature": 18, "sky": "overcast"}}]},
    {"name": "tools but no user message", "families": ["llama3.1"], "tools": [WEATHER],
     "messages": [{"role": "system", "content": "Only a system prompt."}]},
]

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Zürich, São Paulo, Kraków, İstanbul — naïve café résumé",
    "中文分词测试：今天天气很好。",
    "日本語のテキストと한국어 텍스트",
    "emoji 😀🚀👩‍👩‍👧 and symbols ∑∫√≠≤",
    "def f(x):\n\treturn x ** 2  # square\n\n\nprint(f(12))",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<think>\nreasoning\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "numbers 3.14159 1e-10 -42 0x1F 1,000,000",
    "\n\n\n   \t \r\n mixed whitespace",
    "'s 're 've 'm 'll 'd don't I'M",
    "",
]
