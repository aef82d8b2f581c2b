#!/usr/bin/env python3
"""Drives a running `fp4forge serve` with the official `openai` Python package.

Usage: openai_client_check.py BASE_URL [MODEL]

Checks, each printed as PASS/FAIL (exit status 1 if any fails):
  * models.list() names the served model;
  * chat.completions (plain): an assistant message, usage, logprobs with top_logprobs;
  * chat.completions (stream): the role delta first, content deltas that spell the plain
    answer (greedy), a finish reason, a final usage chunk (stream_options.include_usage);
  * completions with echo + logprobs + max_tokens=0 (lm-evaluation-harness's scoring call):
    the prompt echoed, one entry per prompt token, null first logprob, top_logprobs objects,
    text_offset in characters consistent with the token texts;
  * completions with generation: logprobs of greedy tokens are the top ones; a stop string
    cuts the text; streaming gives the same text;
  * token-id prompts and a batch of prompts;
  * errors surface as the SDK's exceptions (unknown model -> NotFoundError, bad max_tokens ->
    BadRequestError) and the server keeps serving.
"""

import sys
import traceback

import openai

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=300)
RESULTS = []


def check(name):
    def wrap(fn):
        try:
            detail = fn()
            RESULTS.append((name, True, detail or ""))
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            RESULTS.append((name, False, f"{type(e).__name__}: {e}"))
            traceback.print_exc()
        return fn

    return wrap


models = client.models.list().data
MODEL = sys.argv[2] if len(sys.argv) > 2 else models[0].id


@check("models.list")
def _():
    ids = [m.id for m in models]
    assert MODEL in ids, ids
    return f"{ids}"


MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours."},
]
PLAIN = {}


@check("chat.completions")
def _():
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content, c
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    lp = c.logprobs.content
    # One entry per generated token (a final EOS has no text).
    assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage.completion_tokens)
    assert "".join(t.token for t in lp) == c.message.content
    for t in lp:
        assert len(t.top_logprobs) == 3
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6, "greedy takes the top token"
    PLAIN["chat"] = c.message.content
    return repr(c.message.content[:60])


@check("chat.completions stream")
def _():
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(
        ch.choices[0].delta.content or "" for ch in chunks if ch.choices
    )
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("stop", "length"), finishes
    assert chunks[-1].usage is not None and not chunks[-1].choices, chunks[-1]
    assert chunks[-1].usage.completion_tokens > 0
    if "chat" in PLAIN:
        assert text == PLAIN["chat"], (text, PLAIN["chat"])
    return f"{len(chunks)} chunks, usage {chunks[-1].usage.completion_tokens} tokens"


PROMPT = "The capital of France is Paris. The capital of Italy is"


@check("completions echo + logprobs (max_tokens=0)")
def _():
    r = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=3, temperature=0,
    )
    c = r.choices[0]
    assert c.text == PROMPT, c.text
    lp = c.logprobs
    n = r.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert all(isinstance(d, dict) and 3 <= len(d) <= 4 for d in lp.top_logprobs[1:])
    offset = 0
    for tok, off in zip(lp.tokens, lp.text_offset):
        assert off == offset, (tok, off, offset)
        offset += len(tok)
    assert "".join(lp.tokens) == PROMPT
    return f"{n} prompt tokens, sum logprob {sum(lp.token_logprobs[1:]):.4f}"


@check("completions generate + logprobs + stop + stream")
def _():
    r = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, logprobs=2, temperature=0,
    )
    c = r.choices[0]
    for tok_lp, top in zip(c.logprobs.token_logprobs, c.logprobs.top_logprobs):
        assert abs(tok_lp - max(top.values())) < 1e-6, (tok_lp, top)
    text = c.text
    s = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
    )
    streamed = "".join(ch.choices[0].text for ch in s if ch.choices)
    assert streamed == text, (streamed, text)
    # A stop string taken from the greedy text cuts it there.
    stop = next((text[i:i + 2] for i in range(1, len(text) - 1)
                 if text[i:i + 2].strip() and text[i:i + 2].isprintable()), None)
    if stop:
        cut = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
        ).choices[0]
        assert cut.text == text[: text.find(stop)], (cut.text, text, stop)
        assert cut.finish_reason == "stop"
    return repr(text[:60])


@check("completions token ids and batches")
def _():
    ids = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0,
    ).usage.prompt_tokens
    one = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    batch = client.completions.create(
        model=MODEL, prompt=[PROMPT, "One, two, three,"], max_tokens=8, temperature=0,
    )
    assert len(batch.choices) == 2
    assert sorted(c.index for c in batch.choices) == [0, 1]
    assert batch.choices[0].text == one.choices[0].text
    return f"{ids} prompt tokens; batch of 2"


@check("errors")
def _():
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert "does not exist" in str(e)
    try:
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)
        raise AssertionError("negative max_tokens accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "max_tokens", e.body
    try:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=3)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert "messages" in str(e)
    r = client.completions.create(model=MODEL, prompt="still serving", max_tokens=2)
    assert r.choices
    return "NotFoundError, BadRequestError x2, then served"


failed = [r for r in RESULTS if not r[1]]
for name, ok, detail in RESULTS:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
print(f"openai {openai.__version__} against {BASE} model {MODEL}: "
      f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
