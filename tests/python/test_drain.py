"""SIGTERM drains `metrale serve`: the stream in flight finishes with its whole answer (equal to
the same request alone, greedy), /health turns 503 {"status": "draining"}, a new request gets
503 with Retry-After (what the OpenAI client raises), and the process exits 0 by itself. Past
--drain-timeout the stream still running ends with an error event the client raises, not a cut
connection. An invalid --drain-timeout is refused.

One stream slot (--max-seqs 1) and a request of several long choices (decoded one after another)
keep a stream in flight for seconds; the server's own log says how many were in flight when the
signal came, and the test requires one.

Run: build/venv/bin/python tests/python/test_drain.py (ctest runs it).
"""
import json
import signal
import subprocess
import unittest
import urllib.error
import urllib.request

import openai

from metrale_server import DEMO, Server, metrale_bin

PROMPT = "And God said"
TOKENS = 300
CHOICES = 4


def health(server):
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


class DrainTest(unittest.TestCase):
    def client(self, server):
        return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                             timeout=120)

    def long_stream(self, client, server):
        return client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=TOKENS, temperature=0, n=CHOICES,
            stream=True, extra_body={"ignore_eos": True})

    def test_sigterm_lets_the_stream_finish_and_refuses_new_requests(self):
        server = Server("--max-seqs", "1", "--drain-timeout", "120")
        try:
            client = self.client(server)
            alone = client.completions.create(model=server.model, prompt=PROMPT,
                                              max_tokens=TOKENS, temperature=0,
                                              extra_body={"ignore_eos": True})
            want = alone.choices[0].text
            stream = iter(self.long_stream(client, server))
            texts = [""] * CHOICES
            finishes = [None] * CHOICES
            first = next(stream)  # the stream is running
            texts[first.choices[0].index] += first.choices[0].text

            server.proc.send_signal(signal.SIGTERM)
            status, body = None, None
            for _ in range(200):  # until the signal is handled
                status, body, headers = health(server)
                if status == 503:
                    break
            self.assertEqual(status, 503)
            self.assertEqual(body["status"], "draining")
            self.assertGreaterEqual(int(headers["Retry-After"]), 1)
            with self.assertRaises(openai.APIStatusError) as refused:
                client.completions.create(model=server.model, prompt="And", max_tokens=2)
            self.assertEqual(refused.exception.status_code, 503)
            self.assertEqual(refused.exception.code, "server_draining")
            self.assertGreaterEqual(int(refused.exception.response.headers["retry-after"]), 1)

            for chunk in stream:  # the stream in flight runs to its end
                for c in chunk.choices:
                    texts[c.index] += c.text
                    finishes[c.index] = c.finish_reason or finishes[c.index]
            self.assertEqual(texts, [want] * CHOICES)
            self.assertEqual(finishes, ["length"] * CHOICES)
            self.assertEqual(server.proc.wait(timeout=60), 0)
            log = server.proc.stderr.read()
            self.assertIn("draining (1 requests in flight", log)
            self.assertIn("drained (0 requests ended at the timeout)", log)
        finally:
            server.stop()

    def test_past_the_drain_timeout_the_stream_ends_cleanly(self):
        server = Server("--max-seqs", "1", "--drain-timeout", "0")
        try:
            client = self.client(server)
            stream = iter(self.long_stream(client, server))
            next(stream)
            server.proc.send_signal(signal.SIGTERM)
            with self.assertRaises(openai.APIError) as ended:
                for _ in stream:
                    pass
            self.assertIn("shut down", str(ended.exception))
            self.assertEqual(server.proc.wait(timeout=60), 0)
            self.assertIn("drained (1 requests ended at the timeout)", server.proc.stderr.read())
        finally:
            server.stop()

    def test_an_invalid_drain_timeout_is_refused(self):
        for bad in ("-1", "soon", "1e9"):
            run = subprocess.run([metrale_bin(), "serve", "--model", str(DEMO), "--port", "0",
                                  "--drain-timeout", bad], capture_output=True, text=True,
                                 timeout=60)
            self.assertNotEqual(run.returncode, 0, bad)
            self.assertIn("--drain-timeout", run.stderr + run.stdout, bad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
