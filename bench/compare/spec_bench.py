#!/usr/bin/env python3
"""Speculative decoding: metrale's MTP and n-gram drafting against its own plain decoding, and
n-gram drafting beside llama.cpp's prompt-lookup decoding (llama-lookup), in one run.

    python3 bench/compare/spec_bench.py --threads 2 --compute bf16 --decode-tokens 128 --reps 3 \
        --mtp-draft-tokens 1,2,3 --mtp-batch 1,4,16 --draft-ladder 4:3,8:3,16:0 \
        --ngram-draft-tokens 4 --out out/spec

The models: the trained demo pair padded to be memory-bound (tools/demo/pad_demo.py: the same
function, 181 MB / 174 MB of weights instead of 3.3 MB / 2.1 MB; made once under
--cache-dir). models/demo_mtp (DeepSeek-V3 with its MTP layer) for MTP; for n-gram
models/demo_copy (--ngram-model; models/demo fine-tuned to copy what its context holds,
tools/demo/train_demo_copy.py), a Qwen3 that llama.cpp converts (and this pin has no MTP
drafting to compare with).

(a) MTP, per --mtp-draft-tokens K: `metrale bench --speculative mtp --draft-tokens K
    --draft-ladder LADDER --batch B...` (the bench's greedy generation of --prompt by B streams,
    --decode-tokens new tokens each, without and with speculation, median of --reps timed runs
    after one warm-up, the output compared token for token).
(b) n-gram at batch 1, on an input-grounded task (--ngram-prompt edit: a passage the copy model
    never trained on, then its first words again, so the answer copies the prompt): the same
    `metrale bench` with --speculative ngram and --draft-tokens K;
    beside it llama-lookup -n N --spec-draft-n-max K and --spec-draft-n-max 0 (the same
    program drafting nothing: its plain decoding), each --reps times, interleaved, the median
    of its "decoded N tokens in S seconds" line. Both engines get --threads, greedy sampling
    (llama-lookup: --temp 0), the same prompt text (token ids compared), weights in anonymous
    memory (llama.cpp: -lm none; metrale: --weights copy, its default) and bf16 arithmetic
    (metrale --compute bf16 as llama.cpp's BF16 GGUF; pass --compute f32 for HF numerics).
    The greedy continuations are compared as text.
(c) MTP carry in `metrale serve --speculative mtp --draft-tokens 3`, once with --mtp-carry 1
    and once with 0 (a fresh server each): --carry-sessions sessions, each two streamed
    /v1/completions requests with the same session_id: turn 1 a KJV passage of
    --carry-words words (--carry-reply tokens generated), turn 2 = turn 1's prompt and reply
    plus the first --carry-words / 5 words of the next passage (8 tokens generated). Reported per mode: turn 2's time to first
    token (median over sessions) and the drafter rows turn 2 adopted / computed (the deltas of
    /metrics' metrale_mtp_carry_rows_adopted_total and metrale_drafter_prefill_rows_total).
    The target's prompt comes from the prefix cache in both modes; only the drafter differs.

results.json records every command, the versions (metrale commit, the llama.cpp pin), the
load average before each measurement and every figure; table.md holds the tables, headed by
the command. Timings are not pass/fail; a run whose speculative output differs from plain
decoding, in either engine, is reported (a metrale difference fails the run).
"""

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
sys.path.insert(0, str(REPO / "bench" / "compare"))
import llama_cpp_peer  # noqa: E402
from embed_bench import kjv_passages  # noqa: E402
from serve_bench import Server, free_port, http_json, stream_completion  # noqa: E402

# bench's default --spec-prompt (src/cli/bench.cc kDefaultSpecPrompt): Genesis 1:3-5 and the
# start of 1:6, with phrases a prompt-lookup drafter can copy.
PROMPT = ("And God said, Let there be light: and there was light. And God saw the light, that it "
          "was good: and God divided the light from the darkness. And God called the light Day, "
          "and the darkness he called Night. And the evening and the morning were the first day. "
          "And God said,")
