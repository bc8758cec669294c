"""`metrale serve` on a hybrid model (Gated DeltaNet beside gated attention: the qwen3_next
fixture, random weights) driven by the official OpenAI client: prompts that share a prefix
resume it from the prefix cache (KV pages plus a recurrent-state snapshot at the branch point,
Marconi's rule with the floor lowered for a 256-token model), and every reply equals the same
request on a server without the prefix cache, one at a time or concurrently.

The fixture has no tokenizer; it is served with the scripted tool-call fixture's (269 byte-level
tokens, below the fixture's 392-id vocabulary) and its chat template, in a temporary directory
of links.

Run: build/venv/bin/python tests/python/test_hybrid_server.py (ctest runs it).
"""
import concurrent.futures
import pathlib
import random
import tempfile
import unittest

import openai

from metrale_server import ROOT, Server

FIXTURE = ROOT / "tests" / "data" / "fixtures" / "qwen3_next_bf16"
TOKENIZER = ROOT / "tests" / "data" / "fixtures" / "tool_calls" / "hermes"
FLAGS = ("--max-seqs", "4", "--marconi-min-tokens", "32")


def prompts():
    """Token-id prompts: three share a 96-token prefix (a system prompt), one shares none."""
    rng = random.Random(7)
    ids = lambda n: [rng.randrange(0, 256) for _ in range(n)]
    shared = ids(96)
    return [shared + ids(20), shared + ids(12), shared + ids(30), ids(100)]


class HybridServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        model = pathlib.Path(cls.dir.name) / "qwen3_next"
        model.mkdir()
        for f in FIXTURE.iterdir():
            if f.name != "reference.safetensors":
                (model / f.name).symlink_to(f)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model / name).symlink_to(TOKENIZER / name)
        cls.cached = Server(*FLAGS, model=model, chat_template=None)
        cls.plain = Server(*FLAGS, "--no-prefix-cache", model=model, chat_template=None)

    @classmethod
    def tearDownClass(cls):
        try:
            assert cls.cached.stop() == 0
            assert cls.plain.stop() == 0
        finally:
            cls.dir.cleanup()

    def complete(self, server, prompt):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=server.model, prompt=prompt, max_tokens=16,
                                      temperature=0, logprobs=1, extra_body={"ignore_eos": True})
        c = r.choices[0]
        return (c.text, c.logprobs.tokens, c.logprobs.token_logprobs), r.usage

    # Named to run first (unittest runs tests by name): it needs the cache empty.
    def test_a_shared_prefix_is_resumed_and_changes_nothing(self):
        ps = prompts()
        expected = [self.complete(self.plain, p)[0] for p in ps]
        cached = []
        for p in ps:
            got, usage = self.complete(self.cached, p)
            cached.append(usage.prompt_tokens_details.cached_tokens)
            self.assertEqual(got, expected[len(cached) - 1])
        # Marconi: a hybrid resumes only where a snapshot was taken. The first prompt leaves a
        # snapshot near its end, off the others' path; the second leaves the tree at the end of
        # the shared prefix and snapshots there; the third resumes from that branch point (its
        # whole pages); the unrelated one reuses nothing.
        self.assertEqual(cached[:2], [0, 0], cached)
        self.assertGreaterEqual(cached[2], 32, cached)
        self.assertLessEqual(cached[2], 96, cached)
        self.assertEqual(cached[3], 0, cached)
        self.assertGreater(self.cached.metrics()["metrale_prefix_cache_hits_total"], 0)

    def test_concurrent_streams_equal_each_alone(self):
        ps = prompts() * 2
        expected = [self.complete(self.plain, p)[0] for p in ps]
        with concurrent.futures.ThreadPoolExecutor(len(ps)) as pool:
            got = list(pool.map(lambda p: self.complete(self.cached, p)[0], ps))
        self.assertEqual(got, expected)

    def test_chat(self):
        client = openai.OpenAI(base_url=self.cached.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(
            model=self.cached.model, messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.choices[0].finish_reason, "length")


if __name__ == "__main__":
    unittest.main()
