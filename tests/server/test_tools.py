"""Tool calling with the real model through the official clients: openai's full loop (tools ->
tool call -> tool result -> answer), streamed and not, ollama's the same, every call's
arguments validated against the tool's schema, and 400s for malformed tools. The model's own
template has no tool support (the generic JSON format); a second server runs it with Qwen
2.5's template (`--chat-template`), whose `<tool_call>` format the server then reads."""
import json
import os
import tempfile
import unittest

import jsonschema
import ollama
from ollama import _types as ollama_types
import openai

from common import BASE, MODEL, QUARREL_BIN, raw
from serving import start

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                                    "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

QUESTIONS = [
    "What is the weather in Paris?",
    "How warm is it in Tokyo right now, in celsius?",
    "What is 17 plus 25?",
    "Add 3 and 4 for me.",
    "Is it raining in London?",
]


def fake_tool(name, args):
    if name == "get_weather":
        return json.dumps({"city": args["city"], "temperature": 21, "unit": args.get("unit", "celsius"), "sky": "clear"})
    return json.dumps({"sum": args["a"] + args["b"]})


class ToolCalls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
        cls.o = ollama.Client(host=BASE)

    def check_call(self, name, arguments, schemas=SCHEMAS):
        self.assertIn(name, schemas)
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        jsonschema.validate(args, schemas[name])
        return args

    def test_openai_loop(self):
        for q in QUESTIONS:
            with self.subTest(question=q):
                messages = [{"role": "user", "content": q}]
                r = self.c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                                   max_tokens=200, temperature=0)
                ch = r.choices[0]
                self.assertEqual(ch.finish_reason, "tool_calls")
                self.assertTrue(ch.message.tool_calls)
                messages.append(ch.message.model_dump(exclude_none=True))
                for call in ch.message.tool_calls:
                    self.assertEqual(call.type, "function")
                    self.assertTrue(call.id)
                    args = self.check_call(call.function.name, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": fake_tool(call.function.name, args)})
                # the result goes back; the model may answer or call again, either well formed
                r = self.c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120, temperature=0)
                ch = r.choices[0]
                if ch.message.tool_calls:
                    self.assertEqual(ch.finish_reason, "tool_calls")
                    for call in ch.message.tool_calls:
                        self.check_call(call.function.name, call.function.arguments)
                else:
                    self.assertIn(ch.finish_reason, ("stop", "length"))
                    self.assertTrue(ch.message.content)
                # and with tool_choice none the answer is text
                r = self.c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                                   max_tokens=60, temperature=0)
                self.assertFalse(r.choices[0].message.tool_calls)
                self.assertTrue(r.choices[0].message.content)

    def test_openai_stream_matches_whole(self):
        for q in QUESTIONS[:3]:
            with self.subTest(question=q):
                kw = dict(model=MODEL, messages=[{"role": "user", "content": q}], tools=TOOLS, tool_choice="required",
                          max_tokens=200, temperature=0)
                whole = self.c.chat.completions.create(**kw).choices[0]
                calls, finish = {}, None
                for chunk in self.c.chat.completions.create(stream=True, **kw):
                    if not chunk.choices:
                        continue
                    d = chunk.choices[0].delta
                    for tc in d.tool_calls or []:
                        c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                        c["id"] = tc.id or c["id"]
                        if tc.function and tc.function.name:
                            c["name"] += tc.function.name
                        if tc.function and tc.function.arguments:
                            c["arguments"] += tc.function.arguments
                    finish = chunk.choices[0].finish_reason or finish
                self.assertEqual(finish, "tool_calls")
                got = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
                want = [(t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls]
                self.assertEqual(got, want)
                self.assertTrue(all(c["id"] for c in calls.values()))

    def test_openai_named_and_auto(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there!"}], tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=100, temperature=0)
        calls = r.choices[0].message.tool_calls
        self.assertEqual([c.function.name for c in calls], ["add"])
        self.check_call("add", calls[0].function.arguments)
        # auto: an answer or calls, never both unparsed; streamed text equals the whole text
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "Say hello in one sentence."}], tools=TOOLS,
                  max_tokens=80, temperature=0)
        whole = self.c.chat.completions.create(**kw).choices[0]
        if whole.message.tool_calls:
            for c in whole.message.tool_calls:
                self.check_call(c.function.name, c.function.arguments)
        else:
            text = "".join(ch.choices[0].delta.content or "" for ch in self.c.chat.completions.create(stream=True, **kw) if ch.choices)
            self.assertEqual(text, whole.message.content)
            self.assertNotIn('{"response"', text)

    def test_single_call_when_parallel_is_off(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome and in Oslo?"}],
                                           tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0)
        self.assertEqual(len(r.choices[0].message.tool_calls), 1)

    def test_ollama_loop(self):
        # the ollama client sends a reduced schema (no additionalProperties, no maxLength): the
        # calls follow what it sent
        sent = {t["function"]["name"]: ollama_types.Tool.model_validate(t).model_dump(exclude_none=True)["function"]["parameters"]
                for t in TOOLS}
        for q in QUESTIONS[:3]:
            with self.subTest(question=q):
                messages = [{"role": "user", "content": q}]
                r = self.o.chat(model=MODEL, messages=messages, tools=TOOLS, options={"temperature": 0, "num_predict": 200})
                messages.append(r.message)
                for call in r.message.tool_calls or []:
                    args = self.check_call(call.function.name, call.function.arguments, sent)
                    messages.append({"role": "tool", "content": fake_tool(call.function.name, args), "tool_name": call.function.name})
                r2 = self.o.chat(model=MODEL, messages=messages, tools=TOOLS, options={"temperature": 0, "num_predict": 120})
                self.assertTrue(r2.message.content or r2.message.tool_calls)
                # streamed: the same calls arrive in a chunk
                streamed = [c for c in self.o.chat(model=MODEL, messages=messages[:1], tools=TOOLS, stream=True,
                                                   options={"temperature": 0, "num_predict": 200})]
                calls = [tc for c in streamed for tc in (c.message.tool_calls or [])]
                self.assertEqual([(c.function.name, dict(c.function.arguments)) for c in calls],
                                 [(c.function.name, dict(c.function.arguments)) for c in (r.message.tool_calls or [])])
                self.assertTrue(streamed[-1].done)

    def test_template_route_shows_the_tools(self):
        status, _, body = raw("POST", "/apply-template", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
        self.assertEqual(status, 200, body)
        self.assertIn("get_weather", body["prompt"])

    def test_bad_tools_are_400(self):
        msgs = [{"role": "user", "content": "hi"}]
        for extra in [
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            {"tools": [WEATHER, WEATHER]},
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
            {"tools": TOOLS, "tool_choice": "always"},
            {"tool_choice": "required"},
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}}],
             "tool_choice": "required"},
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {}}]}]},
        ]:
            with self.subTest(extra=extra):
                body = {"model": MODEL, "messages": msgs, "max_tokens": 5, **extra}
                status, _, err = raw("POST", "/v1/chat/completions", body)
                self.assertEqual(status, 400, err)
                self.assertIn("message", err["error"])
        # and the server still answers
        status, _, ok = raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 5})
        self.assertEqual(status, 200, ok)


