"""Function calling through `metrale serve` with the official OpenAI Python client, on the two
scripted checkpoints in tests/data/fixtures/tool_calls (greedy replies that are fixed tool calls,
recorded with transformers): the checkpoint's own chat template renders the tools, the server
finds the format from it, and the calls come back as tool_calls, whole and streamed; the next
turn (the SDK's tool_calls sent back, arguments as JSON text, plus tool results) renders the
prompt transformers renders.

Run: build/venv/bin/python tests/python/test_tool_calls.py (ctest runs it).
"""
import json
import unittest

import openai

from metrale_server import ROOT, Server

FIXTURES = ROOT / "tests" / "data" / "fixtures" / "tool_calls"


def reference(name):
    return json.loads((FIXTURES / name / "reference.json").read_text())


def streamed(chunks):
    """Joins a chat stream's deltas: (reasoning, content, calls by index, finish reasons)."""
    reasoning, content, calls, finishes = "", "", {}, []
    for c in chunks:
        if not c.choices:
            continue
        choice = c.choices[0]
        delta = choice.delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            got = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            got["id"] += call.id or ""
            got["name"] += call.function.name or ""
            got["arguments"] += call.function.arguments or ""
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
    return reasoning, content, [calls[i] for i in sorted(calls)], finishes


class ToolCallsTest:
    """Shared by the two fixtures; subclasses set FIXTURE and PARSER."""

    FIXTURE = PARSER = None

    @classmethod
    def setUpClass(cls):
        cls.ref = reference(cls.FIXTURE)
        cls.server = Server("--max-seqs", "2", model=FIXTURES / cls.FIXTURE, chat_template=None)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def chat(self, case="first_turn", **kw):
        c = self.ref["cases"][case]
        kw.setdefault("tools", self.ref["tools"])
        if "chat_template_kwargs" in c:
            kw.setdefault("extra_body", {"chat_template_kwargs": c["chat_template_kwargs"]})
        return self.client.chat.completions.create(
            model=self.server.model, messages=c["messages"], temperature=0, max_tokens=64, **kw)

    def expected_calls(self):
        return [(c["name"], c["arguments"]) for c in self.ref["expected"]["tool_calls"]]

    def check_message(self, message, finish_reason):
        expected = self.ref["expected"]
        self.assertEqual(finish_reason, "tool_calls")
        self.assertEqual(message.content or "", expected["content"])
        self.assertEqual(getattr(message, "reasoning_content", None), expected["reasoning_content"])
        calls = message.tool_calls
        self.assertEqual([(c.function.name, json.loads(c.function.arguments)) for c in calls],
                         self.expected_calls())
        for c in calls:
            self.assertEqual(c.type, "function")
            self.assertTrue(c.id.startswith("call_"), c.id)
        self.assertEqual(len({c.id for c in calls}), len(calls))

    def test_the_server_found_the_format(self):
        self.assertIn(f"tool calls: {self.PARSER}", self.server.banner)

    def test_whole_reply(self):
        r = self.chat()
        self.assertEqual(r.usage.prompt_tokens, len(self.ref["cases"]["first_turn"]["prompt_ids"]))
        # The tokens are transformers' greedy ids, eos excluded.
        self.assertEqual(r.usage.completion_tokens,
                         len(self.ref["cases"]["first_turn"]["output_ids"]))
        self.check_message(r.choices[0].message, r.choices[0].finish_reason)

    def test_streamed_reply(self):
        whole = self.chat().choices[0].message
        reasoning, content, calls, finishes = streamed(self.chat(stream=True))
        self.assertEqual(finishes, ["tool_calls"])
        self.assertEqual(reasoning or None, self.ref["expected"]["reasoning_content"])
        self.assertEqual(content, whole.content or "")
        self.assertEqual([(c["name"], json.loads(c["arguments"])) for c in calls],
                         self.expected_calls())
        self.assertTrue(all(c["id"].startswith("call_") for c in calls))

    def test_tool_choice_none_leaves_the_text(self):
        r = self.chat(tool_choice="none")
        self.assertIsNone(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIn("<tool_call>", r.choices[0].message.content)

    def test_forcing_a_call(self):
        # Every format is forced by a grammar (test_structured_outputs.py and
        # tests/http/forced_tool_call_test.cc test it fully).
        if self.PARSER == "qwen3_coder":
            # The grammar is the template's spelling, after the <think> block Qwen3.5's prompt
            # opens: the scripted reply (reasoning, then the call) is what it allows, whole.
            r = self.chat(tool_choice="required")
            self.check_message(r.choices[0].message, r.choices[0].finish_reason)
            return
        # Hermes' grammar is compact JSON, which the script's spaced JSON is not; the fixture's
        # tools leave strings unbounded: greedy may run to max_tokens inside one, but the reply
        # is a call from its first token.
        m = self.chat(tool_choice="required").choices[0].message
        self.assertTrue(m.tool_calls or m.content.startswith('<tool_call>\n{"name":'), m.content)

    def test_the_next_turn(self):
        first = self.chat().choices[0].message
        case = self.ref["cases"]["second_turn"]
        # The conversation as a client continues it: the SDK's own tool_calls (arguments as
        # JSON text), then one result per call.
        assistant = {"role": "assistant", "content": first.content,
                     "tool_calls": [c.model_dump() for c in first.tool_calls]}
        messages = [case["messages"][0], assistant]
        messages += [m for m in case["messages"] if m["role"] == "tool"]
        for m, call in zip([m for m in messages if m["role"] == "tool"], first.tool_calls):
            m["tool_call_id"] = call.id
        r = self.client.chat.completions.create(model=self.server.model, messages=messages,
                                                tools=self.ref["tools"], temperature=0,
                                                max_tokens=64)
        # The same prompt as transformers renders with the arguments as objects (the reference
        # used ids call_0, call_1; the templates here do not print ids).
        self.assertEqual(r.usage.prompt_tokens, len(case["prompt_ids"]))
        self.check_message(r.choices[0].message, r.choices[0].finish_reason)


class HermesToolCalls(ToolCallsTest, unittest.TestCase):
    FIXTURE, PARSER = "hermes", "hermes"

    def test_thinking_disabled(self):
        r = self.chat(case="first_turn_no_thinking")
        self.assertEqual(r.usage.prompt_tokens,
                         len(self.ref["cases"]["first_turn_no_thinking"]["prompt_ids"]))
        self.check_message(r.choices[0].message, r.choices[0].finish_reason)


class Qwen3CoderToolCalls(ToolCallsTest, unittest.TestCase):
    FIXTURE, PARSER = "qwen3_coder", "qwen3_coder"

    def test_reasoning_can_be_left_out(self):
        r = self.chat(extra_body={"include_reasoning": False})
        self.assertIsNone(getattr(r.choices[0].message, "reasoning_content", None))
        self.assertEqual(len(r.choices[0].message.tool_calls), 1)


if __name__ == "__main__":
    unittest.main()
