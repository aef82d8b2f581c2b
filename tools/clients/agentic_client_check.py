#!/usr/bin/env python3
"""Drives `fp4forge serve` on the scripted Laguna agent with real agent clients: the official
`openai` package and LangChain (`langchain-openai`).

Usage: agentic_client_check.py tools BASE_URL MODEL
       agentic_client_check.py structured BASE_URL MODEL

`tools`: the server runs `crates/server/examples/script_model.rs`'s model (greedy output: it thinks
"Paris is a city.", says "Checking." and calls get_weather(city="Paris")) with the real
Laguna-S-2.1 chat template and `--enable-auto-tool-choice --tool-call-parser poolside_v1
--reasoning-parser poolside_v1`. Checks, each printed as PASS/FAIL (exit 1 if any fails):
  * openai: chat.completions with tools= -> message.tool_calls (id, function name, arguments
    that json.loads to {"city": "Paris"}), finish_reason "tool_calls", reasoning_content;
  * openai, streamed: the SDK's chunks rebuild the same call (index, id and name in the first
    tool-call delta, argument fragments after), content without markup, reasoning deltas;
  * openai: the next turn carrying the assistant's tool_calls and a tool message is accepted;
    thinking off (extra_body chat_template_kwargs) gives no reasoning;
  * LangChain: ChatOpenAI.bind_tools([get_weather]).invoke(...) -> AIMessage.tool_calls with
    args {"city": "Paris"}; the ToolMessage round trip.

`structured`: the server runs the tiny random model (examples/tiny_model.rs; a byte-level
vocabulary, so any JSON can be spelled) and structured output constrains what it writes:
  * openai: chat.completions.parse with a pydantic model -> message.parsed is an instance;
  * LangChain: with_structured_output(Model) by json_schema and by function calling (a named
    tool_choice) -> instances of the model.
"""

import json
import sys
import traceback

import openai

MODE = sys.argv[1]
BASE = sys.argv[2]
MODEL = sys.argv[3]
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
RESULTS = []

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def check(name, mode):
    def wrap(fn):
        if mode != MODE:
            return fn
        try:
            detail = fn()
            RESULTS.append((name, True, detail or ""))
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            RESULTS.append((name, False, f"{type(e).__name__}: {e}"))
            traceback.print_exc()
        return fn

    return wrap


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


@check("openai: tool call and reasoning", "tools")
def _():
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0)
    c = r.choices[0]
    calls = c.message.tool_calls
    expect(calls and len(calls) == 1, f"one tool call: {c.message}")
    expect(calls[0].function.name == "get_weather", calls[0])
    expect(json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls[0])
    expect(calls[0].id.startswith("chatcmpl-tool-"), calls[0].id)
    expect(c.finish_reason == "tool_calls", c.finish_reason)
    expect(c.message.content == "Checking.", c.message.content)
    reasoning = (c.message.model_extra or {}).get("reasoning_content")
    expect(reasoning == "Paris is a city.", reasoning)
    return f"{calls[0].function.name}({calls[0].function.arguments})"


@check("openai: streamed tool call", "tools")
def _():
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=0, stream=True
    )
    content, reasoning, finish = "", "", None
    calls = {}
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for t in d.tool_calls or []:
            call = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
            if t.id:
                expect(call["id"] is None, "the id comes once")
                call["id"] = t.id
            if t.function and t.function.name:
                call["name"] += t.function.name
            if t.function and t.function.arguments:
                call["arguments"] += t.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    expect(list(calls) == [0], calls)
    expect(calls[0]["name"] == "get_weather" and calls[0]["id"], calls)
    expect(json.loads(calls[0]["arguments"]) == {"city": "Paris"}, calls)
    expect(content == "Checking." and "<" not in content, content)
    expect(reasoning == "Paris is a city.", reasoning)
    expect(finish == "tool_calls", finish)
    return f"{len(calls)} call, {len(content)} content chars"


@check("openai: next turn with the tool result; thinking off", "tools")
def _():
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 3})},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0
    )
    expect(second.usage.prompt_tokens > first.usage.prompt_tokens, "the history is rendered")
    off = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    expect(not (off.choices[0].message.model_extra or {}).get("reasoning_content"), off)
    expect(off.choices[0].message.tool_calls[0].function.name == "get_weather", off)
    return f"prompt {first.usage.prompt_tokens} -> {second.usage.prompt_tokens} tokens"


@check("langchain: bind_tools and a ToolMessage round trip", "tools")
def _():
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"3 degrees in {city}"

    llm = ChatOpenAI(base_url=BASE, api_key="unused", model=MODEL, temperature=0, max_retries=0)
    bound = llm.bind_tools([get_weather])
    msgs = [HumanMessage("What's the weather in Paris?")]
    ai = bound.invoke(msgs)
    expect(len(ai.tool_calls) == 1, ai)
    tc = ai.tool_calls[0]
    expect(tc["name"] == "get_weather" and tc["args"] == {"city": "Paris"}, tc)
    result = get_weather.invoke(tc["args"])
    msgs += [ai, ToolMessage(result, tool_call_id=tc["id"])]
    again = bound.invoke(msgs)
    expect(again.tool_calls or again.content is not None, again)
    return f"{tc['name']}({tc['args']})"


def weather_model():
    from typing import Literal

    from pydantic import BaseModel

    class Weather(BaseModel):
        city: Literal["Paris", "Rome", "Oslo"]
        sunny: bool

    return Weather


@check("openai: chat.completions.parse with a pydantic model", "structured")
def _():
    weather = weather_model()
    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "The weather in Paris, as JSON."}],
        response_format=weather,
        temperature=0,
        max_tokens=64,
    )
    parsed = r.choices[0].message.parsed
    expect(isinstance(parsed, weather), r)
    return repr(parsed)


@check("langchain: with_structured_output (json_schema and function calling)", "structured")
def _():
    from langchain_openai import ChatOpenAI

    weather = weather_model()
    llm = ChatOpenAI(
        base_url=BASE, api_key="unused", model=MODEL, temperature=0, max_tokens=64, max_retries=0
    )
    out = []
    for method in ["json_schema", "function_calling"]:
        result = llm.with_structured_output(weather, method=method).invoke(
            "The weather in Rome, as JSON."
        )
        expect(isinstance(result, weather), f"{method}: {result!r}")
        out.append(f"{method}: {result!r}")
    return "; ".join(out)


failed = 0
for name, ok, detail in RESULTS:
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
    failed += not ok
print(f"{len(RESULTS) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
