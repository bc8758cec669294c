"""`metrale serve --speculative mtp` driven by the official OpenAI client: the drafter is the
checkpoint's MTP layer (the deepseek_v3_mtp fixture, random weights), fed the target's hidden
states the scheduler records. Greedy replies, one at a time and concurrent, equal a server
without speculation; the usage carries each request's drafts (completion_tokens_details); a
request may turn drafts off; /metrics counts them.

The fixture has no tokenizer; it is served with the scripted tool-call fixture's (269 byte-level
tokens, below the fixture's 392-id vocabulary), in a temporary directory of links, and prompted
with token ids.

Run: build/venv/bin/python tests/python/test_mtp_server.py (ctest runs it).
"""
import concurrent.futures
import pathlib
import random
import tempfile
import unittest
import urllib.request

import openai

from metrale_server import ROOT, Server

FIXTURE = ROOT / "tests" / "data" / "fixtures" / "deepseek_v3_mtp_bf16"
TOKENIZER = ROOT / "tests" / "data" / "fixtures" / "tool_calls" / "hermes"
FLAGS = ("--max-seqs", "4", "--prefill-chunk", "16")


def prompts():
    """Token-id prompts of different lengths, each ending in a repeated pattern."""
    rng = random.Random(3)
    return [[rng.randrange(0, 256) for _ in range(n)] + [5, 9, 5, 9, 5, 9, 5, 11, 3]
            for n in (4, 20, 37, 11)]


