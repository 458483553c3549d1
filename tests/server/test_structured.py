"""Structured output with the real model: JSON schemas through the official openai and
ollama clients (every output validated by `jsonschema`), JSON mode, llama.cpp-style GBNF
grammars, regexes, and 400s with reasons for bad schemas and grammars."""
import json
import os
import re
import unittest

import jsonschema
import ollama
import openai

import gbnf_check
from common import BASE, MODEL, raw

# nested objects, arrays with bounds, enums, numbers with ranges, string patterns, optional fields
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}},
     "required": ["color", "hex"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 2, "maxItems": 4}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "first": {"type": "string", "maxLength": 20}, "last": {"type": "string", "maxLength": 20}},
        "required": ["first", "last"], "additionalProperties": False},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
     "required": ["person", "address"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                      "subtitle": {"type": "string", "maxLength": 40}},
     "required": ["title", "year"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                                "required": ["x", "y"], "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"answer": {"type": "boolean"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"},
                                      "tags": {"type": "array", "items": {"enum": ["new", "vip", "old"]}, "maxItems": 3}},
     "required": ["email"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 10}, "text": {"type": "string", "maxLength": 40}}, "required": ["n", "text"], "additionalProperties": False},
        "minItems": 1, "maxItems": 3}, "done": {"type": "boolean"}},
     "required": ["steps"], "additionalProperties": False},
]

PROMPTS = [
    "Describe a person as JSON.",
    "Give me an example answer in JSON.",
    "Reply with JSON about your favourite thing.",
    "Make up some data. Answer only with JSON.",
    "What is the weather like? Use JSON.",
]

# llama.cpp's grammar format, with what its sample grammars use (comments, multi-line
# rules, escapes, empty alternatives, bounded repetition, camelCase names)
ARITH_GBNF = r"""
root  ::= (expr "=" ws term "\n"){1,3}
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]{0,5} ws
num   ::= [0-9]{1,4} ws
ws    ::= | " "
"""
LIST_GBNF = r"""
root ::= listItem{2,4}
# excludes line breaks
listItem ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]{1,30} "\n"
"""


# llama.cpp's sample grammars (scripts/fetch-testdata.sh) with prompts that suit them
SAMPLE_GRAMMARS = {
    "json": ["Describe a cat as JSON.", "Give a JSON object for a book.", "A JSON record of a city."],
    "json_arr": ["List three fruits as a JSON array.", "Give a JSON array of numbers.", "Colors as a JSON list."],
    "list": ["List three things to pack for a trip.", "Name some animals.", "Steps to make tea."],
    "arithmetic": ["Write a sum.", "Give an equation.", "Compute something."],
    "c": ["Write a C function that adds two numbers.", "Write a small C program.", "A C function returning 0."],
    "chess": ["Play a chess opening.", "Give some chess moves.", "Start a chess game."],
    "english": ["Write a sentence about the sea.", "Describe the weather.", "Say something nice."],
    "japanese": ["Say hello in Japanese.", "Write Japanese text.", "A Japanese greeting."],
}


class StructuredOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
        cls.o = ollama.Client(host=BASE)

    def chat_json(self, schema, prompt, **kw):
        rf = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], response_format=rf,
                                           max_tokens=300, temperature=0, **kw)
        return r.choices[0]

    def test_schemas_validate_through_openai(self):
        for i, schema in enumerate(SCHEMAS):
            for p in PROMPTS:
                with self.subTest(schema=i, prompt=p):
                    ch = self.chat_json(schema, p)
                    self.assertEqual(ch.finish_reason, "stop", ch.message.content)
                    jsonschema.validate(json.loads(ch.message.content), schema)

    def test_schemas_validate_through_ollama(self):
        for i, schema in enumerate(SCHEMAS):
            for p in PROMPTS:
                with self.subTest(schema=i, prompt=p):
                    r = self.o.chat(model=MODEL, messages=[{"role": "user", "content": p}], format=schema,
                                    options={"temperature": 0, "num_predict": 300})
                    self.assertEqual(r.done_reason, "stop", r.message.content)
                    jsonschema.validate(json.loads(r.message.content), schema)

    def test_sampled_and_streamed_outputs_validate(self):
        schema = SCHEMAS[4]
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        for seed in range(4):
            chunks = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], response_format=rf,
                                                    max_tokens=300, temperature=1.0, seed=seed, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            jsonschema.validate(json.loads(text), schema)
        # several constrained sequences in one batch, with different schemas
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], response_format=rf,
                                           max_tokens=300, temperature=0.8, n=4, seed=9)
        for ch in r.choices:
            jsonschema.validate(json.loads(ch.message.content), schema)

    def test_llama_cpp_sample_grammars(self):
        # every output is a sentence of the grammar (the start of one when the length limit cut
        # it), checked by an independent GBNF recognizer
        data = os.environ.get("QUARREL_TESTDATA")
        if not data:
            self.skipTest("QUARREL_TESTDATA is not set (scripts/test.sh sets it)")
        ends = {True: 0, False: 0}
        for name, prompts in SAMPLE_GRAMMARS.items():
            grammar = open(os.path.join(data, "grammars", name + ".gbnf"), encoding="utf-8").read()
            for p in prompts:
                with self.subTest(grammar=name, prompt=p):
                    r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=160,
                                                       temperature=0, extra_body={"grammar": grammar})
                    ch = r.choices[0]
                    self.assertIn(ch.finish_reason, ("stop", "length"))
                    whole = ch.finish_reason == "stop"
                    # a cut may fall inside a character: its bytes so far are written as U+FFFD
                    text = ch.message.content if whole else ch.message.content.rstrip("\ufffd")
                    self.assertTrue(gbnf_check.accepts(grammar, text, prefix=not whole), repr(ch.message.content))
                    ends[whole] += 1
        print(f"\nllama.cpp sample grammars: {ends[True]} outputs complete, {ends[False]} cut by max_tokens, all valid")

    def test_json_mode(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "List two fruits as JSON."}],
                                           response_format={"type": "json_object"}, max_tokens=200, temperature=0)
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            self.assertIsInstance(json.loads(ch.message.content), dict)
        else:
            self.assertTrue(ch.message.content.startswith("{"), ch.message.content)
        g = self.o.generate(model=MODEL, prompt="Describe a cat in JSON.", format="json", options={"temperature": 0, "num_predict": 200})
        if g.done_reason == "stop":
            self.assertIsInstance(json.loads(g.response), dict)

    def test_llama_server_fields_and_gbnf_grammars(self):
        st, _, b = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "Some sums:\n", "grammar": ARITH_GBNF, "max_tokens": 120, "temperature": 0})
        self.assertEqual(st, 200, b)
        text = b["choices"][0]["text"]
        self.assertEqual(b["choices"][0]["finish_reason"], "stop", text)
        line = r"[a-z0-9_+\-*/() ]+= ?([a-z][a-z0-9_]{0,5}|[0-9]{1,4}|\(.*\)) ?\n"
        self.assertRegex(text, re.compile(f"^({line}){{1,3}}$"))
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Give me a shopping list."}],
                                           extra_body={"grammar": LIST_GBNF}, max_tokens=200, temperature=0)
        text = r.choices[0].message.content
        self.assertRegex(text, re.compile(r"^(- [^\r\n]{1,30}\n){2,4}$"), text)
        schema = SCHEMAS[0]
        st, _, b = raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Who are you?"}],
                                                          "json_schema": schema, "max_tokens": 200, "temperature": 0})
        self.assertEqual(st, 200, b)
        jsonschema.validate(json.loads(b["choices"][0]["message"]["content"]), schema)
        r = self.c.completions.create(model=MODEL, prompt="A date: ", extra_body={"guided_regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"},
                                      max_tokens=20, temperature=0)
        self.assertRegex(r.choices[0].text, r"^20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]$")

    def test_bad_schemas_and_grammars_are_400_with_reasons(self):
        msgs = [{"role": "user", "content": "hi"}]
        bad = [
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 7}}},
            {"grammar": "root ::= item"},
            {"grammar": "root ::= \"open"},
            {"guided_regex": "(unclosed"},
            {"grammar": "start: ???"},
        ]
        for extra in bad:
            with self.subTest(extra=extra):
                st, _, b = raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4, **extra})
                self.assertEqual(st, 400, b)
                self.assertTrue(b["error"]["message"], b)
        st, _, b = raw("POST", "/api/chat", {"model": MODEL, "messages": msgs, "format": {"type": "nope"}, "stream": False})
        self.assertEqual(st, 400, b)
        with self.assertRaises(openai.BadRequestError):
            self.c.chat.completions.create(model=MODEL, messages=msgs, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
        # the server still serves, constrained or not
        ch = self.chat_json(SCHEMAS[1], "Pick a color.")
        jsonschema.validate(json.loads(ch.message.content), SCHEMAS[1])


if __name__ == "__main__":
    unittest.main()
