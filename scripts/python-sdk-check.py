#!/usr/bin/env python3
# Drives a running ooze gateway session with the official Python SDKs — `openai` (chat completions
# and the Responses API, plain, streamed, a tool call round trip) and `anthropic` (messages, plain,
# streamed, a tool_use round trip) — and checks the shapes they parse. Not part of `npm test`.
#
# Usually run through its launcher, which starts a gateway in front of a scripted fake engine and
# queues the answers this script expects, in this script's order:
#     node --import tsx scripts/python-sdk-check.ts [--python .venv/bin/python]
# Against any gateway session (a real engine: the text is the model's, so the tool round trips are
# skipped when it writes no call):
#     OPENAI_BASE_URL=http://HOST:PORT/s/<session>/v1 ANTHROPIC_BASE_URL=http://HOST:PORT/s/<session> \
#     OOZE_API_KEY=<key> OOZE_MODEL=ooze .venv/bin/python scripts/python-sdk-check.py [--scripted]
# Needs `pip install openai anthropic`. Prints one line per check; exits 1 at the first failure.
import json
import os
import sys

import anthropic
import openai

SCRIPTED = "--scripted" in sys.argv
MODEL = os.environ.get("OOZE_MODEL", "ooze")
KEY = os.environ.get("OOZE_API_KEY") or os.environ["OPENAI_API_KEY"]
oa = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=KEY, max_retries=0)
an = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=KEY, max_retries=0)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def short(text):
    return json.dumps(text if len(text) <= 60 else text[:60] + "…")


# --- openai: chat completions ---------------------------------------------------------------------
r = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}])
check("openai chat.completions.create", r.object == "chat.completion" and r.usage.completion_tokens > 0, short(r.choices[0].message.content))

chunks = list(oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count."}], stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("openai chat.completions stream", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, f"{len(chunks)} chunks, {short(text)}")

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": WEATHER}}]
messages = [{"role": "user", "content": "Weather in Paris?"}]
r = oa.chat.completions.create(model=MODEL, messages=messages, tools=tools)
m = r.choices[0].message
if m.tool_calls:
    call = m.tool_calls[0]
    check("openai chat tool call", call.function.name == "get_weather" and "city" in json.loads(call.function.arguments), call.function.arguments)
    messages += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r = oa.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    check("openai chat tool result answered", r.choices[0].finish_reason in ("stop", "length"), short(r.choices[0].message.content))
else:
    check("openai chat tool call", not SCRIPTED, "the model wrote no call")

# --- openai: Responses API ------------------------------------------------------------------------
r = oa.responses.create(model=MODEL, instructions="Be brief.", input="Say hi.")
check("openai responses.create", r.object == "response" and r.status in ("completed", "incomplete") and r.usage.output_tokens > 0, short(r.output_text))

events = list(oa.responses.create(model=MODEL, input="Count.", stream=True))
seqs = [e.sequence_number for e in events]
done = [e for e in events if e.type == "response.completed"]
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check(
    "openai responses stream",
    seqs == list(range(len(events))) and events[0].type == "response.created" and len(done) == 1 and done[0].response.output_text == deltas,
    f"{len(events)} events, {short(deltas)}",
)
with oa.responses.stream(model=MODEL, input="Count again.") as s:
    for _ in s:
        pass
    final = s.get_final_response()
check("openai responses.stream helper", final.status == "completed", short(final.output_text))

rtools = [{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": WEATHER, "strict": True}]
r1 = oa.responses.create(model=MODEL, input="Weather in Paris?", tools=rtools)
calls = [o for o in r1.output if o.type == "function_call"]
if calls:
    check("openai responses function_call", calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), calls[0].arguments)
    r2 = oa.responses.create(
        model=MODEL, previous_response_id=r1.id, tools=rtools, input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}]
    )
    check("openai responses previous_response_id + function_call_output", r2.previous_response_id == r1.id and r2.status == "completed", short(r2.output_text))
else:
    check("openai responses function_call", not SCRIPTED, "the model wrote no call")

try:
    oa.responses.create(model=MODEL, input="Search the web.", tools=[{"type": "web_search"}])
    check("openai responses web_search refused", False, "it was accepted")
except openai.BadRequestError as e:
    check("openai responses web_search refused", e.status_code == 400 and e.body.get("param") == "tools[0].type", e.body.get("message", ""))

# --- anthropic: messages --------------------------------------------------------------------------
r = an.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Say hi."}])
check("anthropic messages.create", r.type == "message" and r.usage.output_tokens > 0, short("".join(b.text for b in r.content if b.type == "text")))

with an.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Count."}]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("anthropic messages.stream", final.stop_reason in ("end_turn", "max_tokens") and streamed == "".join(b.text for b in final.content if b.type == "text"), short(streamed))

atools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER}]
amsgs = [{"role": "user", "content": "Weather in Paris?"}]
r = an.messages.create(model=MODEL, max_tokens=128, messages=amsgs, tools=atools)
uses = [b for b in r.content if b.type == "tool_use"]
if uses:
    check("anthropic tool_use", r.stop_reason == "tool_use" and uses[0].name == "get_weather" and "city" in uses[0].input, json.dumps(uses[0].input))
    amsgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 21 C"}]},
    ]
    r = an.messages.create(model=MODEL, max_tokens=128, messages=amsgs, tools=atools)
    check("anthropic tool_result answered", r.stop_reason in ("end_turn", "max_tokens"), short("".join(b.text for b in r.content if b.type == "text")))
else:
    check("anthropic tool_use", not SCRIPTED, "the model wrote no call")

print(f"all checks passed (openai {openai.__version__}, anthropic {anthropic.__version__})")