def labelled(server):
    """/metrics as {sample: value}, labelled samples included."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


class MtpServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        model = pathlib.Path(cls.dir.name) / "deepseek_v3_mtp"
        model.mkdir()
        for f in FIXTURE.iterdir():
            if f.name not in ("reference.safetensors", "mtp_reference.safetensors"):
                (model / f.name).symlink_to(f)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model / name).symlink_to(TOKENIZER / name)
        cls.plain = Server(*FLAGS, model=model, chat_template=None)
        cls.spec = Server(*FLAGS, "--speculative", "mtp", "--draft-tokens", "3", model=model,
                          chat_template=None)
        cls.no_carry = Server(*FLAGS, "--speculative", "mtp", "--mtp-carry", "0", model=model,
                              chat_template=None)
        cls.no_prefill = Server(*FLAGS, "--speculative", "mtp", "--drafter-prefill", "0",
                                model=model, chat_template=None)
        cls.tree = Server(*FLAGS, "--speculative", "mtp", "--draft-tokens", "3", "--draft-tree",
                          "-1,-1,0,0,2", model=model, chat_template=None)

    @classmethod
    def tearDownClass(cls):
        try:
            assert cls.plain.stop() == 0
            assert cls.spec.stop() == 0
            assert cls.no_carry.stop() == 0
            assert cls.no_prefill.stop() == 0
            assert cls.tree.stop() == 0
        finally:
            cls.dir.cleanup()

    def complete(self, server, prompt, **kw):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        extra = kw.pop("extra_body", {})
        return client.completions.create(model=server.model, prompt=prompt, max_tokens=24,
                                         temperature=0, logprobs=1,
                                         extra_body={"ignore_eos": True, **extra}, **kw)

    @staticmethod
    def tokens(r):
        c = r.choices[0]
        return c.text, c.logprobs.tokens

    def test_the_banner_says_it_speculates(self):
        self.assertIn("speculative: mtp", self.spec.banner)

    def test_concurrent_replies_equal_the_plain_server(self):
        ps = prompts() * 2
        want = [self.tokens(self.complete(self.plain, p)) for p in ps]
        with concurrent.futures.ThreadPoolExecutor(len(ps)) as pool:
            got = list(pool.map(lambda p: self.complete(self.spec, p), ps))
        self.assertEqual([self.tokens(r) for r in got], want)
        drafted = 0
        for r in got:
            d = r.usage.completion_tokens_details
            self.assertIsNotNone(d)
            self.assertGreaterEqual(d.accepted_prediction_tokens, 0)
            self.assertGreaterEqual(d.rejected_prediction_tokens, 0)
            drafted += d.accepted_prediction_tokens + d.rejected_prediction_tokens
        self.assertGreater(drafted, 0)

    def test_draft_trees_keep_the_replies(self):
        # --draft-tree: the drafter's runner-up tokens beside its chain, verified in one step.
        ps = prompts() * 2
        want = [self.tokens(self.complete(self.plain, p)) for p in ps]
        with concurrent.futures.ThreadPoolExecutor(len(ps)) as pool:
            got = list(pool.map(lambda p: self.complete(self.tree, p), ps))
        self.assertEqual([self.tokens(r) for r in got], want)
        self.assertGreater(self.tree.metrics()["metrale_spec_draft_tokens_total"], 0)

    def test_a_request_may_turn_it_off(self):
        p = prompts()[1]
        on = self.complete(self.spec, p)
        off = self.complete(self.spec, p, extra_body={"speculative": False})
        self.assertEqual(self.tokens(off), self.tokens(on))
        self.assertIsNone(off.usage.completion_tokens_details)
        self.assertIsNotNone(on.usage.completion_tokens_details)

    def test_metrics_count_the_drafts(self):
        self.complete(self.spec, prompts()[0])
        m = self.spec.metrics()
        self.assertGreater(m["metrale_spec_draft_tokens_total"], 0)
        self.assertGreater(m["metrale_request_draft_acceptance_count"], 0)
        self.assertEqual(self.plain.metrics()["metrale_spec_draft_tokens_total"], 0)

    def test_a_sessions_next_turn_adopts_its_drafter_rows(self):
        first = prompts()[2]
        reply = self.complete(self.spec, first, extra_body={"session_id": "conversation-1"})
        # The next turn: the first prompt, the reply (its text tokenized again) and a new span.
        ids = self.plain.post("/tokenize", {"content": reply.choices[0].text})["tokens"]
        second = first + ids + [7, 8, 9, 10]
        before = labelled(self.spec)
        on = self.complete(self.spec, second, extra_body={"session_id": "conversation-1"})
        after = labelled(self.spec)
        self.assertEqual(self.tokens(on), self.tokens(self.complete(self.plain, second)))
        adopted = 'metrale_mtp_carry_total{outcome="adopted"}'
        self.assertEqual(after[adopted] - before[adopted], 1)
        self.assertGreater(after["metrale_mtp_carry_rows_adopted_total"],
                           before["metrale_mtp_carry_rows_adopted_total"])
        # Carry off: the same reply, nothing adopted.
        off = self.complete(self.no_carry, second, extra_body={"session_id": "conversation-1"})
        self.assertEqual(self.tokens(off), self.tokens(on))
        self.assertEqual(labelled(self.no_carry)[adopted], 0)
        with self.assertRaises(openai.BadRequestError):
            self.complete(self.spec, first, extra_body={"session_id": 7})

    def test_without_drafter_prefill_replies_are_unchanged(self):
        # --drafter-prefill 0: the drafter starts at each prompt's last token; it still drafts,
        # computes no prompt rows, and a session's next turn finds no rows to adopt (no_hiddens).
        first = prompts()[2]
        one = self.complete(self.no_prefill, first, extra_body={"session_id": "c"})
        self.assertEqual(self.tokens(one), self.tokens(self.complete(self.plain, first)))
        ids = self.plain.post("/tokenize", {"content": one.choices[0].text})["tokens"]
        second = first + ids + [7, 8, 9, 10]
        two = self.complete(self.no_prefill, second, extra_body={"session_id": "c"})
        self.assertEqual(self.tokens(two), self.tokens(self.complete(self.plain, second)))
        d = two.usage.completion_tokens_details
        self.assertGreater(d.accepted_prediction_tokens + d.rejected_prediction_tokens, 0)
        m = labelled(self.no_prefill)
        self.assertEqual(m['metrale_mtp_carry_total{outcome="no_hiddens"}'], 1)
        self.assertEqual(m['metrale_mtp_carry_total{outcome="adopted"}'], 0)
        self.assertEqual(m["metrale_drafter_prefill_rows_total"], 0)


if __name__ == "__main__":
    unittest.main()