class HermesTemplate(unittest.TestCase):
    """The Hermes / Qwen format end to end: tools rendered by the template, calls forced by a
    grammar that writes <tool_call> blocks, parsed back into tool_calls."""

    @classmethod
    def setUpClass(cls):
        data = os.environ.get("QUARREL_TESTDATA")
        if not data:
            raise unittest.SkipTest("QUARREL_TESTDATA is not set (scripts/test.sh sets it)")
        cls.template = os.path.join(data, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
        cls.log = tempfile.NamedTemporaryFile(prefix="quarrel-hermes-", suffix=".log", delete=False).name
        cls.proc, cls.base = start(QUARREL_BIN, ["--chat-template", cls.template, "-t", "1", "--kv-seqs", "2"], cls.log)
        cls.c = openai.OpenAI(base_url=cls.base + "/v1", api_key="unused", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(30)

    def test_template_renders_the_tools(self):
        status, _, body = raw("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}, base=self.base)
        self.assertEqual(status, 200, body)
        self.assertIn("<tools>", body["prompt"])
        self.assertIn('"name": "get_weather"', body["prompt"])

    def test_forced_calls_come_back_as_tool_calls(self):
        for q in QUESTIONS[:3]:
            with self.subTest(question=q):
                messages = [{"role": "user", "content": q}]
                r = self.c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                                   max_tokens=200, temperature=0)
                ch = r.choices[0]
                self.assertEqual(ch.finish_reason, "tool_calls", ch.message)
                self.assertIsNone(ch.message.content)
                for call in ch.message.tool_calls:
                    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
                # the call and its result render in Qwen's format for the next turn
                messages.append(ch.message.model_dump(exclude_none=True))
                messages += [{"role": "tool", "tool_call_id": c.id, "content": fake_tool(c.function.name, json.loads(c.function.arguments))}
                             for c in ch.message.tool_calls]
                status, _, body = raw("POST", "/apply-template", {"messages": messages, "tools": TOOLS}, base=self.base)
                self.assertEqual(status, 200, body)
                self.assertIn("<tool_call>\n{\"name\": \"" + ch.message.tool_calls[0].function.name, body["prompt"])
                self.assertIn("<tool_response>", body["prompt"])
                r = self.c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=60, temperature=0)
                self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))

    def test_bad_template_file_is_refused_at_start(self):
        bad = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
        bad.write("{% for m in messages %}{{ m.content }")
        bad.close()
        out = __import__("subprocess").run([QUARREL_BIN, "run", "--chat-template", bad.name, "-n", "1", "-p", "hi"],
                                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("chat template", out.stderr)


if __name__ == "__main__":
    unittest.main()
