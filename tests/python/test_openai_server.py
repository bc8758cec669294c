"""`metrale serve` driven by the official OpenAI Python client (tests/python/requirements.txt):
chat and completions, streaming and not, stop strings, max_tokens, logprobs, seeds, the API key,
errors, and concurrent streams equal to the same requests run one at a time.

Run: build/venv/bin/python tests/python/test_openai_server.py (ctest runs it).
"""
import concurrent.futures
import json
import subprocess
import time
import unittest

import openai

from metrale_server import DEMO, Server, metrale_bin

KEY = "sk-metrale-test"
USER = [{"role": "user", "content": "Who made the heaven and the earth?"}]


class OpenAiServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-seqs", "8", api_key=KEY)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key=KEY, max_retries=0)
        cls.model = cls.server.model

    @classmethod
    def tearDownClass(cls):
        # SIGTERM stops it cleanly: exit code 0.
        assert cls.server.stop() == 0

    def chat(self, **kw):
        kw.setdefault("messages", USER)
        kw.setdefault("temperature", 0)
        return self.client.chat.completions.create(model=self.model, **kw)

    def test_models_lists_the_served_model(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], [self.model])

    def test_chat(self):
        r = self.chat(max_tokens=16)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 16)
        self.assertGreater(r.usage.prompt_tokens, 10)  # the rendered template, not just the text
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 16)

    def test_chat_stream_equals_chat(self):
        whole = self.chat(max_tokens=24).choices[0].message.content
        chunks = list(self.chat(max_tokens=24, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, ["length"])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 24)

    def test_completion_equals_metrale_generate(self):
        prompt = "In the beginning"
        r = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=20, temperature=0)
        self.assertEqual(r.object, "text_completion")
        out = subprocess.run([metrale_bin(), "generate", "--model", str(DEMO), "--prompt", prompt,
                              "-n", "20", "--json"], check=True, capture_output=True, text=True)
        ids = json.loads(out.stdout)["ids"]
        self.assertEqual(r.choices[0].text, self.server.post("/detokenize", {"tokens": ids})["content"])
        self.assertEqual(r.usage.completion_tokens, len(ids))
        # The same prompt as token ids gives the same text.
        prompt_ids = json.loads(out.stdout)["prompt_ids"]
        by_ids = self.client.completions.create(model=self.model, prompt=prompt_ids, max_tokens=20,
                                                temperature=0)
        self.assertEqual(by_ids.choices[0].text, r.choices[0].text)

    def test_completion_stream(self):
        whole = self.client.completions.create(model=self.model, prompt="And God said",
                                               max_tokens=30, temperature=0)
        parts = self.client.completions.create(model=self.model, prompt="And God said",
                                               max_tokens=30, temperature=0, stream=True)
        self.assertEqual("".join(p.choices[0].text for p in parts if p.choices), whole.choices[0].text)

    def test_stop_strings_cut_the_text(self):
        free = self.client.completions.create(model=self.model, prompt="And God said", max_tokens=40,
                                              temperature=0).choices[0].text
        self.assertIn("LORD", free)
        r = self.client.completions.create(model=self.model, prompt="And God said", max_tokens=40,
                                           temperature=0, stop=["LORD", "never appears"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].text, free[: free.index("LORD")])
        streamed = self.client.completions.create(model=self.model, prompt="And God said",
                                                  max_tokens=40, temperature=0, stop="LORD", stream=True)
        self.assertEqual("".join(p.choices[0].text for p in streamed if p.choices), r.choices[0].text)

    def test_max_tokens_ends_with_length(self):
        for n in (1, 5):
            r = self.chat(max_tokens=n)
            self.assertEqual(r.usage.completion_tokens, n)
            self.assertEqual(r.choices[0].finish_reason, "length")
        r = self.chat(max_completion_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_chat_logprobs(self):
        r = self.chat(max_tokens=8, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 8)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 3)
            lps = [a.logprob for a in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            # Greedy: the chosen token is the most likely one.
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)

    def test_completion_logprobs(self):
        r = self.client.completions.create(model=self.model, prompt="And God said", max_tokens=6,
                                           temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(len(lp.top_logprobs), 6)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(lp.text_offset[0], 0)
        for i, top in enumerate(lp.top_logprobs):
            self.assertLessEqual(len(top), 2)
            self.assertAlmostEqual(max(top.values()), lp.token_logprobs[i], places=5)

    def test_seed_reproduces_a_sampled_completion(self):
        def sample(seed):
            return self.chat(max_tokens=32, temperature=1.0, seed=seed).choices[0].message.content

        first = sample(7)
        self.assertEqual(sample(7), first)
        self.assertTrue(any(sample(s) != first for s in (8, 9, 10)))

    def test_n_choices(self):
        kw = dict(max_tokens=12, temperature=1.0, seed=40)
        r = self.chat(n=3, **kw)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        texts = [c.message.content for c in r.choices]
        # Choice i samples with seed + i: it is the same request with n = 1 and that seed.
        for i, text in enumerate(texts):
            one = self.chat(**{**kw, "seed": 40 + i})
            self.assertEqual(text, one.choices[0].message.content)
        self.assertEqual(len(set(texts)), 3)
        self.assertEqual(r.usage.completion_tokens, 3 * 12)
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)  # the prompt once
        # Streamed: the chunks carry each choice's index; joined, they are the whole reply.
        chunks = list(self.chat(n=3, stream=True, stream_options={"include_usage": True}, **kw))
        streamed, finishes = ["", "", ""], {}
        for chunk in chunks:
            for c in chunk.choices:
                streamed[c.index] += c.delta.content or ""
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
        self.assertEqual(streamed, texts)
        self.assertEqual(finishes, {0: "length", 1: "length", 2: "length"})
        self.assertEqual(chunks[-1].usage.completion_tokens, 3 * 12)
        # Completions too.
        c = self.client.completions.create(model=self.model, prompt="And God said", n=2,
                                           max_tokens=8, temperature=1.0, seed=5)
        self.assertEqual([x.index for x in c.choices], [0, 1])
        self.assertEqual(c.usage.completion_tokens, 16)

    def test_bad_requests(self):
        with self.assertRaises(openai.BadRequestError):
            self.chat(n=17)
        with self.assertRaises(openai.BadRequestError):
            self.chat(max_tokens=100000)
        with self.assertRaises(openai.BadRequestError):
            self.chat(temperature=5)
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(extra_body={"top_k": "x"})
        self.assertIn("top_k", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="gpt-none", messages=USER)

    def test_logit_bias(self):
        lord = self.server.post("/tokenize", {"content": " LORD"})["tokens"]
        self.assertEqual(len(lord), 1, lord)
        text = self.server.post("/detokenize", {"tokens": lord * 5})["content"]
        r = self.client.completions.create(model=self.model, prompt="In the beginning", max_tokens=5,
                                           temperature=0, logit_bias={str(lord[0]): 100})
        self.assertEqual(r.choices[0].text, text)
        c = self.chat(max_tokens=5, logit_bias={str(lord[0]): 100})
        self.assertEqual(c.choices[0].message.content, text)
        for bad in ({"x": 1}, {str(lord[0]): 101}, {"-1": 5}, {"100000000": 1}):
            with self.assertRaises(openai.BadRequestError) as e:
                self.chat(max_tokens=1, logit_bias=bad)
            self.assertEqual(e.exception.param, "logit_bias", bad)

    def test_api_key_is_required(self):
        wrong = openai.OpenAI(base_url=self.server.url + "/v1", api_key="sk-wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            wrong.models.list()
        with self.assertRaises(openai.AuthenticationError):
            wrong.completions.create(model=self.model, prompt="x", max_tokens=1)

    def test_a_client_that_closes_its_stream_cancels_the_request(self):
        before = self.server.metrics()["metrale_requests_cancelled_total"]
        stream = self.client.completions.create(model=self.model, prompt="And", max_tokens=1000,
                                                stream=True, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()  # hang up mid-stream
        deadline = time.time() + 10
        while self.server.metrics()["metrale_requests_cancelled_total"] == before:
            self.assertLess(time.time(), deadline, "the server never cancelled the request")
            time.sleep(0.02)

    def test_concurrent_streams_equal_each_request_alone(self):
        prompts = ["And God said", "In the beginning", "The LORD is my shepherd", "And Moses",
                   "Blessed are", "Now the serpent", "And it came to pass", "Behold"]

        def stream(prompt):
            parts = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=24,
                                                   temperature=0, stream=True)
            return "".join(p.choices[0].text for p in parts if p.choices)

        alone = [self.client.completions.create(model=self.model, prompt=p, max_tokens=24,
                                                temperature=0).choices[0].text for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(stream, prompts))
        self.assertEqual(together, alone)


if __name__ == "__main__":
    unittest.main(verbosity=2)
