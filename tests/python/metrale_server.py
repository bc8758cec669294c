"""Starts `metrale serve` (on the demo model unless told otherwise) for the Python tests and stops it afterwards.

The binary is $METRALE_BIN (ctest sets it) or build/release/src/metrale; the server takes any
free port (--port 0) and prints its URL, which is read back here.
"""
import json
import os
import pathlib
import re
import subprocess
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
# The demo checkpoint ships no chat template; any real one renders (its markers are plain text
# to the demo tokenizer).
CHAT_TEMPLATE = ROOT / "tests" / "data" / "chat_templates" / "Qwen3-Coder.jinja"


def metrale_bin():
    return os.environ.get("METRALE_BIN", str(ROOT / "build" / "release" / "src" / "metrale"))


class Server:
    def __init__(self, *extra_args, api_key=None, model=DEMO, chat_template=CHAT_TEMPLATE):
        """chat_template=None: the checkpoint's own."""
        args = [metrale_bin(), "serve", "--model", str(model), "--port", "0", "--threads", "2"]
        if chat_template is not None:
            args += ["--chat-template", str(chat_template)]
        args += list(extra_args)
        if api_key:
            args += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # "metrale serve: demo on http://127.0.0.1:PORT/v1 ..."
        match = re.search(r"http://([\d.]+):(\d+)/v1", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"metrale serve did not start: {line!r} {self.proc.stderr.read()}")
        self.banner = line
        self.url = f"http://{match.group(1)}:{match.group(2)}"
        self.model = line.split(":", 1)[1].split(" on ")[0].strip()
        deadline = time.time() + 120  # a guard against hanging, generous for a cold CI machine
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("metrale serve never became healthy")

    @property
    def pid(self):
        return self.proc.pid

    def post(self, path, body):
        """POSTs JSON to a non-OpenAI endpoint (/tokenize, /detokenize); returns the JSON."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def metrics(self):
        """/metrics as {name: value} (unlabelled samples only)."""
        req = urllib.request.Request(self.url + "/metrics")
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()
                out[name] = float(value)
        return out

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a clean stop
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode
