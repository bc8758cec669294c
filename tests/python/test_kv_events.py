"""`metrale serve --kv-events-endpoint` publishes the prefix cache's KV-cache events on vLLM's
wire, read here as a vLLM subscriber reads them: a ZMQ SUB socket (pyzmq), 3-part messages
[topic, 8-byte big-endian sequence, payload], the payload decoded by msgspec with vLLM's own
struct definitions — vllm/distributed/kv_events.py's current ones (maps, the default
--kv-events-encoding) and the earlier array_like ones (as in vLLM's kv_events_subscriber
example; --kv-events-encoding array), and the array batch of maps between them
(--kv-events-encoding array-batch, what vllm-router 0.1.17 reads; test_router.py routes with it).

A prompt of 40 token ids generating 9 tokens leaves 3 whole pages of 16 in the cache: BlockStored
events whose token ids are those 48 tokens and whose hashes chain (each store's parent is the
previous page's hash); a second prompt sharing 2 pages hangs its new page under the second hash;
POST /flush_cache gives them all back: BlockRemoved of exactly the stored hashes, then
AllBlocksCleared. Sequence numbers run from 0 without gaps.

Run: build/venv/bin/python tests/python/test_kv_events.py (ctest runs it).
"""
import socket
import time
import unittest
import urllib.request
from typing import Any

import msgspec
import zmq
from msgspec.msgpack import Decoder

from metrale_server import Server


# vLLM's definitions (vllm/distributed/kv_events.py): the current ones (plain Structs, encoded
# as maps) ...
class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# ... and earlier releases' (array_like, as in vLLM's kv_events_subscriber example).
class ArrayEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class ArrayKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False,
                        tag=True):
    pass


