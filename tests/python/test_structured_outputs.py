"""Structured outputs through `metrale serve` with the official OpenAI client: every constrained
reply parses and validates (the `jsonschema` package) against its schema, over a corpus of schemas
(nested objects, arrays with minItems / maxItems, enums, anyOf, $ref / $defs, string patterns,
bounded numbers), on the demo model and on a random-weight Qwen3 with the real Qwen3 tokenizer
(whose unconstrained output is noise: only the grammar makes it valid); response_format,
vLLM's structured_outputs / guided_*, client.chat.completions.parse with a pydantic model,
streaming, n > 1, regex and choice, forced tool calls (tool_choice "required" and a named
function, on the scripted Hermes checkpoint; in qwen3_coder's XML format on the random-weight
Qwen3 with the Qwen3-Coder template, and in Mistral's [TOOL_CALLS]N[ARGS]{...} with its special
tokens on a random-weight byte-level model under Mistral Small 3.2's template, likewise in
glm45's under GLM-4.6's, and in deepseek_v3's V3.1 spelling with the DeepSeek-V3 tokenizer); a
request without a grammar co-batched with
constrained ones equals itself alone; bad schemas and grammars are 400s naming the field.

With --speculative ngram the constrained greedy reply equals the one without drafts.

Run: build/venv/bin/python tests/python/test_structured_outputs.py (ctest runs it).
"""
import concurrent.futures
import gzip
import json
import os
import random
import re
import shutil
import sys
import tempfile
import unittest
from typing import Annotated, List, Literal

import jsonschema
import openai
import pydantic

from metrale_server import ROOT, Server
from random_qwen3 import random_qwen3

