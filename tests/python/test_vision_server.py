"""Images and videos through `metrale serve` with the official OpenAI client, on the tiny
Qwen2-VL the parity tests use (tests/data/fixtures/qwen2_vl_f32, which ships no tokenizer: this
test gives it a small byte-level one whose vision tokens sit at the config's ids, and a Qwen-style
chat template). An image chat, whole and streamed, equals `metrale generate --image` on the
same rendered prompt; a video (on Qwen2-VL, and on the tiny Qwen3-VL, whose prompt spells each
frame's timestamp), data: and file:// URLs; the tower's output and the prompt's pages
come from the caches the second time; refusals (a file outside --allowed-media-dir, an http URL,
too many items, corrupt bytes, media to a text-only model) are 400s naming the part, and the
server keeps serving. An image inside a multi-turn chat on the tiny Qwen2.5-VL and Qwen3-VL, with
their own chat_template.jinja: turn 1, then turn 1 + the answer + turn 2 (a text follow-up, and
one bringing a second image), whole and streamed, equal transformers' greedy tokens
(chat.safetensors, tools/fixtures/models/vision_chat_fixtures.py); turn 2 does not encode the
image of turn 1 again and its cached prefix covers it. GLM-4V (tests/data/fixtures/glm4v_f32, its
synthetic tokenizer, GLM_TEST_TEMPLATE): an image chat and a video chat give transformers'
greedy tokens for the fixture's prompts (tower.safetensors, video.safetensors).

Run: build/venv/bin/python tests/python/test_vision_server.py (ctest runs it).
"""
import array
import base64
import json
import re
import shutil
import subprocess
import tempfile
import unittest
import urllib.request
from pathlib import Path

import openai

from metrale_server import ROOT, Server, metrale_bin

FIXTURE = ROOT / "tests" / "data" / "fixtures" / "qwen2_vl_f32"
IMAGES = ROOT / "tests" / "data" / "vision" / "images"
VIDEOS = ROOT / "tests" / "data" / "vision" / "videos"
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A minimal GLM-4V-style chat template written for this test (not GLM-4.1V's own, which is not
# committed): "[gMASK]<sop>", each turn "<|role|>\n" and its content, images as
# <|begin_of_image|><|image|><|end_of_image|>, videos as
# <|begin_of_video|><|video|><|end_of_video|>: what glm4v_fixtures.py's chat texts hold.
GLM_TEST_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif p.type == 'video' %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIAL = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>", 250: "<|image_pad|>",
           251: "<|video_pad|>", 252: "<|vision_start|>", 253: "<|vision_end|>"}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_checkpoint(dest, fixture=FIXTURE):
    """The fixture plus a byte-level tokenizer over printable ASCII and newline (ids 3..; the
    other ids two letters each) and the chat template (the fixture's chat_template.jinja, which
    would win over it, left out)."""
    for f in fixture.iterdir():
        if f.name != "chat_template.jinja":
            shutil.copy(f, dest / f.name)
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: 3 + i for i, b in enumerate([10] + list(range(32, 127)))}
    # Every other id the model may pick decodes to two ASCII letters (encode never makes them).
    free = [i for i in range(3 + len(vocab), 256) if i not in SPECIAL]
    pairs = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    vocab.update({pair: i for pair, i in zip(pairs, free)})
    vocab.update({c: i for i, c in SPECIAL.items()})  # (added tokens outside it get new ids)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, c in sorted(SPECIAL.items())],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    (dest / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": TEMPLATE}))


def data_url(path, mime):
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def render(question, media_token):
    """TEMPLATE's text for one user turn: the media, then the question."""
    pad = f"<|vision_start|><|{media_token}_pad|><|vision_end|>"
    return f"<|im_start|>user\n{pad}{question}<|im_end|>\n<|im_start|>assistant\n"