class ArrayBlockStored(ArrayKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ArrayBlockRemoved(ArrayKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class ArrayAllBlocksCleared(ArrayKVCacheEvent, tag="AllBlocksCleared"):
    pass


class ArrayKVEventBatch(ArrayEventBatch):
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]


# ... and the releases between (an array_like batch of events as maps; vllm-router 0.1.17 reads
# these).
class MixedEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


ENCODINGS = {
    "map": (KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared),
    "array-batch": (MixedEventBatch, BlockStored, BlockRemoved, AllBlocksCleared),
    "array": (ArrayKVEventBatch, ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared),
}


TOPIC = b"kv@127.0.0.1@demo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KvEventsTest(unittest.TestCase):
    def test_a_vllm_subscriber_reads_the_maps_current_vllm_writes(self):
        self.check("map")

    def test_an_earlier_vllm_subscriber_reads_the_arrays(self):
        self.check("array")

    def test_the_array_batch_of_maps_reads_too(self):
        self.check("array-batch")

    def check(self, encoding):
        batch_type, BlockStored, BlockRemoved, AllBlocksCleared = ENCODINGS[encoding]
        port = free_port()
        server = Server("--kv-events-endpoint", f"tcp://127.0.0.1:{port}", "--kv-events-topic",
                        TOPIC.decode(), "--kv-events-encoding", encoding)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.connect(f"tcp://127.0.0.1:{port}")
            sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            decoder = Decoder(type=batch_type)
            seqs = []

            def complete(ids, max_tokens=9):
                req = urllib.request.Request(
                    server.url + "/v1/completions",
                    data=msgspec.json.encode({"prompt": ids, "max_tokens": max_tokens,
                                              "ignore_eos": True, "temperature": 0}),
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    self.assertEqual(r.status, 200)

            def receive(until, what):
                """Events until `until(events)` holds (waiting at most 30 s: a hang guard)."""
                events = []
                deadline = time.time() + 30
                while not until(events):
                    self.assertLess(time.time(), deadline, f"no {what}: got {events}")
                    if sub.poll(100):
                        topic, seq, payload = sub.recv_multipart()
                        self.assertEqual(topic, TOPIC)
                        self.assertEqual(len(seq), 8)
                        seqs.append(int.from_bytes(seq, "big"))
                        events += decoder.decode(payload).events
                return events

            # A SUB socket misses what is sent before its subscription arrives: send a warm-up
            # request until its events come through, then flush it away.
            for i in range(100):
                complete([2000 - i] * 20, 1)
                if sub.poll(300):
                    break
            receive(lambda e: any(isinstance(x, BlockStored) for x in e), "warm-up store")
            flush = urllib.request.Request(server.url + "/flush_cache", method="POST")
            urllib.request.urlopen(flush, timeout=30).close()
            receive(lambda e: any(isinstance(x, AllBlocksCleared) for x in e), "warm-up clear")

            prompt = list(range(1, 41))
            complete(prompt)

            def stored_pages(events):
                return sum(len(x.block_hashes) for x in events if isinstance(x, BlockStored))
            first = receive(lambda e: stored_pages(e) >= 3, "stores")
            tokens, hashes, parent = [], [], None
            for e in first:
                self.assertIsInstance(e, BlockStored)
                self.assertEqual(e.block_size, 16)
                self.assertIsNone(e.lora_id)
                self.assertEqual(e.parent_block_hash, parent)
                self.assertEqual(len(e.token_ids), 16 * len(e.block_hashes))
                tokens += e.token_ids
                hashes += e.block_hashes
                parent = e.block_hashes[-1]
            self.assertEqual(len(tokens), 48)
            self.assertEqual(tokens[:40], prompt)
            self.assertEqual(len(set(hashes)), 3)

            other = prompt[:32] + list(range(100, 120))
            complete(other)
            # 52 + 9 tokens: 3 whole pages, of which the first 2 are cached already.
            branch = receive(lambda e: stored_pages(e) >= 1, "the branch's store")
            self.assertEqual(branch[0].parent_block_hash, hashes[1])
            self.assertEqual(branch[0].token_ids, list(range(100, 116)))
            stored = hashes + [h for e in branch for h in e.block_hashes]

            urllib.request.urlopen(flush, timeout=30).close()
            gone = receive(lambda e: any(isinstance(x, AllBlocksCleared) for x in e), "clear")
            removed = [h for e in gone if isinstance(e, BlockRemoved) for h in e.block_hashes]
            self.assertEqual(sorted(removed), sorted(stored))
            self.assertIsInstance(gone[-1], AllBlocksCleared)
            self.assertEqual(seqs, list(range(seqs[0], seqs[0] + len(seqs))), "a gap")
        finally:
            sub.close(0)
            ctx.term()
            self.assertEqual(server.stop(), 0)


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker


class KvEventsReplayTest(unittest.TestCase):
    """--kv-events-replay-endpoint: vLLM's replay socket. A subscriber that dropped its SUB
    socket for a while sees a gap in the sequence numbers when it comes back, asks the ROUTER
    (from a DEALER: [empty, start as 8 bytes big-endian]) for the batches from the first it
    missed and gets exactly those, byte for byte as a subscriber that never left read them,
    then the end marker; a number already evicted from the buffer (--kv-events-buffer-steps)
    is answered from the oldest batch kept, as vLLM's publisher does."""

    BUFFER = 32

    def test_a_subscriber_that_missed_batches_replays_exactly_those(self):
        port, replay_port = free_port(), free_port()
        server = Server("--kv-events-endpoint", f"tcp://127.0.0.1:{port}",
                        "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
                        "--kv-events-buffer-steps", str(self.BUFFER), "--kv-events-topic",
                        TOPIC.decode())
        ctx = zmq.Context()
        sockets = []

        def socket(kind, endpoint):
            s = ctx.socket(kind)
            sockets.append(s)
            s.connect(endpoint)
            if kind == zmq.SUB:
                s.setsockopt(zmq.SUBSCRIBE, TOPIC)
            return s

        try:
            prompts = iter(range(1, 10000))

            def complete():
                """A request for a prompt of its own: new pages, so at least one batch."""
                p = next(prompts)
                req = urllib.request.Request(
                    server.url + "/v1/completions",
                    data=msgspec.json.encode({"prompt": [p] * 20 + [p + 1] * 20,
                                              "max_tokens": 2, "temperature": 0}),
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    self.assertEqual(r.status, 200)

            def read(sub, seen):
                """One message from `sub` into seen {seq: payload}; its seq (None: none within
                100 ms)."""
                if not sub.poll(100):
                    return None
                topic, seq, payload = sub.recv_multipart()
                self.assertEqual(topic, TOPIC)
                seen[int.from_bytes(seq, "big")] = payload
                return int.from_bytes(seq, "big")

            def until_received(sub, seen, what):
                """Requests until `sub` receives a batch (a SUB misses what is sent before its
                subscription arrives); at most 100 tries: a hang guard."""
                for _ in range(100):
                    complete()
                    if read(sub, seen) is not None:
                        return
                self.fail(f"{what} never received a batch")

            def drain(sub, seen, upto):
                """Reads `sub` until it has every batch up to `upto` (at most 30 s)."""
                deadline = time.time() + 30
                while not all(s in seen for s in range(min(seen), upto + 1)):
                    self.assertLess(time.time(), deadline, f"batches up to {upto} never came")
                    read(sub, seen)

            def replay(dealer, start):
                """The replay from `start`: [(seq, payload)] up to the end marker."""
                dealer.send_multipart([b"", start.to_bytes(8, "big")])
                out = []
                while True:
                    self.assertTrue(dealer.poll(30000), f"no end marker replaying from {start} after {[s for s, _ in out]}")
                    empty, seq, payload = dealer.recv_multipart()
                    self.assertEqual(empty, b"")
                    if seq == END_SEQ:
                        self.assertEqual(payload, b"")
                        return out
                    out.append((int.from_bytes(seq, "big"), payload))

            # The reference never leaves; the other drops out and comes back.
            reference, ref = socket(zmq.SUB, f"tcp://127.0.0.1:{port}"), {}
            until_received(reference, ref, "the reference subscriber")
            lossy, got = socket(zmq.SUB, f"tcp://127.0.0.1:{port}"), {}
            until_received(lossy, got, "the lossy subscriber")
            last = max(got)
            drain(reference, ref, last)
            lossy.close(0)  # gone: what is published now it misses
            for _ in range(3):
                complete()
            lossy, back = socket(zmq.SUB, f"tcp://127.0.0.1:{port}"), {}
            until_received(lossy, back, "the subscriber come back")
            first_back = min(back)
            self.assertGreater(first_back, last + 1, "no gap: nothing was missed")
            dealer = socket(zmq.DEALER, f"tcp://127.0.0.1:{replay_port}")
            replayed = replay(dealer, last + 1)
            seqs = [s for s, _ in replayed]
            # Every batch from the first missed to the newest, in order: the missed ones and
            # whatever was sent since (a subscriber skips those it has).
            self.assertEqual(seqs[0], last + 1)
            self.assertEqual(seqs, list(range(last + 1, last + 1 + len(seqs))))
            self.assertGreaterEqual(seqs[-1], first_back - 1)
            self.assertLessEqual(len(seqs), self.BUFFER)
            drain(reference, ref, seqs[-1])
            for s, payload in replayed:
                self.assertEqual(payload, ref[s], f"replayed batch {s} differs from the live one")
            # The missed batches are real events: the prefix cache's stores.
            missed = [ev for s, p in replayed if s < first_back
                      for ev in msgspec.msgpack.Decoder(type=KVEventBatch).decode(p).events]
            self.assertTrue(any(isinstance(e, BlockStored) for e in missed), missed)

            # Past the buffer: from 0, long evicted, the reply starts at the oldest batch kept.
            while max(ref) < 2 * self.BUFFER:
                complete()
                drain(reference, ref, max(ref) + 1)
            newest = max(ref)
            replayed = replay(dealer, 0)
            seqs = [s for s, _ in replayed]
            self.assertEqual(len(seqs), self.BUFFER)
            self.assertGreaterEqual(seqs[-1], newest)
            self.assertEqual(seqs, list(range(seqs[-1] - self.BUFFER + 1, seqs[-1] + 1)))
            self.assertGreater(seqs[0], 0, "evicted batches were replayed")
            drain(reference, ref, seqs[-1])
            for s, payload in replayed:
                self.assertEqual(payload, ref[s])
            # Beyond the newest: the end marker alone.
            self.assertEqual(replay(dealer, seqs[-1] + 1000), [])
            # A request of another shape (no empty delimiter) gets no reply, and the socket
            # still answers the next: the first reply to come is that one's.
            dealer.send(seqs[-1].to_bytes(8, "big"))
            self.assertEqual([s for s, _ in replay(dealer, seqs[-1])], [seqs[-1]])
        finally:
            for s in sockets:
                s.close(0)
            ctx.term()
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