HERMES = ROOT / "tests" / "data" / "fixtures" / "tool_calls" / "hermes"

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6},
                               "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                "minItems": 2, "maxItems": 3}},
        "required": ["tags"],
    },
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                              "n": {"const": 3}},
             "required": ["color", "n"]},
    "anyof": {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0,
                                                                "maximum": 9},
                                                               {"type": "boolean"},
                                                               {"type": "null"}]}},
              "required": ["v"]},
    "refs": {
        "$defs": {"point": {"type": "object",
                            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                           "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
    },
    "pattern": {"type": "object",
                "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
                "required": ["code"]},
    "bounds": {"type": "object",
               "properties": {"i": {"type": "integer", "minimum": 5, "maximum": 50},
                              "b": {"type": "boolean"},
                              "e": {"type": "integer", "exclusiveMinimum": 0,
                                    "exclusiveMaximum": 4}},
               "required": ["i", "b", "e"]},
}


def byte_level_tokenizer(path, specials):
    """tokenizer.json: the 256 byte symbols of GPT-2's byte-level alphabet (ids 0-255, no
    merges), then `specials` as special added tokens (ids 256...); the first is the eos, the
    second the bos."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    extra = iter(range(256, 512))
    symbol = {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    tokenizer = {"version": "1.0", "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
                 "model": {"type": "BPE", "vocab": {symbol[b]: b for b in range(256)},
                           "merges": [], "unk_token": None, "byte_fallback": False}}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": specials[0], "bos_token": specials[1]}))


def content_of(resp):
    return [c.message.content for c in resp.choices]


def serve_byte_level(cls, template):
    """Serves, for the test class `cls`, a random one-layer Qwen3 over a byte-level vocabulary
    whose special tokens are cls.SPECIALS (the first the eos, the second the bos) with the chat
    template tests/data/chat_templates/`template`; sets cls.dir, cls.server and cls.client."""
    import pathlib
    cls.dir = tempfile.TemporaryDirectory()
    path = pathlib.Path(cls.dir.name)
    # Every byte is a token, so a reply's strings can spell any byte sequence: only the grammar
    # (and its UTF-8 guard, src/grammar/utf8_guard.h) keeps them valid UTF-8 of the allowed
    # length. METRALE_TEST_WEIGHT_SEED picks other weights (default 7: each run the same model).
    seed = int(os.environ.get("METRALE_TEST_WEIGHT_SEED", "7"))
    random_qwen3(path, randbytes=random.Random(seed).randbytes, vocab=256 + len(cls.SPECIALS),
                 bos=257, eos=256, qwen_tokenizer=False)
    byte_level_tokenizer(path, cls.SPECIALS)
    cls.server = Server(model=path, chat_template=ROOT / "tests" / "data" / "chat_templates" /
                        template)
    cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)


class Constrained:
    """Shared by the demo model and the random Qwen3; subclasses start SERVER."""

    server = client = None

    def chat(self, **kw):
        kw.setdefault("messages", [{"role": "user", "content": "Give me JSON."}])
        kw.setdefault("max_tokens", 400)
        return self.client.chat.completions.create(model=self.server.model, **kw)

    def check_schema(self, schema, resp):
        for c in resp.choices:
            self.assertEqual(c.finish_reason, "stop", c)
            jsonschema.validate(json.loads(c.message.content), schema)

    def test_schema_corpus_response_format(self):
        for name, schema in SCHEMAS.items():
            for temperature in (0.0, 1.0):
                with self.subTest(schema=name, temperature=temperature):
                    r = self.chat(temperature=temperature, seed=11, response_format={
                        "type": "json_schema",
                        "json_schema": {"name": name, "schema": schema, "strict": True}})
                    self.check_schema(schema, r)

    def test_guided_json_on_completions_and_n(self):
        schema = SCHEMAS["refs"]
        r = self.client.completions.create(model=self.server.model, prompt="And God said",
                                           max_tokens=300, temperature=1.0, seed=5, n=3,
                                           extra_body={"guided_json": schema})
        self.assertEqual(len(r.choices), 3)
        for c in r.choices:
            self.assertEqual(c.finish_reason, "stop")
            jsonschema.validate(json.loads(c.text), schema)

    def test_json_object(self):
        r = self.chat(temperature=1.0, seed=2, max_tokens=200,
                      response_format={"type": "json_object"}, n=2)
        for c in r.choices:
            if c.finish_reason == "stop":
                self.assertIsInstance(json.loads(c.message.content), dict)
            else:  # an object the budget cut: it still opens as one
                self.assertTrue(c.message.content.startswith("{"), c.message.content)

    def test_regex_and_choice(self):
        r = self.chat(temperature=1.0, seed=4,
                      extra_body={"structured_outputs": {"regex": "[A-Z][a-z]{2,5} [0-9]{1,3}"}})
        self.assertRegex(r.choices[0].message.content, r"^[A-Z][a-z]{2,5} [0-9]{1,3}$")
        choices = ["yea", "nay", "peradventure"]
        for seed in range(3):
            r = self.chat(temperature=1.0, seed=seed, extra_body={"guided_choice": choices})
            self.assertIn(r.choices[0].message.content, choices)
        r = self.chat(temperature=1.0, seed=1, extra_body={
            "guided_grammar": 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'})
        self.assertRegex(r.choices[0].message.content, r"^\([1-9][0-9]?(\+[1-9][0-9]?)*\)$")

    def test_streaming(self):
        schema = SCHEMAS["nested"]
        stream = self.chat(temperature=1.0, seed=9, stream=True, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        text, finish = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "stop")
        jsonschema.validate(json.loads(text), schema)


class DemoModel(Constrained, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-grammar-bytes", "4096")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)
        probe = cls.server_error(guided_regex="a")
        if probe is not None and "without xgrammar" in probe:
            cls.server.stop()
            print("skipped: this metrale was built without xgrammar (scripts/fetch-xgrammar.sh)")
            sys.exit(77)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def server_error(cls, **extra):
        try:
            cls.client.completions.create(model=cls.server.model, prompt="x", max_tokens=4,
                                          extra_body=extra)
        except openai.BadRequestError as e:
            return str(e)
        return None

    def test_parse_with_pydantic(self):
        class Verse(pydantic.BaseModel):
            book: Literal["Genesis", "Exodus"]
            chapter: int = pydantic.Field(ge=1, le=50)
            words: List[Annotated[str, pydantic.Field(max_length=8)]] = pydantic.Field(
                min_length=1, max_length=3)

        r = self.client.chat.completions.parse(
            model=self.server.model, messages=[{"role": "user", "content": "A verse."}],
            response_format=Verse, max_tokens=400, temperature=1.0, seed=3)
        verse = r.choices[0].message.parsed
        self.assertIsInstance(verse, Verse)
        self.assertIn(verse.book, ("Genesis", "Exodus"))

    def test_unconstrained_is_bit_identical_beside_constrained(self):
        def plain():
            return self.client.completions.create(model=self.server.model,
                                                  prompt="In the beginning", max_tokens=40,
                                                  temperature=0).choices[0].text

        alone = plain()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            constrained = [pool.submit(self.chat, temperature=1.0, seed=s, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS["array"]}})
                for s in range(3)]
            together = pool.submit(plain)
            for f in constrained:
                self.check_schema(SCHEMAS["array"], f.result())
            self.assertEqual(together.result(), alone)

    def test_bad_schemas_and_grammars_are_400s(self):
        cases = [
            ({"guided_json": {"type": "object", "properties": {"a": {"not": {"type": "null"}}}}},
             "'not'"),
            ({"guided_json": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
            ({"guided_json": "{not json"}, "guided_json"),
            ({"guided_json": {"type": "frobnicate"}}, "guided_json"),
            ({"guided_regex": "(unclosed"}, "guided_regex"),
            ({"guided_grammar": "root ::= ("}, "guided_grammar"),
            ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
            ({"guided_json": {"enum": ["x" * 5000]}}, "--max-grammar-bytes"),
        ]
        for extra, needle in cases:
            with self.subTest(extra=str(extra)[:60]):
                message = self.server_error(**extra)
                self.assertIsNotNone(message, "accepted")
                self.assertIn(needle, message)
        # response_format with a forced tool call is refused; the server keeps serving.
        with self.assertRaises(openai.BadRequestError):
            self.chat(tools=[{"type": "function", "function": {"name": "f"}}],
                      tool_choice="required", response_format={"type": "json_object"})
        self.assertTrue(plain_ok(self))


def plain_ok(t):
    r = t.client.completions.create(model=t.server.model, prompt="And", max_tokens=3)
    return len(r.choices) == 1


class RandomQwen3(Constrained, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        import pathlib
        path = pathlib.Path(cls.dir.name)
        random_qwen3(path)
        cls.server = Server(model=path, chat_template=None)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.dir.cleanup()

    def test_unconstrained_is_noise(self):
        r = self.chat(temperature=1.0, seed=1, max_tokens=20)
        with self.assertRaises((ValueError, jsonschema.ValidationError)):
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS["enum"])


class Speculative(unittest.TestCase):
    """--speculative ngram: a constrained greedy reply is the same with drafts as without (row i
    of a verify step is masked after the drafts before it were accepted, so a draft the grammar
    rejects is never the pick and ends the accepted run)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--speculative", "ngram")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_drafts_do_not_change_a_constrained_reply(self):
        # A repetitive prompt, so the n-gram proposer drafts.
        prompt = "And God said, Let there be light: and there was light. " * 4
        drafted = 0
        for name in ("array", "refs", "nested"):
            with self.subTest(schema=name):
                out = []
                for speculative in (True, False):
                    r = self.client.completions.create(
                        model=self.server.model, prompt=prompt, max_tokens=300, temperature=0,
                        extra_body={"guided_json": SCHEMAS[name], "speculative": speculative})
                    self.assertEqual(r.choices[0].finish_reason, "stop")
                    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[name])
                    out.append(r.choices[0].text)
                    details = r.usage.completion_tokens_details
                    if speculative and details is not None:
                        drafted += (details.accepted_prediction_tokens or 0) + (
                            details.rejected_prediction_tokens or 0)
                self.assertEqual(out[0], out[1])
        self.assertGreater(drafted, 0, "no drafts were verified")


