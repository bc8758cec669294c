"""Time to first token of an image chat through `metrale serve`: cold (an image the server has
not seen: the tower runs and the prompt is prefilled) and cached (the same image again: the
tower output comes from --vision-cache-mb's cache, the prompt's pages from the prefix cache).

  python3 bench/vision_serve_ttft.py [--model DIR] [--images A.png B.png ...] [--repeats N]

--model: a vision-language checkpoint with a tokenizer and chat template; default: the tiny
Qwen2-VL test fixture with the test's tokenizer (tests/python/test_vision_server.py), which
measures the serving path, not a real tower. Streams one request at a time, greedy, 8 tokens;
prints the median of each.
"""
import argparse
import base64
import json
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from metrale_server import Server  # noqa: E402

DEFAULT_IMAGES = [ROOT / "tests" / "data" / "vision" / "images" / n for n in (
    "photo_odd_301x201.png", "interlaced_rgb.png", "exif_orient6.png", "grey.png", "palette_trns.png")]


def ttft(server, image):
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    body = json.dumps({"model": server.model, "stream": True, "max_tokens": 8, "temperature": 0,
                       "ignore_eos": True, "messages": [{"role": "user", "content": [
                           {"type": "image_url", "image_url": {"url": url}},
                           {"type": "text", "text": "what is it?"}]}]}).encode()
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            if first is None and line.startswith(b"data: ") and b'"content":"' in line \
                    and b'"content":""' not in line:
                first = time.perf_counter() - start
    return first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--images", nargs="*", type=pathlib.Path, default=DEFAULT_IMAGES)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    tmp = None
    model = a.model
    if model is None:
        from test_vision_server import make_checkpoint
        tmp = tempfile.TemporaryDirectory()
        model = pathlib.Path(tmp.name)
        make_checkpoint(model)
    server = Server(model=model, chat_template=None)  # --threads 2
    try:
        cold, cached = [], []
        for image in a.images:
            cold.append(ttft(server, image))
            cached += [ttft(server, image) for _ in range(a.repeats)]
        print(f"cold   TTFT: median {statistics.median(cold) * 1e3:.1f} ms over {len(cold)} images")
        print(f"cached TTFT: median {statistics.median(cached) * 1e3:.1f} ms over {len(cached)} requests")
    finally:
        server.stop()
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