ENCODED_RE = re.compile(r"encoded\s+(\d+) tokens")
# The n-gram part's input-grounded task (--ngram-prompt edit): a passage, then its first words
# again, so that the answer copies the prompt (tools/demo/train_demo_copy.py's first prompt).
# Revelation 21:3 lies in the last 60k tokens of the KJV stream, which train_demo_copy.py never
# trains on; it ends without its period so that the separator is a bare newline token.
PASSAGE = ("And I heard a great voice out of heaven saying, Behold, the tabernacle of God is with "
           "men, and he will dwell with them, and they shall be his people, and God himself shall "
           "be with them, and be their God")
EDIT_PROMPT = PASSAGE + "\nAnd I heard a great voice out"
DECODED_RE = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
STAT_RE = re.compile(r"^\S+ I (n_drafted|n_accept|n_predict)\s+=\s+(\d+)", re.M)


def log(msg: str) -> None:
    print(f"[spec_bench] {msg}", file=sys.stderr, flush=True)


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def git_commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                       text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True).stdout
    return r.stdout.strip() + ("-dirty" if dirty.strip() else "")


def run(cmd: list[str], commands: list) -> subprocess.CompletedProcess:
    commands.append(cmd)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"spec_bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def padded(cache: Path, source: str, name: str) -> Path:
    """The memory-bound copy of models/<source> (tools/demo/pad_demo.py, its defaults), made
    again when the source's weights changed (their sha256 is kept beside the copy)."""
    out = cache / name
    weights = REPO / "models" / source / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    stamp = out / "source.sha256"
    if not (out / "model.safetensors").is_file() or \
            not stamp.is_file() or stamp.read_text().strip() != digest:
        log(f"padding models/{source} -> {out}")
        subprocess.run([sys.executable, str(REPO / "tools" / "demo" / "pad_demo.py"), "--source",
                        str(REPO / "models" / source), "--out", str(out)], check=True)
        stamp.write_text(digest + "\n")
    return out


def metrale_bench(a, model: Path, kind: str, k: int, batches: list[int],
                  commands: list, prompt: str = PROMPT, extra: tuple = ()) -> dict:
    cmd = [a.bin, "bench", "--model", str(model), "--threads", str(a.threads), "--compute",
           a.compute, "--speculative", kind, "--draft-tokens", str(k), *extra, "--spec-prompt",
           prompt, "--batch", ",".join(map(str, batches)), "--prefill", "8", "--decode-tokens",
           str(a.decode_tokens), "--reps", str(a.reps), "--no-bandwidth", "--json"]
    if kind == "mtp" and a.draft_ladder:
        cmd[cmd.index("--batch"):cmd.index("--batch")] = ["--draft-ladder", a.draft_ladder]
    load = loadavg()
    j = json.loads(run(cmd, commands).stdout)
    rows = []
    for b in batches:
        s = j["speculative"]["batches"][str(b)]
        if not s["identical"]:
            sys.exit(f"spec_bench: metrale's {kind} output differs from plain decoding at batch {b}")
        rows.append({"batch": b, "off_tps": s["off_tps"], "on_tps": s["on_tps"],
                     "verify_steps": s["verify_steps"], "drafted": s["drafted"],
                     "accepted": s["accepted"], "accepted_per_step": s["accepted_per_step"],
                     "drafted_at": s["drafted_at"], "accepted_at": s["accepted_at"],
                     "identical": s["identical"], "load": load})
    return {"command": cmd, "prompt_tokens": j["speculative"]["prompt_tokens"], "rows": rows}


def metrale_greedy(a, model: Path, commands: list, prompt: str) -> dict:
    cmd = [a.bin, "generate", "--model", str(model), "--threads", str(a.threads), "--compute",
           a.compute, "--prompt", prompt, "--max-tokens", str(a.decode_tokens), "--json"]
    out = json.loads(run(cmd, commands).stdout.splitlines()[0])
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return {"prompt_ids": out["prompt_ids"], "ids": out["ids"],
            "text": tok.decode(out["ids"], skip_special_tokens=False)}


