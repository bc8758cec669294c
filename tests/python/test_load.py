"""Load: 32 concurrent streaming clients send 256 greedy chat requests that share a system
prompt (the prefix cache's case). No request may be lost or fail, every stream's text and
token count must equal the same request run alone, and the server's memory must stay bounded
(its RSS, read from /proc, does not grow across a second identical wave).

Run: build/venv/bin/python tests/python/test_load.py (ctest runs it).
"""
import concurrent.futures
import threading
import time
import unittest

import openai

from metrale_server import Server

CLIENTS = 32
WAVE = 128  # requests per wave; two waves
SYSTEM = ("Thou art a scribe of the King James Bible. Answer in the manner of the Scriptures, "
          "in few words, and speak of the LORD and of his prophets.")
QUESTIONS = ["Who made the heaven?", "What said Moses?", "Where is Egypt?", "Who is the LORD?",
             "What is the law?", "Who was Abraham?", "What did David sing?", "Where went Jacob?"]
MAX_TOKENS = [8, 20, 33]


def distinct_requests():
    return [(q, n) for q in QUESTIONS for n in MAX_TOKENS]


class LoadTest(unittest.TestCase):
    def test_many_concurrent_streams(self):
        server = Server("--max-seqs", "16")
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                   timeout=120)

            def messages(q):
                return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]

            def stream(req):
                q, n = req
                chunks = client.chat.completions.create(
                    model=server.model, messages=messages(q), max_tokens=n, temperature=0,
                    stream=True, stream_options={"include_usage": True})
                text, usage, finish = "", None, None
                for c in chunks:
                    if c.usage is not None:
                        usage = c.usage
                    if c.choices:
                        text += c.choices[0].delta.content or ""
                        finish = c.choices[0].finish_reason or finish
                return text, usage.completion_tokens, finish

            # Each distinct request alone, one at a time: the reference.
            reference = {req: stream(req) for req in distinct_requests()}
            for (q, n), (text, tokens, finish) in reference.items():
                self.assertTrue(text, q)
                self.assertLessEqual(tokens, n)

            peak = [server.rss_kib()]
            done = threading.Event()

            def watch_rss():
                while not done.is_set():
                    peak[0] = max(peak[0], server.rss_kib())
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch_rss)
            watcher.start()
            reqs = distinct_requests()
            rss_after = []
            started = time.time()
            try:
                for wave in range(2):
                    batch = [reqs[(i * 7 + wave) % len(reqs)] for i in range(WAVE)]
                    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                        results = list(pool.map(stream, batch))
                    self.assertEqual(len(results), WAVE)  # none lost
                    for req, got in zip(batch, results):
                        self.assertEqual(got, reference[req], req)
                    rss_after.append(server.rss_kib())
            finally:
                done.set()
                watcher.join()
            elapsed = time.time() - started

            metrics = server.metrics()
            self.assertEqual(metrics["metrale_requests_failed_total"], 0)
            self.assertEqual(metrics["metrale_requests_rejected_total"], 0)
            self.assertEqual(metrics["metrale_requests_cancelled_total"], 0)
            self.assertEqual(metrics["metrale_requests_finished_total"], 2 * WAVE + len(reference))
            # The shared system prompt (and each repeated request) comes from the prefix cache.
            self.assertGreater(metrics["metrale_prefix_cache_hits_total"], WAVE)
            self.assertGreater(metrics["metrale_prefix_cache_tokens_saved_total"], 0)
            # Memory: a bounded pool of pages and threads, not per-request growth. The second
            # wave repeats the first's requests, so a leak would show as growth between them.
            self.assertLess(peak[0], 1024 * 1024, "peak RSS over 1 GiB")
            self.assertLess(rss_after[1] - rss_after[0], 32 * 1024,
                            f"RSS grew {rss_after[1] - rss_after[0]} KiB across a repeated wave")
            print(f"\n{2 * WAVE} streamed requests from {CLIENTS} clients in {elapsed:.1f} s; "
                  f"peak RSS {peak[0] // 1024} MiB, after each wave {[r // 1024 for r in rss_after]} MiB; "
                  f"prefix cache: {metrics['metrale_prefix_cache_hits_total']:.0f} hits, "
                  f"{metrics['metrale_prefix_cache_tokens_saved_total']:.0f} tokens saved")
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