class ForcedToolCalls(unittest.TestCase):
    TOOLS = [
        {"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                           "required": ["city", "unit"]}}},
        {"type": "function", "function": {
            "name": "get_time",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
                                          "hour": {"type": "integer", "minimum": 0,
                                                   "maximum": 23}},
                           "required": ["city", "hour"]}}},
    ]

    @classmethod
    def setUpClass(cls):
        cls.server = Server(model=HERMES, chat_template=None)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def call(self, tool_choice, **kw):
        return self.client.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": "weather?"}],
            tools=self.TOOLS, tool_choice=tool_choice, max_tokens=300, **kw)

    def check(self, name, arguments):
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in self.TOOLS}[name]
        jsonschema.validate(json.loads(arguments), schema)

    def test_named_function(self):
        # The scripted checkpoint calls get_weather first; forcing get_time overrides it.
        for temperature in (0.0, 1.0):
            r = self.call({"type": "function", "function": {"name": "get_time"}},
                          temperature=temperature, seed=2)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls")
            self.assertEqual([t.function.name for t in c.message.tool_calls], ["get_time"])
            self.check("get_time", c.message.tool_calls[0].function.arguments)

    def test_required_and_streamed(self):
        r = self.call("required", temperature=1.0, seed=5)
        calls = r.choices[0].message.tool_calls
        self.assertEqual(len(calls), 1)
        self.check(calls[0].function.name, calls[0].function.arguments)
        stream = self.call("required", temperature=1.0, seed=5, stream=True)
        name, args = "", ""
        for chunk in stream:
            for t in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name += t.function.name or ""
                args += t.function.arguments or ""
        self.assertEqual((name, json.loads(args)),
                         (calls[0].function.name, json.loads(calls[0].function.arguments)))

    def test_unknown_tool_is_a_400(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.call({"type": "function", "function": {"name": "nope"}})
        self.assertIn("nope", str(e.exception))


class ForcedToolCallsQwen3Coder(unittest.TestCase):
    """Forced calls in qwen3_coder's XML format (<tool_call><function=N><parameter=K>...), on the
    random-weight Qwen3 with the Qwen3-Coder template: whatever the model's noise, the reply is
    one call that the server's parser reads back, its arguments valid for the tool's schema."""

    STOP = {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "nights": {"type": "integer", "minimum": 0, "maximum": 5}},
            "required": ["name", "nights"]}
    FORMAT = "qwen3_coder"
    TOOLS = [
        {"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
                                          "unit": {"enum": ["celsius", "fahrenheit"]},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                           "required": ["city", "unit"]}}},
        {"type": "function", "function": {
            "name": "plan_trip",
            "parameters": {"type": "object",
                           "properties": {"stops": {"type": "array", "items": STOP,
                                                    "minItems": 1, "maxItems": 2},
                                          "budget": {"type": "integer", "minimum": 0,
                                                     "maximum": 1000},
                                          "refundable": {"type": "boolean"},
                                          "code": {"type": "string", "maxLength": 3}},
                           "required": ["stops", "budget", "code"]}}},
    ]

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        import pathlib
        path = pathlib.Path(cls.dir.name)
        random_qwen3(path)
        cls.server = Server(model=path, chat_template=ROOT / "tests" / "data" / "chat_templates" /
                            "Qwen3-Coder.jinja")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.dir.cleanup()

    def call(self, tool_choice, tools=None, **kw):
        kw.setdefault("max_tokens", 400)
        return self.client.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": "weather?"}],
            tools=tools or self.TOOLS, tool_choice=tool_choice, **kw)

    def check(self, choice, names):
        self.assertEqual(choice.finish_reason, "tool_calls", choice.message.content)
        calls = choice.message.tool_calls
        self.assertEqual(len(calls), 1)
        self.assertIn(calls[0].function.name, names)
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in self.TOOLS}
        jsonschema.validate(json.loads(calls[0].function.arguments), schema[calls[0].function.name])
        return calls[0]

    def test_the_server_found_the_format(self):
        self.assertIn(f"tool calls: {self.FORMAT}", self.server.banner)

    def test_unforced_is_no_call(self):
        r = self.call("auto", temperature=1.0, seed=1, max_tokens=20)
        self.assertIsNone(r.choices[0].message.tool_calls)

    def test_named_function(self):
        for name in ("get_weather", "plan_trip"):
            for seed in (1, 2, 3):
                r = self.call({"type": "function", "function": {"name": name}}, temperature=1.0,
                              seed=seed)
                self.check(r.choices[0], [name])

    def test_required(self):
        seen = set()
        for seed in range(6):
            r = self.call("required", temperature=1.0, seed=seed)
            seen.add(self.check(r.choices[0], ["get_weather", "plan_trip"]).function.name)
        one = self.call("required", tools=self.TOOLS[1:], temperature=1.0, seed=7)
        self.check(one.choices[0], ["plan_trip"])
        self.assertTrue(seen)

    def test_streamed_equals_whole(self):
        whole = self.check(self.call("required", temperature=1.0, seed=11).choices[0],
                           ["get_weather", "plan_trip"])
        name, args, finish = "", "", None
        for chunk in self.call("required", temperature=1.0, seed=11, stream=True):
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            for t in chunk.choices[0].delta.tool_calls or []:
                name += t.function.name or ""
                args += t.function.arguments or ""
        self.assertEqual(finish, "tool_calls")
        self.assertEqual((name, json.loads(args)),
                         (whole.function.name, json.loads(whole.function.arguments)))

    def test_unknown_tool_is_a_400_naming_tool_choice(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.call({"type": "function", "function": {"name": "nope"}})
        self.assertIn("tool_choice", str(e.exception))
        self.assertIn("nope", str(e.exception))

    def test_an_unsupported_keyword_is_a_400_naming_it(self):
        tools = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}]
        with self.assertRaises(openai.BadRequestError) as e:
            self.call("required", tools=tools)
        self.assertIn("uniqueItems", str(e.exception))