def llama_lookup(a, tool: Path, gguf: Path, k: int, commands: list, prompt: str) -> dict:
    cmd = [str(tool), "-m", str(gguf), "-p", prompt, "-n", str(a.decode_tokens),
           "--spec-draft-n-max", str(k), "--temp", "0", "-t", str(a.threads), "-tb",
           str(a.threads), "-c", "2048", "-lm", "none"]
    load = loadavg()
    r = run(cmd, commands)
    m = DECODED_RE.search(r.stderr)
    if not m:
        sys.exit(f"spec_bench: no 'decoded' line from {' '.join(cmd)}:\n{r.stderr[-2000:]}")
    stats = {k_: int(v) for k_, v in STAT_RE.findall(r.stderr)}
    text = r.stdout
    start = text.find(prompt)
    generated = text[start + len(prompt):] if start >= 0 else text
    enc = ENCODED_RE.search(r.stderr)
    return {"prompt_tokens": int(enc.group(1)) if enc else None,
            "tokens": int(m.group(1)), "seconds": float(m.group(2)),
            "tps": int(m.group(1)) / float(m.group(2)), "n_drafted": stats.get("n_drafted", 0),
            "n_accept": stats.get("n_accept", 0), "text": generated.rstrip("\n"), "load": load}


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def carry_run(a, model: Path, carry: int, out: Path) -> dict:
    """Part (c) for one --mtp-carry value (see the module docstring)."""
    port = free_port()
    cmd = [a.bin, "serve", "--model", str(model), "--port", str(port), "--threads",
           str(a.threads), "--compute", a.compute, "--speculative", "mtp", "--draft-tokens", "3",
           "--mtp-carry", str(carry)]
    srv = Server("metrale", cmd, port, out / "logs" / f"serve-carry{carry}.log")
    srv.start(timeout=120)
    passages = kjv_passages(2 * a.carry_sessions + 1, a.carry_words)
    sessions = []
    try:
        body = {"model": srv.model_id, "prompt": passages[-1], "max_tokens": 8,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        stream_completion(port, body, 120)  # warm-up, no session
        for i in range(a.carry_sessions):
            sid = f"spec-bench-{i}"
            first = passages[2 * i]
            t1 = stream_completion(port, {**body, "prompt": first, "max_tokens": a.carry_reply,
                                          "session_id": sid}, 300, keep_text=True)
            _, before = http_json(port, "GET", "/metrics")
            second = (first + t1["text"] + "\n"
                      + " ".join(passages[2 * i + 1].split()[:a.carry_words // 5]))
            t2 = stream_completion(port, {**body, "prompt": second, "session_id": sid}, 300)
            _, after = http_json(port, "GET", "/metrics")
            for t in (t1, t2):
                if t["error"]:
                    sys.exit(f"spec_bench: carry {carry}, session {sid}: {t['error']}")
            sessions.append({
                "session_id": sid, "turn1_ttft": t1["ttft"], "turn2_ttft": t2["ttft"],
                "turn2_prompt_tokens": t2["prompt_tokens"], "turn2_cached": t2["cached_tokens"],
                "rows_adopted": metric(after, "metrale_mtp_carry_rows_adopted_total")
                - metric(before, "metrale_mtp_carry_rows_adopted_total"),
                "rows_computed": metric(after, "metrale_drafter_prefill_rows_total")
                - metric(before, "metrale_drafter_prefill_rows_total"),
                "load": loadavg()})
        srv.snapshot()
    finally:
        srv.stop()
    return {"server": srv.record(), "sessions": sessions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "release" / "src" / "metrale"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compute", default="bf16", choices=["f32", "bf16"])
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mtp-draft-tokens", type=int_list, default=[1, 2, 3])
    ap.add_argument("--mtp-batch", type=int_list, default=[1, 4, 16])
    ap.add_argument("--draft-ladder", default="4:3,8:3,16:0")
    ap.add_argument("--ngram-draft-tokens", type=int, default=4)
    ap.add_argument("--ngram-model", default="demo_copy", choices=["demo", "demo_copy"],
                    help="models/<this>, padded, for the n-gram part")
    ap.add_argument("--ngram-prompt", default="edit", choices=["edit", "genesis"],
                    help="edit: Revelation 21:3, then its first words again (the answer "
                    "copies the prompt); genesis: bench's default prompt")
    ap.add_argument("--carry-sessions", type=int, default=4)
    ap.add_argument("--carry-words", type=int, default=200)
    ap.add_argument("--carry-reply", type=int, default=32)
    ap.add_argument("--cache-dir", default=str(REPO / "build" / "bench-cache"),
                    help="padded checkpoints, and llama.cpp's pinned build and GGUFs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cache = Path(a.cache_dir).resolve()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    commands: list = []

    mtp_model = padded(cache, "demo_mtp", "demo_mtp_padded")
    ngram_model = padded(cache, a.ngram_model, a.ngram_model + "_padded")
    ngram_prompt = EDIT_PROMPT if a.ngram_prompt == "edit" else PROMPT
    src = llama_cpp_peer.ensure_source(cache)
    lookup = llama_cpp_peer.ensure_lookup_tool(cache, src)
    gguf = llama_cpp_peer.ensure_gguf(cache, src, ngram_model, "bf16")

    results = {"argv": sys.argv, "options": vars(a), "metrale_commit": git_commit(),
               "llama_cpp": llama_cpp_peer.source_info(cache), "lookup_tool": str(lookup),
               "gguf": str(gguf), "prompt": PROMPT, "ngram_prompt": ngram_prompt, "cpu": subprocess.run(
                   ["lscpu"], capture_output=True, text=True).stdout}

    mtp = {}
    for k in a.mtp_draft_tokens:
        log(f"mtp K={k}")
        mtp[k] = metrale_bench(a, mtp_model, "mtp", k, a.mtp_batch, commands)
    results["mtp"] = mtp

    k = a.ngram_draft_tokens
    ngram_runs, lookup_on, lookup_off = [], [], []
    for rep in range(a.reps):
        log(f"ngram round {rep + 1}")
        ngram_runs.append(metrale_bench(a, ngram_model, "ngram", k, [1], commands, ngram_prompt))
        lookup_on.append(llama_lookup(a, lookup, gguf, k, commands, ngram_prompt))
        lookup_off.append(llama_lookup(a, lookup, gguf, 0, commands, ngram_prompt))
    greedy = metrale_greedy(a, ngram_model, commands, ngram_prompt)
    results["ngram"] = {"metrale": ngram_runs, "llama_lookup": lookup_on,
                        "llama_plain": lookup_off, "metrale_greedy": greedy}

    def agree(x: str, y: str) -> bool:  # over the common length: llama-lookup overshoots -n
        return x[:min(len(x), len(y))] == y[:min(len(x), len(y))]
    lookup_same = all(agree(r["text"], lookup_off[0]["text"]) for r in lookup_on + lookup_off)
    same_text = agree(greedy["text"], lookup_off[0]["text"])
    results["ngram"]["greedy_text_equal"] = same_text
    same_prompt = lookup_off[0]["prompt_tokens"] == len(greedy["prompt_ids"])
    results["ngram"]["prompt_token_counts_equal"] = same_prompt
    results["ngram"]["llama_lookup_output_unchanged"] = lookup_same
    carry = {c: carry_run(a, mtp_model, c, out) for c in (1, 0)}
    results["carry"] = carry
    results["commands"] = commands
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    lines = ["```", "python3 " + " ".join(
        x if re.fullmatch(r"[\w./:,=-]+", x) else repr(x) for x in sys.argv), "```", "",
        f"metrale {results['metrale_commit']}; llama.cpp {llama_cpp_peer.LLAMA_CPP_COMMIT} "
        f"(llama-cpp-python {llama_cpp_peer.VERSION}); {a.threads} thread(s); --compute "
        f"{a.compute}; {a.decode_tokens} new tokens per stream; median of {a.reps}.", "",
        f"(a) MTP on demo_mtp_padded, --draft-ladder {a.draft_ladder}:", "",
        "| K | batch | drafts per stream | off tokens/s | mtp tokens/s | mtp / off | accepted per "
        "verify step | accepted by position | output identical | load |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for k_, r in mtp.items():
        for row in r["rows"]:
            pos = " / ".join(f"{100 * acc / d:.0f}%" for acc, d in
                             zip(row["accepted_at"], row["drafted_at"]) if d > 0)
            per = sum(1 for d in row["drafted_at"] if d > 0)
            lines.append(f"| {k_} | {row['batch']} | {per} | {row['off_tps']:.0f} | "
                         f"{row['on_tps']:.0f} | {row['on_tps'] / row['off_tps']:.2f}x | "
                         f"{row['accepted_per_step']:.2f} | {pos} | "
                         f"{'yes' if row['identical'] else 'NO'} | {row['load']} |")
    med = lambda xs: statistics.median(xs)  # noqa: E731
    m_off = med([r["rows"][0]["off_tps"] for r in ngram_runs])
    m_on = med([r["rows"][0]["on_tps"] for r in ngram_runs])
    l_off = med([r["tps"] for r in lookup_off])
    l_on = med([r["tps"] for r in lookup_on])
    row0 = ngram_runs[-1]["rows"][0]
    lines += ["", f"(b) n-gram, batch 1, K = {k}, {a.ngram_model}_padded, prompt "
              f"{a.ngram_prompt} ({ngram_runs[0]['prompt_tokens']} tokens; llama.cpp: its BF16 "
              f"GGUF):", "",
              "| engine | plain tokens/s | speculative tokens/s | speculative / plain | drafted | "
              "accepted | accepted / drafted |", "|---|---|---|---|---|---|---|",
              f"| metrale (ngram) | {m_off:.0f} | {m_on:.0f} | {m_on / m_off:.2f}x | "
              f"{row0['drafted']} | {row0['accepted']} | "
              f"{row0['accepted'] / max(1, row0['drafted']):.0%} |",
              f"| llama.cpp (llama-lookup) | {l_off:.0f} | {l_on:.0f} | {l_on / l_off:.2f}x | "
              f"{lookup_on[-1]['n_drafted']} | {lookup_on[-1]['n_accept']} | "
              f"{lookup_on[-1]['n_accept'] / max(1, lookup_on[-1]['n_drafted']):.0%} |", "",
              f"metrale / llama.cpp: plain {m_off / l_off:.2f}x, speculative {m_on / l_on:.2f}x. "
              f"Prompt tokens: metrale {len(greedy['prompt_ids'])}, llama.cpp "
              f"{lookup_off[0]['prompt_tokens']}. "
              f"Greedy text equal over the common length: {'yes' if same_text else 'no'}; "
              f"llama-lookup's output the same with and without drafts: "
              f"{'yes' if lookup_same else 'no'}."]
    lines += ["", f"(c) MTP carry, demo_mtp_padded, `metrale serve --speculative mtp "
              f"--draft-tokens 3`, {a.carry_sessions} two-turn sessions (turn 1: "
              f"{a.carry_words}+ words, {a.carry_reply} tokens generated):", "",
              "| --mtp-carry | turn 2 prompt tokens | cached (target) | drafter rows adopted | "
              "drafter rows computed | turn 2 TTFT ms (median) |", "|---|---|---|---|---|---|"]
    for c, r in carry.items():
        ss = r["sessions"]
        lines.append(
            f"| {c} | {med([x['turn2_prompt_tokens'] or 0 for x in ss]):.0f} | "
            f"{med([x['turn2_cached'] or 0 for x in ss]):.0f} | "
            f"{med([x['rows_adopted'] for x in ss]):.0f} | "
            f"{med([x['rows_computed'] for x in ss]):.0f} | "
            f"{1000 * med([x['turn2_ttft'] for x in ss]):.1f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
