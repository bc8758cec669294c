"""`metrale serve --speculative ngram` driven by the official OpenAI client: replies (greedy and
seeded sampling, whole and streamed, concurrent) equal a server without speculation; the usage
carries each request's drafts as completion_tokens_details; a request may turn drafts off; and
/metrics counts them.

Run: build/venv/bin/python tests/python/test_speculative_server.py (ctest runs it).
"""
import concurrent.futures
import unittest

import openai

from metrale_server import Server

PROMPTS = [
    "And God said, I am the LORD. And God said, I am the LORD. And God said",
    "In the beginning God created the heaven and the earth. And the earth",
    "And the evening and the morning were the third day. And the evening",
    "Let there be light",
]


class SpeculativeServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.plain = Server("--max-seqs", "4")
        cls.spec = Server("--max-seqs", "4", "--speculative", "ngram", "--draft-tokens", "3")
        cls.clients = {
            s: openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
            for s in (cls.plain, cls.spec)
        }

    @classmethod
    def tearDownClass(cls):
        assert cls.plain.stop() == 0
        assert cls.spec.stop() == 0

    def complete(self, server, prompt, **kw):
        kw.setdefault("max_tokens", 40)
        kw.setdefault("temperature", 0)
        return self.clients[server].completions.create(model=server.model, prompt=prompt, **kw)

    def test_the_banner_says_it_speculates(self):
        self.assertIn("speculative: ngram", self.spec.banner)

    def test_concurrent_replies_equal_the_plain_server(self):
        kinds = [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 7}]
        jobs = [(p, k) for p in PROMPTS for k in kinds]
        want = [self.complete(self.plain, p, **k).choices[0].text for p, k in jobs]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda job: self.complete(self.spec, job[0], **job[1]), jobs))
        self.assertEqual([r.choices[0].text for r in got], want)
        accepted = sum(r.usage.completion_tokens_details.accepted_prediction_tokens for r in got)
        self.assertGreater(accepted, 0)
        for r in got:
            d = r.usage.completion_tokens_details
            self.assertGreaterEqual(d.rejected_prediction_tokens, 0)

    def test_streamed_equals_whole(self):
        whole = self.complete(self.spec, PROMPTS[0]).choices[0].text
        chunks = list(self.complete(self.spec, PROMPTS[0], stream=True,
                                    stream_options={"include_usage": True}))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), whole)
        self.assertIsNotNone(chunks[-1].usage.completion_tokens_details)

    def test_a_request_may_turn_it_off(self):
        on = self.complete(self.spec, PROMPTS[0])
        off = self.complete(self.spec, PROMPTS[0], extra_body={"speculative": False})
        self.assertEqual(off.choices[0].text, on.choices[0].text)
        self.assertIsNone(off.usage.completion_tokens_details)
        with self.assertRaises(openai.BadRequestError):
            self.complete(self.spec, PROMPTS[0], extra_body={"speculative": "no"})

    def test_metrics_count_the_drafts(self):
        self.complete(self.spec, PROMPTS[0])
        m = self.spec.metrics()
        self.assertGreater(m["metrale_spec_draft_tokens_total"], 0)
        self.assertGreater(m["metrale_spec_accepted_tokens_total"], 0)
        self.assertGreater(m["metrale_request_draft_acceptance_count"], 0)
        self.assertEqual(self.plain.metrics()["metrale_spec_draft_tokens_total"], 0)


if __name__ == "__main__":
    unittest.main()
