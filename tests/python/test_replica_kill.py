"""A replica killed with SIGKILL under load behind the real vllm-router (test_router.py's setup):
16 clients send greedy chat and completion requests, streamed and not, through the router; two
seconds in, one of the two replicas is SIGKILLed. No client hangs (each request has a deadline
it must not reach), every request either completed with the reply the same request gets alone or
failed with an error the client sees (an HTTP error status, a broken or truncated stream), each
counted; the survivor serves everything sent after the router has noticed.

Skipped (exit 77) when there is no router venv (scripts/router-venv.sh makes it).
Run: build/venv/bin/python tests/python/test_replica_kill.py (ctest runs it).
"""
import concurrent.futures
import signal
import sys
import threading
import time
import unittest

import openai

from metrale_server import Server
from test_router import ROUTER_PY, Router

CLIENTS = 16
DURATION = 8  # seconds of load; the kill comes at 2 s
SYSTEM = "Thou art a scribe. Answer in the manner of the Scriptures, and speak of the LORD."
QUESTIONS = ["Who made the heaven?", "What said Moses?", "Where is Egypt?", "Who was Abraham?"]


def ask(client, i):
    """Request i's reply text (streamed or whole, chat or completion), raising on any error."""
    q = QUESTIONS[i % len(QUESTIONS)]
    stream = i % 2 == 1
    if i % 3 == 2:
        r = client.completions.create(model="demo", prompt=SYSTEM + " " + q, max_tokens=24,
                                      temperature=0, stream=stream)
        if not stream:
            return r.choices[0].text
        text, finish = "", None
        for c in r:
            if c.choices:
                text += c.choices[0].text or ""
                finish = c.choices[0].finish_reason or finish
    else:
        r = client.chat.completions.create(
            model="demo", messages=[{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": q}],
            max_tokens=24, temperature=0, stream=stream)
        if not stream:
            return r.choices[0].message.content
        text, finish = "", None
        for c in r:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
    if finish is None:
        raise ConnectionError("the stream ended without a finish_reason (truncated)")
    return text


class ReplicaKillTest(unittest.TestCase):
    def test_sigkill_under_load(self):
        if not ROUTER_PY.exists():
            print(f"skipped: no router venv at {ROUTER_PY.parent.parent} "
                  "(scripts/router-venv.sh makes it)")
            sys.exit(77)
        replicas = [Server("--max-seqs", "8") for _ in range(2)]
        router = None
        try:
            router = Router(replicas, "round_robin")
            direct = openai.OpenAI(base_url=replicas[1].url + "/v1", api_key="none",
                                   max_retries=0, timeout=60)
            want = {i: ask(direct, i) for i in range(12)}  # i % 12 fixes the request's kind
            routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0,
                                   timeout=30)
            lock = threading.Lock()
            counts = {"completed": 0, "failed": 0}
            errors = {}
            after_kill = {"completed": 0, "failed": 0}
            killed_at = [None]
            t0 = time.monotonic()

            def client(c):
                i = c
                while time.monotonic() - t0 < DURATION:
                    started = time.monotonic()
                    try:
                        text = ask(routed, i)
                        ok = True
                        self.assertEqual(text, want[i % 12], f"request {i}")
                    except AssertionError:
                        raise
                    except Exception as e:  # what the client raises: a status, a broken stream
                        ok = False
                        name = type(e).__name__
                        if isinstance(e, openai.APIStatusError):
                            name += f" {e.status_code}"
                    # The client's own timeout is 30 s; a request still open at 45 s is hung.
                    self.assertLess(time.monotonic() - started, 45, "a client hung")
                    with lock:
                        counts["completed" if ok else "failed"] += 1
                        if not ok:
                            errors[name] = errors.get(name, 0) + 1
                        if killed_at[0] is not None and started > killed_at[0] + 1:
                            after_kill["completed" if ok else "failed"] += 1
                    i += CLIENTS

            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                futures = [pool.submit(client, c) for c in range(CLIENTS)]
                time.sleep(2)
                replicas[0].proc.send_signal(signal.SIGKILL)
                killed_at[0] = time.monotonic()
                for f in futures:
                    f.result(timeout=DURATION + 60)
            self.assertEqual(replicas[0].proc.wait(timeout=10), -signal.SIGKILL)
            total = counts["completed"] + counts["failed"]
            self.assertGreater(counts["completed"], 0)
            # Requests started a second after the kill: the router has marked the dead replica
            # down (connection refused) and sends them to the survivor.
            self.assertGreater(after_kill["completed"], 0)
            print(f"\n{total} requests through vllm-router with a replica SIGKILLed under "
                  f"{CLIENTS} clients: {counts['completed']} completed (each equal to the "
                  f"request alone), {counts['failed']} failed cleanly {errors}, 0 hung; "
                  f"started >1 s after the kill: {after_kill}")
        finally:
            if router is not None:
                router.stop()
            for r in replicas:
                r.stop()


if __name__ == "__main__":
    unittest.main()
