#!/usr/bin/env python3
"""Golden chat-template renders made by transformers' own renderer.

For every template in ../shared/data/chat-templates/ (copied next to the renders, so the tests do
not depend on the shared folder) and every conversation below, renders with
`transformers.utils.chat_template_utils.render_jinja_template` (what `apply_chat_template(...,
tokenize=False)` calls) and writes crates/engine/tests/fixtures/chat_templates/renders.json:
one case per (template, conversation) with the inputs and either the rendered text or the
template's error. `strftime_now` is pinned to 2026-01-15 so renders are reproducible; the Rust test
pins the same date.

Needs only transformers (pinned in requirements.txt) and jinja2, no torch:
    python -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install transformers==5.17.0 jinja2==3.1.6
    /tmp/tvenv/bin/python tools/reference/make_chat_template_fixtures.py
"""
import datetime
import json
import pathlib
import shutil

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT.parent / "shared" / "data" / "chat-templates"
OUT = ROOT / "crates" / "engine" / "tests" / "fixtures" / "chat_templates"
FIXED_NOW = datetime.datetime(2026, 1, 15, 9, 30, 0)


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = _FixedDatetime

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Returns <temperature> & conditions.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_code",
        "description": "Search the repository.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "number"},
                "regex": {"type": "boolean"},
                "paths": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "What's the weather in Zürich? Answer in \"celsius\"."}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": 2}},
        }
    ],
}
TOOL = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 3.5, \"sky\": \"<cloudy>\"}"}
ANSWER = {"role": "assistant", "content": "It is 3.5 °C and cloudy in Zürich."}
REASONED = {
    "role": "assistant",
    "reasoning_content": "The user wants the weather; I already have it.",
    "content": "It is 3.5 °C and cloudy.",
}
TWO_CALLS = {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "search_code", "arguments": {"query": "fn main", "max_results": 5, "regex": False, "paths": ["src/", "tests/"]}}},
        {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ],
}

CASES = {
    "user_only": dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True),
    "system_user": dict(messages=[SYSTEM, USER], add_generation_prompt=True),
    "no_generation_prompt": dict(messages=[SYSTEM, USER, ANSWER]),
    "multi_turn": dict(messages=[SYSTEM, USER, ANSWER, {"role": "user", "content": "And tomorrow?"}], add_generation_prompt=True),
    "tools": dict(messages=[SYSTEM, USER], tools=[WEATHER, SEARCH], add_generation_prompt=True),
    "tool_round_trip": dict(messages=[SYSTEM, USER, CALL, TOOL], tools=[WEATHER, SEARCH], add_generation_prompt=True),
    "tool_round_trip_answered": dict(messages=[USER, CALL, TOOL, ANSWER], tools=[WEATHER]),
    "two_tool_calls": dict(messages=[USER, TWO_CALLS], tools=[WEATHER, SEARCH]),
    "reasoning_history": dict(messages=[USER, REASONED, {"role": "user", "content": "Thanks. Tomorrow?"}], add_generation_prompt=True),
    "thinking_off": dict(messages=[SYSTEM, USER], add_generation_prompt=True, kwargs={"enable_thinking": False}),
    "preserve_thinking": dict(messages=[USER, REASONED, {"role": "user", "content": "More?"}], add_generation_prompt=True, kwargs={"preserve_thinking": True, "enable_thinking": False}),
    "continue_final_message": dict(messages=[USER, {"role": "assistant", "content": "The weather in Zürich is"}], continue_final_message=True),
    "empty_system": dict(messages=[{"role": "system", "content": ""}, USER], add_generation_prompt=True),
    "documents": dict(messages=[USER], documents=[{"title": "Forecast", "text": "Snow on Friday."}], add_generation_prompt=True),
}

BOS, EOS = "<s>", "</s>"


def render(source, case):
    try:
        out, _ = ctu.render_jinja_template(
            conversations=[case["messages"]],
            tools=case.get("tools"),
            documents=case.get("documents"),
            chat_template=source,
            continue_final_message=case.get("continue_final_message", False),
            add_generation_prompt=case.get("add_generation_prompt", False),
            bos_token=BOS,
            eos_token=EOS,
            **case.get("kwargs", {}),
        )
        return {"rendered": out[0]}
    except (jinja2.exceptions.TemplateError, ValueError, TypeError) as e:
        return {"error": str(e)}


def main():
    (OUT / "templates").mkdir(parents=True, exist_ok=True)
    cases = []
    for path in sorted(SRC.glob("*.jinja")):
        shutil.copyfile(path, OUT / "templates" / path.name)
        source = path.read_text()
        for name, case in CASES.items():
            entry = {
                "template": path.name,
                "case": name,
                "messages": case["messages"],
                "tools": case.get("tools"),
                "documents": case.get("documents"),
                "add_generation_prompt": case.get("add_generation_prompt", False),
                "continue_final_message": case.get("continue_final_message", False),
                "kwargs": case.get("kwargs", {}),
            }
            entry.update(render(source, case))
            cases.append(entry)
    meta = {
        "made_by": "tools/reference/make_chat_template_fixtures.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "bos_token": BOS,
        "eos_token": EOS,
        "now": FIXED_NOW.isoformat(),
        "cases": cases,
    }
    (OUT / "renders.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} template errors) -> {OUT / 'renders.json'}")


if __name__ == "__main__":
    main()