class ForcedToolCallsMistral(ForcedToolCallsQwen3Coder):
    """The same on a random-weight model with a byte-level vocabulary whose Mistral markers are
    special tokens, under Mistral Small 3.2's template: the call is [TOOL_CALLS]N[ARGS]{...},
    its markers the special tokens (decoded for the parser, as vLLM does), whatever the noise."""

    SPECIALS = ["</s>", "<s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]
    FORMAT = "mistral"

    @classmethod
    def setUpClass(cls):
        serve_byte_level(cls, "Mistral-Small-3.2-24B-Instruct-2506.jinja")

    def test_the_markers_are_the_special_tokens(self):
        # With the specials skipped the parser would see no call: the server keeps them, and
        # the reply's tokens hold [TOOL_CALLS] and [ARGS] once each (logprobs name them).
        r = self.call("required", temperature=1.0, seed=3, logprobs=True)
        self.check(r.choices[0], ["get_weather", "plan_trip"])
        tokens = [t.token for t in r.choices[0].logprobs.content]
        self.assertEqual(tokens[0], "[TOOL_CALLS]")
        self.assertEqual(tokens.count("[TOOL_CALLS]"), 1)
        self.assertEqual(tokens.count("[ARGS]"), 1)
        self.assertFalse(set(tokens) & (set(self.SPECIALS) - {"[TOOL_CALLS]", "[ARGS]"}), tokens)


class ForcedToolCallsGlm45(ForcedToolCallsQwen3Coder):
    """glm45's <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>... under GLM-4.6's
    template, its markers special tokens of a byte-level vocabulary, on random weights."""

    SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>",
                "</tool_response>"]
    FORMAT = "glm45"

    @classmethod
    def setUpClass(cls):
        serve_byte_level(cls, "GLM-4.6.jinja")