def generate(model, prompt, flag, media):
    out = subprocess.run([metrale_bin(), "generate", "--model", str(model), "--prompt", prompt,
                          "--no-special", flag, str(media), "-n", "8", "--ignore-eos", "--json",
                          "--threads", "2"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_f32(path, name, typecode="f"):
    """One f32 tensor of a safetensors file (typecode "q": an i64 one): (shape, values)."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])[name]
    begin, end = info["data_offsets"]
    values = array.array(typecode, raw[8 + n + begin:8 + n + end])
    return info["shape"], values


def safetensors_metadata(path):
    raw = Path(path).read_bytes()
    return json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])["__metadata__"]


def metric(server, name):
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    return int(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)))


class VisionServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="metrale_vision_"))
        cls.model = cls.tmp / "model"
        cls.model.mkdir()
        make_checkpoint(cls.model)
        cls.media = cls.tmp / "media"
        cls.media.mkdir()
        shutil.copy(IMAGES / "photo_odd_301x201.png", cls.media / "photo.png")
        cls.server = Server("--allowed-media-dir", str(cls.media), "--max-media-items", "2",
                            model=cls.model, chat_template=None)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp)

    def chat(self, parts, **kw):
        return self.client.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": parts}],
            max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True, "skip_special_tokens": False}, **kw)

    def detokenize(self, ids):
        return self.server.post("/detokenize", {"tokens": ids})["content"]

    def test_image_chat_equals_generate(self):
        ref = generate(self.model, render("what is it?", "image"), "--image",
                       self.media / "photo.png")
        want = self.detokenize(ref["ids"])
        # `metrale forward --image` on the same prompt: the tower's rows, the expanded prompt,
        # and logits whose last row picks generate's first token.
        out = self.tmp / "forward.safetensors"
        subprocess.run([metrale_bin(), "forward", "--model", str(self.model), "--prompt",
                        render("what is it?", "image"), "--image", str(self.media / "photo.png"),
                        "-o", str(out), "--threads", "2"], check=True, capture_output=True)
        shape, logits = read_f32(out, "logits")
        self.assertEqual(shape[0], len(ref["prompt_ids"]))
        last = logits[(shape[0] - 1) * shape[1]:]
        self.assertEqual(max(range(shape[1]), key=lambda i: last[i]), ref["ids"][0])
        vision_shape, _ = read_f32(out, "vision")
        self.assertEqual(vision_shape[0], ref["prompt_ids"].count(250))
        url = data_url(self.media / "photo.png", "image/png")
        whole = self.chat([image_part(url), {"type": "text", "text": "what is it?"}])
        self.assertEqual(whole.choices[0].message.content, want)
        self.assertEqual(whole.usage.completion_tokens, 8)
        self.assertEqual(whole.usage.prompt_tokens, len(ref["prompt_ids"]))
        streamed = "".join(c.choices[0].delta.content or "" for c in self.chat(
            [image_part(url), {"type": "text", "text": "what is it?"}], stream=True) if c.choices)
        self.assertEqual(streamed, want)
        # The same image as a file:// URL: the same reply, its tower output and pages cached.
        encoded = metric(self.server, "metrale_media_encoded_total")
        by_file = self.chat([image_part("file://" + str(self.media / "photo.png")),
                             {"type": "text", "text": "what is it?"}])
        self.assertEqual(by_file.choices[0].message.content, want)
        self.assertEqual(metric(self.server, "metrale_media_encoded_total"), encoded)
        self.assertGreater(by_file.usage.prompt_tokens_details.cached_tokens, 0)

    def test_video_chat_equals_generate(self):
        want = self.detokenize(generate(self.model, render("and this?", "video"), "--video",
                                        IMAGES / "anim.gif")["ids"])
        got = self.chat([{"type": "video_url", "video_url": {"url": data_url(
            IMAGES / "anim.gif", "image/gif")}}, {"type": "text", "text": "and this?"}])
        self.assertEqual(got.choices[0].message.content, want)

    def test_qwen3_vl_video_chat_equals_generate(self):
        """Qwen3-VL writes a timestamp before each frame: the server's prompt is generate's."""
        model = self.tmp / "qwen3_vl"
        model.mkdir()
        make_checkpoint(model, FIXTURE.parent / "qwen3_vl_f32")
        ref = generate(model, render("and this?", "video"), "--video", IMAGES / "anim.gif")
        server = Server(model=model, chat_template=None)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            got = client.chat.completions.create(
                model=server.model, max_tokens=8, temperature=0,
                extra_body={"ignore_eos": True, "skip_special_tokens": False},
                messages=[{"role": "user", "content": [
                    {"type": "video_url", "video_url": {"url": data_url(IMAGES / "anim.gif",
                                                                        "image/gif")}},
                    {"type": "text", "text": "and this?"}]}])
            want = server.post("/detokenize", {"tokens": ref["ids"]})["content"]
            self.assertEqual(got.choices[0].message.content, want)
            self.assertEqual(got.usage.prompt_tokens, len(ref["prompt_ids"]))
        finally:
            server.stop()

    def test_glm4v_image_and_video_chats_equal_transformers(self):
        """GLM-4V through the server: the fixture's image prompt and video prompt (GLM_TEST_TEMPLATE
        renders the fixture's chat texts) give transformers' 10 greedy tokens."""
        model = self.tmp / "glm4v"
        model.mkdir()
        fixture = FIXTURE.parent / "glm4v_f32"
        for f in fixture.iterdir():
            shutil.copy(f, model / f.name)
        (model / "tokenizer_config.json").write_text(json.dumps(
            {"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
             "chat_template": GLM_TEST_TEMPLATE}))
        server = Server(model=model, chat_template=None)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            for ref, case, part, question in (
                    ("tower.safetensors", "one_image.",
                     image_part(data_url(IMAGES / "photo_chelsea.jpg", "image/jpeg")),
                     "What is it?"),
                    ("video.safetensors", "", {"type": "video_url", "video_url": {
                        "url": data_url(IMAGES / "anim.gif", "image/gif")}}, "What happens?")):
                meta = safetensors_metadata(fixture / ref)
                self.assertIn(question + "<|assistant|>", meta[case + "text"])
                _, ids = read_f32(fixture / ref, case + "ids", "q")
                _, greedy = read_f32(fixture / ref, case + "greedy", "q")
                got = client.chat.completions.create(
                    model=server.model, max_tokens=10, temperature=0,
                    extra_body={"ignore_eos": True, "skip_special_tokens": False},
                    messages=[{"role": "user", "content": [
                        part, {"type": "text", "text": question}]}])
                want = server.post("/detokenize", {"tokens": list(greedy)})["content"]
                self.assertEqual(got.choices[0].message.content, want, ref)
                self.assertEqual(got.usage.prompt_tokens, len(ids), ref)
        finally:
            server.stop()

    def test_multi_turn_image_chat_equals_transformers(self):
        """Turn 1 (an image and a question), then the conversation again with the answer and a
        follow-up, then one whose follow-up brings a second image: each reply, whole and
        streamed, is transformers' greedy continuation of the processor's prompt."""
        images = [data_url(IMAGES / "photo_chelsea.jpg", "image/jpeg"),
                  data_url(IMAGES / "grey16.png", "image/png")]
        # Qwen3-VL's server keeps no tower output (--vision-cache-mb 0): turn 2 still encodes
        # no image of turn 1, whose rows lie inside the cached prefix it adopts.
        for name, flags in (("qwen2_5_vl_f32", []), ("qwen3_vl_f32", ["--vision-cache-mb", "0"])):
            fixture = FIXTURE.parent / name
            ref = fixture / "chat.safetensors"
            meta = safetensors_metadata(ref)
            server = Server(*flags, model=fixture, chat_template=None)
            try:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
                encoded = []
                for case in ("turn1", "followup", "second_image"):
                    # The fixture's messages, each image part as the client sends it.
                    messages, k = json.loads(meta[case + ".messages"]), 0
                    for m in messages:
                        if isinstance(m["content"], list):
                            for i, part in enumerate(m["content"]):
                                if part["type"] == "image":
                                    m["content"][i] = image_part(images[k])
                                    k += 1
                    kw = dict(model=server.model, messages=messages, max_tokens=10, temperature=0,
                              extra_body={"ignore_eos": True, "skip_special_tokens": False,
                                          "chat_template_kwargs": json.loads(
                                              meta["chat_template_kwargs"])})
                    _, greedy = read_f32(ref, case + ".greedy", "q")
                    _, ids = read_f32(ref, case + ".ids", "q")
                    want = server.post("/detokenize", {"tokens": list(greedy)})["content"]
                    whole = client.chat.completions.create(**kw)
                    self.assertEqual(whole.choices[0].message.content, want, (name, case))
                    self.assertEqual(whole.usage.prompt_tokens, len(ids), (name, case))
                    encoded.append(metric(server, "metrale_media_encoded_total"))
                    if case != "turn1":  # the prefix cache reaches past turn 1's image
                        first = list(read_f32(ref, "turn1.ids", "q")[1])
                        after_image = len(first) - first[::-1].index(250)
                        self.assertGreaterEqual(whole.usage.prompt_tokens_details.cached_tokens,
                                                after_image, (name, case))
                    streamed = "".join(c.choices[0].delta.content or ""
                                       for c in client.chat.completions.create(**kw, stream=True)
                                       if c.choices)
                    self.assertEqual(streamed, want, (name, case))
                # Turn 1's image is encoded once; second_image's new image once more.
                self.assertEqual(encoded, [1, 1, 2], name)
            finally:
                server.stop()

    def refused(self, parts, *needles):
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(parts)
        for n in needles:
            self.assertIn(n, str(e.exception))

    def test_refusals_name_the_part(self):
        png = data_url(self.media / "photo.png", "image/png")
        self.refused([image_part("file://" + str(self.model / "config.json"))],
                     "messages[0].content[0].image_url", "outside the directories")
        self.refused([image_part("file://" + str(self.media) + "/../model/config.json")],
                     "messages[0].content[0].image_url", "'..'")
        self.refused([{"type": "text", "text": "x"}, image_part("https://example.com/a.png")],
                     "messages[0].content[1].image_url", "not fetched")
        self.refused([image_part(png)] * 3, "messages[0].content[2].image_url", "at most 2")
        self.refused([image_part(data_url(IMAGES / "bad" / "truncated.jpg", "image/jpeg"))],
                     "messages[0].content[0].image_url")
        # Still serving.
        self.assertEqual(self.chat([image_part(png)]).usage.completion_tokens, 8)

    def test_text_only_model_refuses_media(self):
        demo = Server()
        try:
            client = openai.OpenAI(base_url=demo.url + "/v1", api_key="none")
            with self.assertRaises(openai.BadRequestError) as e:
                client.chat.completions.create(
                    model=demo.model, max_tokens=2, messages=[{"role": "user", "content": [
                        image_part(data_url(IMAGES / "grey.png", "image/png"))]}])
            self.assertIn("no vision tower", str(e.exception))
        finally:
            demo.stop()


if __name__ == "__main__":
    unittest.main()
