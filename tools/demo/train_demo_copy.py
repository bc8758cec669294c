#!/usr/bin/env python3
"""Fine-tunes models/demo into models/demo_copy: the same tiny Qwen3 (and tokenizer), taught to
copy text that its context already holds, so that prompt-lookup (n-gram) drafting has an
input-grounded task to be measured on (bench/compare/spec_bench.py). models/demo cannot copy:
given a passage twice and the start of a third copy, it continues its own loop.

Data: the KJV token stream of models/demo (tools/demo/train_demo.py's read_kjv, encoded with
models/demo's tokenizer). Each training window of kSeqLen tokens is, with probability kCopyShare,
a span of the stream followed by a newline and the same span again (an "edit this text" shape:
the second copy is predictable only by looking back), cut to kSeqLen; otherwise a plain window,
so the model keeps its language modelling. Loss on every token.

    apt-get install bible-kjv-text bible-kjv
    python3 tools/demo/train_demo_copy.py            # one thread, seed kSeed; ~15 min
    python3 tools/demo/train_demo_copy.py --reference-only   # re-record the reference only

Then records transformers' greedy continuations (float32, kNewTokens) of kPrompts in
tests/data/demo_copy/reference.json, as train_demo.py does for models/demo. Prints the copy
accuracy before and after: the share of greedy tokens equal to the passage's
own continuation, over held-out passages from the last chapters of the stream (prompt: the
passage, a newline, its first kCue tokens).
"""

import argparse
import json
import os
import shutil
import sys
import time

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_demo import adamw, cosine_lr, read_kjv, record_reference, train_step  # noqa: E402

kSeqLen = 160
kBatch = 16
kSteps = 3000
kLr = 2e-3
kWarmup = 50
kSeed = 4127
kCopyShare = 0.8
kSpan = (24, 72)   # tokens of the copied span
kCue = 8           # tokens of the second copy given in the evaluation prompt
kEval = 16         # held-out passages
kEvalSpan = 64
kNewTokens = 48
# Revelation 21:3 (held out: in the last 60k tokens of the stream) without its final period, then
# its first six words again: the task bench/compare/spec_bench.py --ngram-prompt edit times.
# The separator must be a bare newline token (the one training puts between the copies):
# "God.\n" would tokenize as "God" ".\n", and then the model does not copy.
kPassage = ("And I heard a great voice out of heaven saying, Behold, the tabernacle of God is with "
            "men, and he will dwell with them, and they shall be his people, and God himself shall "
            "be with them, and be their God")
kPrompts = [kPassage + "\nAnd I heard a great voice out", "And God said"]


def lr_at(step):
    return cosine_lr(step, kLr, kWarmup, kSteps, 0.1)


def copy_accuracy(model, data, newline):
    """Greedy tokens equal to the passage's own continuation, over kEval held-out passages."""
    model.eval()
    hit = total = 0
    gen = torch.Generator().manual_seed(kSeed + 1)
    base = data.numel() - 60000  # the last ~60k tokens: never a training window's start
    for _ in range(kEval):
        s = base + int(torch.randint(0, 50000, (1,), generator=gen))
        span = data[s:s + kEvalSpan]
        prompt = torch.cat([span, torch.tensor([newline]), span[:kCue]]).unsqueeze(0)
        want = span[kCue:].tolist()
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=len(want), pad_token_id=0)
        got = out[0, prompt.shape[1]:].tolist()
        hit += sum(int(a == b) for a, b in zip(got, want))
        total += len(want)
    model.train()
    return hit / total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="models/demo")
    ap.add_argument("--out", default="models/demo_copy")
    ap.add_argument("--reference", default="tests/data/demo_copy/reference.json")
    ap.add_argument("--reference-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as train_demo.py: repeatable, and no spinning on a shared VM
    if not args.reference_only:
        train(args)
    record_reference(args.out, args.reference, lambda m: print(m, flush=True),
                     model_class=Qwen3ForCausalLM, generator="tools/demo/train_demo_copy.py",
                     model_name="models/demo_copy", note="greedy, stops early at eos",
                     prompts=kPrompts, new_tokens=kNewTokens)
    return 0


def train(args):
    tok = AutoTokenizer.from_pretrained(args.source)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    newline = tok("\n")["input_ids"][0]
    stream = []
    for ch in read_kjv():
        stream += tok(ch)["input_ids"] + [eos]
    data = torch.tensor(stream, dtype=torch.int64)
    train_end = data.numel() - 60000 - kSeqLen
    print(f"{data.numel()} tokens; training windows start below {train_end}", flush=True)

    torch.manual_seed(kSeed)
    model = Qwen3ForCausalLM.from_pretrained(args.source, dtype=torch.float32,
                                             attn_implementation="eager")
    before = copy_accuracy(model, data, newline)
    print(f"copy accuracy before: {before:.3f}", flush=True)
    opt = adamw(model.named_parameters(), kLr)
    gen = torch.Generator().manual_seed(kSeed)
    model.train()
    t0, ema = time.time(), None
    for step in range(kSteps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        rows = []
        for _ in range(kBatch):
            s = int(torch.randint(0, train_end, (1,), generator=gen))
            if float(torch.rand(1, generator=gen)) < kCopyShare:
                n = int(torch.randint(kSpan[0], kSpan[1] + 1, (1,), generator=gen))
                lead = int(torch.randint(0, kSeqLen - 2 * n - 1, (1,), generator=gen))
                span = data[s + lead:s + lead + n]
                row = torch.cat([data[s:s + lead], span, torch.tensor([newline]), span])
                row = torch.cat([row, data[s + lead + n:s + lead + n + kSeqLen - row.numel()]])
            else:
                row = data[s:s + kSeqLen]
            rows.append(row[:kSeqLen])
        x = torch.stack(rows)
        loss = train_step(model, opt, x)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 50 == 0 or step == kSteps - 1:
            print(f"step {step} loss {loss.item():.3f} ema {ema:.3f} lr {lr_at(step):.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
        if step % 500 == 499:
            print(f"step {step} copy accuracy {copy_accuracy(model, data, newline):.3f}",
                  flush=True)
    after = copy_accuracy(model, data, newline)
    print(f"copy accuracy after: {after:.3f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(args.source, name), os.path.join(args.out, name))
    with open(os.path.join(args.out, "training.json"), "w") as fh:
        json.dump({"generator": "tools/demo/train_demo_copy.py", "source": args.source,
                   "seed": kSeed, "steps": kSteps, "batch": kBatch, "seq_len": kSeqLen,
                   "lr": kLr, "copy_share": kCopyShare, "span": list(kSpan),
                   "final_loss_ema": round(ema, 4), "copy_accuracy_before": round(before, 4),
                   "copy_accuracy_after": round(after, 4),
                   "seconds": round(time.time() - t0)}, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
