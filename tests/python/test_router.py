"""Two `metrale serve` replicas behind the real vllm-router (pinned in router-requirements.txt,
installed by scripts/router-venv.sh) with its cache-aware policy, driven with the official OpenAI
client: every reply through the router equals the same request sent to a replica directly
(greedy); the router reads the replicas' endpoints (/get_load, /get_model_info, /flush_cache);
then the replica serving a stream (the one cache-aware routing prefers for the shared system
prompt) is sent SIGTERM: the stream finishes whole (the replica drains), and every new request
succeeds through the router: the draining replica's 503 opens its circuit and the router retries
on the other, before and after the replica is gone (with round-robin routing that path is
certain: a second test asserts it from the router's own counters). A third test runs its kv_aware
policy on the replicas' KV-cache events (--kv-events-endpoint): repeats of a prompt go to the
replica that holds its pages. A fourth shows cache_aware routing on the prompt tokens the
router asks each replica to render (POST /v1/chat/completions/render, /v1/completions/render).

Skipped (exit 77) when there is no router venv (scripts/router-venv.sh makes it).
Run: build/venv/bin/python tests/python/test_router.py (ctest runs it).
"""
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import openai

from metrale_server import ROOT, Server

ROUTER_PY = pathlib.Path(os.environ.get("METRALE_ROUTER_VENV", ROOT / "build" / "router-venv"))
ROUTER_PY = ROUTER_PY / "bin" / "python"
SYSTEM = "Thou art a scribe. Answer in the manner of the Scriptures, and speak of the LORD."
QUESTIONS = ["Who made the heaven?", "What said Moses?", "Where is Egypt?", "Who was Abraham?"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def running(server):
    """vllm:num_requests_running of a replica (what the routers' load policies read)."""
    status, text = get(server.url + "/metrics")
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no vllm:num_requests_running in {server.url}/metrics")


class Router:
    def __init__(self, workers, policy="cache_aware", extra=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")
        self.metrics_url = f"http://127.0.0.1:{free_port()}"
        args = [str(ROUTER_PY), str(ROOT / "tests" / "python" / "router_launch.py"),
                "--host", "127.0.0.1", "--port", str(self.port),
                "--prometheus-port", self.metrics_url.rsplit(":", 1)[1],
                "--worker-urls", *[w.url for w in workers], "--policy", policy, *extra,
                # One failed request opens a replica's circuit, so the retry goes to the
                # other; health checks are rare, so that is what keeps the clients whole.
                "--health-check-interval-secs", "60", "--health-failure-threshold", "1",
                "--health-check-timeout-secs", "2", "--cb-failure-threshold", "1",
                "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50",
                "--retry-max-backoff-ms", "500", "--worker-startup-check-interval", "1"]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60  # a guard against hanging
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the router exited: " + self.text())
            if get(self.url + "/readiness")[0] == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the router never became ready: " + self.text())

    def text(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@contextlib.contextmanager
def behind_router(replicas, policy="cache_aware", extra=()):
    """The router (started here) in front of `replicas`; on a failure its log goes to stderr;
    at the end the router and the replicas are stopped."""
    router = None
    try:
        router = Router(replicas, policy, extra)
        yield router
    except Exception:
        if router is not None:
            sys.stderr.write("router log:\n" + router.text())
        raise
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.stop()


class RouterTest(unittest.TestCase):
    def chat(self, client, q, **kw):
        r = client.chat.completions.create(
            model="demo", messages=[{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": q}],
            max_tokens=12, temperature=0, **kw)
        if kw.get("stream"):
            return "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        return r.choices[0].message.content

    def test_two_replicas_behind_vllm_router(self):
        replicas = [Server("--max-seqs", "4", "--drain-timeout", "60") for _ in range(2)]
        with behind_router(replicas) as router:
            direct = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key="none",
                                   max_retries=0, timeout=60)
            routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0,
                                   timeout=60)
            want = {q: self.chat(direct, q) for q in QUESTIONS}
            completion = direct.completions.create(model="demo", prompt="And God said",
                                                   max_tokens=10, temperature=0).choices[0].text
            long_chat = [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Tell of the flood."}]
            long_want = direct.chat.completions.create(
                model="demo", messages=long_chat, max_tokens=800, temperature=0,
                extra_body={"ignore_eos": True}).choices[0].message.content

            # Through the router: chat (whole and streamed) and completions, twice each.
            for _ in range(2):
                for q in QUESTIONS:
                    self.assertEqual(self.chat(routed, q), want[q], q)
                    self.assertEqual(self.chat(routed, q, stream=True), want[q], q)
                got = routed.completions.create(model="demo", prompt="And God said",
                                                max_tokens=10, temperature=0).choices[0].text
                self.assertEqual(got, completion)
            # Cache-aware routing sends a repeated prompt where its prefix is cached.
            hits = sum(r.metrics()["metrale_prefix_cache_hits_total"] for r in replicas)
            self.assertGreater(hits, 0)
            # The endpoints the router proxies or fans out.
            status, loads = get(router.url + "/get_loads")
            self.assertEqual(status, 200, loads)
            self.assertEqual(sorted(w["load"] for w in json.loads(loads)["workers"]), [0, 0])
            status, info = get(router.url + "/get_model_info")
            self.assertEqual(status, 200, info)
            self.assertEqual(json.loads(info)["model_type"], "qwen3")
            flush = urllib.request.Request(router.url + "/flush_cache", method="POST")
            with urllib.request.urlopen(flush, timeout=30) as r:
                self.assertEqual(r.status, 200)

            # A long chat stream through the router: cache-aware routing sends it to the
            # replica that holds the shared system prompt, which is then sent SIGTERM.
            stream = iter(routed.chat.completions.create(
                model="demo", messages=long_chat, max_tokens=800, temperature=0, n=3,
                stream=True, extra_body={"ignore_eos": True}))
            texts = [""] * 3
            while not any(texts):
                chunk = next(stream)
                for c in chunk.choices:
                    texts[c.index] += c.delta.content or ""
            # The running count is published once per scheduler loop: wait for it.
            deadline = time.monotonic() + 10
            while True:
                busy = [r for r in replicas if running(r) > 0]
                if busy or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(len(busy), 1, "one replica serves the stream")
            victim, survivor = busy[0], [r for r in replicas if r is not busy[0]][0]

            def read_rest():
                for chunk in stream:
                    for c in chunk.choices:
                        texts[c.index] += c.delta.content or ""

            # The rest of the stream is read beside the requests below: left unread, its 3 x 800
            # tokens of events can fill the sockets between the victim, the router and this
            # client, so the victim's writes block and its drain cannot end before its timeout.
            reader = threading.Thread(target=read_rest, daemon=True)
            reader.start()
            victim.proc.send_signal(signal.SIGTERM)
            # New requests meanwhile and after: the first goes where its prefix is cached, the
            # draining victim, which answers 503; the router opens the victim's circuit and
            # retries on the survivor. None fails, every reply is the same.
            # The victim may drain for up to its --drain-timeout (60 s: its stream of 3 x 800
            # tokens is slow when other tests load the machine), so the bound is a time past
            # that, not a request count.
            served, deadline = 0, time.monotonic() + 90
            while victim.proc.poll() is None or served < 8:
                q = QUESTIONS[served % len(QUESTIONS)]
                self.assertEqual(self.chat(routed, q, stream=served % 2 == 1), want[q], q)
                served += 1
                if time.monotonic() > deadline:
                    self.fail("the drained replica never exited")
            reader.join(timeout=120)
            self.assertFalse(reader.is_alive(), "the drained stream never ended")
            self.assertEqual(texts, [long_want] * 3)  # the stream in flight was drained, not cut
            self.assertEqual(victim.proc.wait(timeout=30), 0)
            self.assertIn("drained (0 requests ended", victim.proc.stderr.read())
            metrics = get(router.metrics_url + "/metrics")[1].splitlines()
            def total(prefix):
                return sum(float(line.rsplit(" ", 1)[1]) for line in metrics
                           if line.startswith(prefix))
            failures = total(f'vllm_router_cb_outcomes_total{{worker="{victim.url}",'
                             'outcome="failure"}')
            retries = total("vllm_router_retries_total")
            # Usually the first new request goes where its prefix is cached, the draining
            # replica, and is retried (test_round_robin_... makes sure of that path); on a
            # loaded machine the router may pick the other at once. Either way none failed.
            self.assertGreaterEqual(retries, failures)
            print(f"\n{served} requests served through the router while and after a replica "
                  f"drained, none failed; the router retried {retries:.0f} after "
                  f"{failures:.0f} failures on the draining replica")


    def test_round_robin_retries_a_draining_replicas_503(self):
        """Round-robin sends one of any two requests to each replica, so once a replica drains
        (held by a long stream sent to it directly) the router meets its 503: it opens that
        replica's circuit and retries on the other. Every request succeeds."""
        replicas = [Server("--drain-timeout", "60") for _ in range(2)]
        with behind_router(replicas, "round_robin") as router:
            victim, survivor = replicas
            held = openai.OpenAI(base_url=victim.url + "/v1", api_key="none", max_retries=0,
                                 timeout=60)
            stream = iter(held.completions.create(model="demo", prompt="And God said",
                                                  max_tokens=900, temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True}))
            next(stream)
            victim.proc.send_signal(signal.SIGTERM)
            for _ in range(600):  # until the victim's /health says it drains (a hang guard)
                if get(victim.url + "/health")[0] == 503:
                    break
                time.sleep(0.01)
            else:
                self.fail("the victim never reported draining")
            routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0,
                                   timeout=60)
            want = self.chat(routed, QUESTIONS[0])
            for i in range(6):
                self.assertEqual(self.chat(routed, QUESTIONS[0], stream=i % 2 == 1), want)
            metrics = get(router.metrics_url + "/metrics")[1]
            failures = total_of(metrics, f'vllm_router_cb_outcomes_total{{worker="{victim.url}",'
                                         'outcome="failure"}')
            self.assertGreaterEqual(failures, 1, "the router never met the draining replica")
            self.assertGreaterEqual(total_of(metrics, "vllm_router_retries_total"), failures)
            for _ in stream:  # the drained stream still ends whole
                pass
            self.assertEqual(victim.proc.wait(timeout=30), 0)

    def test_kv_aware_routing_follows_the_replicas_kv_events(self):
        """vllm-router's kv_aware policy subscribes to each replica's KV-cache events
        (--kv-events-endpoint) and sends a prompt where its pages are cached: every repeat of a
        prompt, once the router has indexed the first one's pages, lands on the replica that
        served the first, as a prefix-cache hit there."""
        ports = [free_port() for _ in range(2)]
        replicas = [Server("--kv-events-endpoint", f"tcp://127.0.0.1:{p}",
                           "--kv-events-encoding", "array-batch") for p in ports]
        sources = [arg for r, p in zip(replicas, ports)
                   for arg in ("--kv-event-source", f"{r.url}=tcp://127.0.0.1:{p}")]
        with behind_router(replicas, "kv_aware", sources + ["--kv-event-model", "demo"]) as router:
            direct = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key="none",
                                   max_retries=0, timeout=60)
            routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0,
                                   timeout=60)

            def complete(client, prompt):
                return client.completions.create(model="demo", prompt=prompt, max_tokens=4,
                                                 temperature=0).choices[0].text

            def counts(name):
                return [r.metrics()[name] for r in replicas]

            def index_hits():
                return total_of(get(router.metrics_url + "/metrics")[1],
                                'vllm_router_kv_placement_lookups_total{result="hit"}')

            # ZMQ drops what a publisher sends before a subscriber has joined, so the events of
            # the first requests may never reach the router: warm up with throwaway prompts
            # until its index has seen one (bounded), before the checks rely on it.
            for w in range(100):
                hits = index_hits()
                warm = [1500 + w] + [1000 + i for i in range(39)]  # distinct first pages
                complete(routed, warm)
                time.sleep(0.05)
                complete(routed, warm)
                if index_hits() > hits:
                    break
            else:
                self.fail("the router's KV index never saw a replica's events")
            replies = {}
            for k in range(3):
                prompt = [100 * k + i + 1 for i in range(40)]  # 2 whole pages and 8 tokens
                want = replies[k] = complete(routed, prompt)
                # Until the router has indexed the pages (its subscriber runs on its own), a
                # repeat may go anywhere (and cache the prompt there too): repeat until its
                # index reports a hit (bounded).
                hits = index_hits()
                for _ in range(100):
                    self.assertEqual(complete(routed, prompt), want)
                    if index_hits() > hits:
                        break
                    time.sleep(0.05)
                else:
                    self.fail("the router never found the prompt's pages in its KV index")
                # From then on every repeat goes to a replica that holds its pages, and adopts
                # them there as a prefix-cache hit.
                cached = counts("metrale_prefix_cache_hits_total")
                for _ in range(3):
                    self.assertEqual(complete(routed, prompt), want)
                now = counts("metrale_prefix_cache_hits_total")
                self.assertEqual(sum(now) - sum(cached), 3, f"prompt {k}: {cached} -> {now}")
            # Each reply equals the prompt sent to a replica directly (asked last, so that no
            # replica held a prompt the router did not place).
            for k, want in replies.items():
                self.assertEqual(complete(direct, [100 * k + i + 1 for i in range(40)]), want)


    def test_cache_aware_routing_reads_the_rendered_prompt_tokens(self):
        """vllm-router's cache_aware policy routes by a request's prompt tokens, which it asks
        the worker for (vLLM's Renderer API: POST /v1/chat/completions/render and
        /v1/completions/render); a worker that cannot render gets no prefix routing at all.
        Each system prompt's repeat is a prefix hit in the router's tree (its match rate over
        the rendered tokens passes the threshold) and lands where the first went, a prefix-cache
        hit there."""
        replicas = [Server() for _ in range(2)]
        with behind_router(replicas, "cache_aware") as router:
            routed = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0,
                                   timeout=60)
            systems = [f"Thou art scribe number {k}. " + " ".join([SYSTEM] * 6) for k in range(3)]

            def served_by(send):
                before = [r.metrics()["metrale_requests_finished_total"] for r in replicas]
                send()
                # The scheduler publishes its counters once per loop, which can come just after
                # the reply reached the client: wait for the count rather than read it once.
                deadline = time.monotonic() + 10
                while True:
                    after = [r.metrics()["metrale_requests_finished_total"] for r in replicas]
                    home = [i for i in range(2) if after[i] > before[i]]
                    if home or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                self.assertEqual(len(home), 1)
                return home[0]

            for k, system in enumerate(systems):
                def chat(q):
                    return lambda: routed.chat.completions.create(
                        model="demo", messages=[{"role": "system", "content": system},
                                                {"role": "user", "content": q}],
                        max_tokens=4, temperature=0)

                def complete(q):
                    return lambda: routed.completions.create(
                        model="demo", prompt=system + " " + q, max_tokens=4, temperature=0)

                # A repeat of each form (the chat's rendering and the bare text share no
                # prefix, so the two may go to different replicas) goes where its first went.
                for form in (chat, complete):
                    home = served_by(form(QUESTIONS[0]))
                    hits = replicas[home].metrics()["metrale_prefix_cache_hits_total"]
                    self.assertEqual(served_by(form(QUESTIONS[1])), home, f"prompt {k}")
                    self.assertGreater(
                        replicas[home].metrics()["metrale_prefix_cache_hits_total"], hits)
            metrics = get(router.metrics_url + "/metrics")[1]
            outcome = 'vllm_router_prefix_routing_decisions_total{policy="cache_aware",' \
                      'stage="regular",outcome='
            # The router renders each request on every candidate worker: 12 requests x 2.
            self.assertEqual(total_of(metrics, 'vllm_router_kv_routing_inputs_total'
                                      '{transport="http",result="render"}'), 24)
            # Every repeat is a hit in its tree (the first requests may be too: the template's
            # opening tokens are common to the chats).
            self.assertGreaterEqual(total_of(metrics, outcome + '"prefix_hit"'), 6)


def total_of(text, prefix):
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


if __name__ == "__main__":
    if not ROUTER_PY.exists():
        print(f"skipped: no router venv at {ROUTER_PY.parent.parent} (bash scripts/router-venv.sh "
              "makes it)")
        sys.exit(77)
    unittest.main(verbosity=2)
