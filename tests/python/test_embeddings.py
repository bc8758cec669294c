"""/v1/embeddings through `metrale serve` with the official OpenAI Python client, on the two
embedding fixtures (tests/data/fixtures/embedding: last-token pooling + Normalize, and mean
pooling, with sentence-transformers' references): client.embeddings.create with float, with the
client's default (it asks for base64 and decodes it) and with base64 asked for explicitly; token
id inputs; dimensions; embeddings while completions run in the same steps; bad requests are 400
naming the field.

Run: build/venv/bin/python tests/python/test_embeddings.py (ctest runs it).
"""
import base64
import json
import struct
import threading
import unittest

import openai

from metrale_server import ROOT, Server

FIXTURES = ROOT / "tests" / "data" / "fixtures" / "embedding"
TOLERANCE = 1e-5  # absolute, f32 (tests/engine/embedding_test.cc measures the same)


def reference(name):
    return json.loads((FIXTURES / name / "reference.json").read_text())


def decode(b64):
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


class EmbeddingsTest:
    """Shared by the two fixtures; subclasses set FIXTURE."""

    FIXTURE = None

    @classmethod
    def setUpClass(cls):
        cls.ref = reference(cls.FIXTURE)
        cls.server = Server("--max-seqs", "2", "--prefill-chunk", "16", model=FIXTURES / cls.FIXTURE,
                            chat_template=None)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def assert_close(self, got, want):
        self.assertEqual(len(got), len(want))
        for g, w in zip(got, want):
            self.assertEqual(len(g), len(w))
            self.assertLess(max(abs(a - b) for a, b in zip(g, w)), TOLERANCE)

    def create(self, **kw):
        kw.setdefault("model", self.server.model)
        kw.setdefault("input", self.ref["texts"])
        return self.client.embeddings.create(**kw)

    def test_float_equals_sentence_transformers(self):
        self.assertIn(f"embeddings: {self.ref['pooling']}", self.server.banner)
        r = self.create(encoding_format="float")
        self.assertEqual(r.object, "list")
        self.assertEqual(r.model, self.server.model)
        self.assertEqual([d.index for d in r.data], list(range(len(self.ref["texts"]))))
        self.assertTrue(all(d.object == "embedding" for d in r.data))
        self.assert_close([d.embedding for d in r.data], self.ref["embeddings"])
        tokens = sum(len(ids) for ids in self.ref["ids"])
        self.assertEqual(r.usage.prompt_tokens, tokens)
        self.assertEqual(r.usage.total_tokens, tokens)

    def test_base64_is_the_same_floats(self):
        floats = [d.embedding for d in self.create(encoding_format="float").data]
        # Without encoding_format the client asks for base64 and decodes it into floats.
        self.assertEqual([d.embedding for d in self.create().data], floats)
        raw = self.create(encoding_format="base64").data
        self.assertTrue(all(isinstance(d.embedding, str) for d in raw))
        self.assertEqual([decode(d.embedding) for d in raw], floats)

    def test_dimensions_cut_as_the_reference(self):
        d = self.ref["dimensions"]
        r = self.create(encoding_format="float", dimensions=d)
        self.assert_close([x.embedding for x in r.data], self.ref["embeddings_dimensions"])
        if self.ref["normalize"]:
            for x in r.data:
                self.assertAlmostEqual(sum(v * v for v in x.embedding), 1.0, places=5)

    def test_token_ids_equal_the_texts(self):
        by_text = [d.embedding for d in self.create(encoding_format="float").data]
        by_ids = self.create(input=self.ref["ids"], encoding_format="float")
        self.assertEqual([d.embedding for d in by_ids.data], by_text)
        one = self.create(input=self.ref["ids"][2], encoding_format="float")
        self.assertEqual(one.data[0].embedding, by_text[2])
        single = self.create(input=self.ref["texts"][2], encoding_format="float")
        self.assertEqual(single.data[0].embedding, by_text[2])

    def test_embeddings_beside_completions(self):
        want = [d.embedding for d in self.create(encoding_format="float").data]
        errors = []

        def complete():
            try:
                c = self.client.completions.create(model=self.server.model, prompt="abc", max_tokens=48,
                                                   temperature=0, extra_body={"ignore_eos": True})
                if c.usage.completion_tokens != 48:
                    errors.append(f"completion gave {c.usage.completion_tokens} tokens")
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=complete) for _ in range(2)]
        for t in threads:
            t.start()
        got = [[d.embedding for d in self.create(encoding_format="float").data] for _ in range(3)]
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for g in got:
            self.assertEqual(g, want)

    def test_bad_requests_are_400_naming_the_field(self):
        cases = [
            (dict(input=[]), "input"),
            (dict(input=[""]), "input"),
            (dict(input=[[1, 2], "x"]), "input"),
            (dict(input="x", dimensions=10000), "dimensions"),
            (dict(input="a" * 300), "input"),
            (dict(input=[[1, 99999]]), "input"),
        ]
        for kw, param in cases:
            with self.subTest(kw=str(kw)[:60]):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.create(**kw)
                self.assertEqual(cm.exception.body["param"], param)
        with self.assertRaises(openai.NotFoundError):
            self.create(model="no-such-model")
        # Still serving.
        self.assertEqual(len(self.create(input="ok").data), 1)


class LastTokenNormalize(EmbeddingsTest, unittest.TestCase):
    FIXTURE = "lasttoken"


class Mean(EmbeddingsTest, unittest.TestCase):
    FIXTURE = "mean"


if __name__ == "__main__":
    unittest.main()