class ForcedToolCallsDeepSeekV31(ForcedToolCallsQwen3Coder):
    """deepseek_v3's calls as DeepSeek-V3.1's template writes them (N<｜tool▁sep｜>{...}), on a
    random-weight model with the real DeepSeek-V3 tokenizer."""

    FORMAT = "deepseek_v3"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        import pathlib
        path = pathlib.Path(cls.dir.name)
        tok = ROOT / "tests" / "data" / "tokenizers" / "deepseek_v3"
        with gzip.open(tok / "tokenizer.json.gz", "rb") as src:
            (path / "tokenizer.json").write_bytes(src.read())
        shutil.copy(tok / "tokenizer_config.json", path / "tokenizer_config.json")
        ids = [t["id"] for t in json.loads((path / "tokenizer.json").read_text())["added_tokens"]]
        random_qwen3(path, vocab=max(ids) + 1, bos=0, eos=1, qwen_tokenizer=False)
        cls.server = Server(model=path, chat_template=ROOT / "tests" / "data" / "chat_templates" /
                            "deepseek-ai-DeepSeek-V3.1.jinja")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    def test_the_spelling_is_v31s(self):
        r = self.call({"type": "function", "function": {"name": "get_weather"}}, temperature=1.0,
                      seed=4, logprobs=True)
        self.check(r.choices[0], ["get_weather"])
        text = "".join(t.token for t in r.choices[0].logprobs.content)
        self.assertTrue(text.startswith(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"), text)


if __name__ == "__main__":
    unittest.main()
