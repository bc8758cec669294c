#!/usr/bin/env python3
"""Trains the tiny demo Qwen3 that ships in models/demo/ and records its HF reference
continuations in tests/data/demo/reference.json.

Data: the King James Bible from the Debian package bible-kjv-text (public domain), read
through the package's own `bible` program. Everything is seeded; on the same torch build
and thread count the run repeats, but the numbers are only promised by the committed files.

    apt-get install bible-kjv-text bible-kjv
    python3 tools/demo/train_demo.py            # ~6-25 min on one CPU core, by load
    python3 tools/demo/train_demo.py --reference-only   # re-record the reference only
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
import transformers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM)

kEos = "<|endoftext|>"
kVocab = 2048
# Qwen2/Qwen3's split pattern: contractions, letters with one optional leading
# non-letter, single digits, punctuation runs, newlines, whitespace.
kQwenSplit = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
kArch = dict(vocab_size=kVocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, intermediate_size=384,
             max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0))
kSeqLen = 128
kBatch = 24
kSteps = 1000
kLr = 3e-3
kWarmup = 50
kSeed = 1611
kPrompts = ["And God said", "In the beginning", "The LORD is my shepherd"]
kNewTokens = 32


def read_kjv():
    """One document per chapter, one verse per line (headings and verse numbers dropped)."""
    raw = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    chapters, verses = [], []
    for line in raw.splitlines():
        m = re.match(r"^\s+\d+ (.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        elif line.strip() and verses:  # a "Book N" heading closes the previous chapter
            chapters.append("\n".join(verses) + "\n")
            verses = []
    if verses:
        chapters.append("\n".join(verses) + "\n")
    if len(chapters) != 1189:
        raise RuntimeError(f"expected the 1189 KJV chapters, found {len(chapters)}")
    return chapters


def train_tokenizer(chapters):
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kQwenSplit), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=kVocab, special_tokens=[kEos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(chapters, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=kEos, pad_token=kEos,
                                   model_max_length=kArch["max_position_embeddings"])


def cosine_lr(step, peak, warmup, steps, floor):
    """The demo trainings' schedule: linear warmup to `peak` over `warmup` steps, then a cosine
    from `peak` down to floor * peak at the last step (train_demo_mtp / train_demo_copy too)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(named_params, lr):
    """AdamW as every demo training uses it: weight decay 0.1 on matrices, none on vectors,
    betas 0.9 / 0.95."""
    named_params = list(named_params)
    return torch.optim.AdamW([{"params": [p for _, p in named_params if p.dim() >= 2],
                               "weight_decay": 0.1},
                              {"params": [p for _, p in named_params if p.dim() < 2],
                               "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def train_step(model, opt, x):
    """One causal-LM step on the batch x (labels = inputs; the loss shifts them), gradients
    clipped to norm 1.0; returns the loss."""
    loss = model(input_ids=x, labels=x, use_cache=False).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def lr_at(step):
    return cosine_lr(step, kLr, kWarmup, kSteps, 0.05)


def train(out_dir, log):
    chapters = read_kjv()
    hf_tok = train_tokenizer(chapters)
    eos_id = hf_tok.convert_tokens_to_ids(kEos)
    stream = []
    for ch in chapters:
        stream += hf_tok(ch)["input_ids"] + [eos_id]
    data = torch.tensor(stream, dtype=torch.int64)
    log(f"{len(chapters)} chapters, {sum(map(len, chapters))} chars, {data.numel()} tokens")

    torch.manual_seed(kSeed)
    cfg = Qwen3Config(**kArch, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model = Qwen3ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{n_params} parameters")
    opt = adamw(model.named_parameters(), kLr)
    gen = torch.Generator().manual_seed(kSeed)
    model.train()
    t0, ema = time.time(), None
    for step in range(kSteps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, data.numel() - kSeqLen, (kBatch,), generator=gen)
        x = torch.stack([data[s:s + kSeqLen] for s in starts.tolist()])
        loss = train_step(model, opt, x)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0 or step == kSteps - 1:
            log(f"step {step} loss {loss.item():.3f} ema {ema:.3f} lr {lr_at(step):.2e} "
                f"{time.time() - t0:.0f}s")

    model.eval()
    held = data[-kSeqLen * 64:].view(64, kSeqLen)
    with torch.no_grad():
        final = model(input_ids=held, labels=held, use_cache=False).loss.item()
    log(f"final train-window ema loss {ema:.3f}, loss on last {held.numel()} tokens {final:.3f}")

    model.to(torch.bfloat16).save_pretrained(out_dir)
    hf_tok.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                     do_sample=False).save_pretrained(out_dir)
    return ema, final


def record_reference(model_dir, ref_path, log, model_class=None,
                     generator="tools/demo/train_demo.py", model_name="models/demo",
                     note="greedy, stops early at eos (the eos id is then the last greedy id)",
                     prompts=None, new_tokens=kNewTokens):
    """The greedy continuations of `prompts` (default kPrompts) by transformers (`model_class`,
    default AutoModelForCausalLM) in float32, new_tokens each, with their smallest top-2 logit
    margins, as JSON at `ref_path`; train_demo_mtp.py and train_demo_copy.py record their
    models' through this too."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = (model_class or AutoModelForCausalLM).from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    gen_cfg = GenerationConfig.from_pretrained(model_dir)
    cases = []
    for prompt in prompts or kPrompts:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens, eos_token_id=gen_cfg.eos_token_id,
                                 pad_token_id=gen_cfg.pad_token_id, output_logits=True,
                                 return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:].tolist()
        text = tok.decode(new)
        # Smallest top-1 minus top-2 logit along the path: how much numeric slack an exact
        # greedy match against this reference has.
        margin = min((lambda t: (t[0] - t[1]).item())(torch.topk(s[0].float(), 2).values)
                     for s in out.logits)
        cases.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy_ids": new,
                      "text": text, "min_top2_logit_margin": round(margin, 4)})
        log(f"{prompt!r} -> {text!r} (min margin {margin:.4f})")
    doc = {"generator": generator,
           "transformers": transformers.__version__,
           "model_dir": model_name, "dtype": "float32 (bf16 weights upcast)",
           "max_new_tokens": new_tokens, "eos_token_id": gen_cfg.eos_token_id,
           "note": note,
           "cases": cases}
    os.makedirs(os.path.dirname(ref_path), exist_ok=True)
    with open(ref_path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--reference", default="tests/data/demo/reference.json")
    ap.add_argument("--reference-only", action="store_true")
    args = ap.parse_args()
    # One thread: the build machine is shared, and torch's two-thread kernels spin-wait
    # on each other when cores are oversubscribed (measured 6x slower than one thread).
    # It also keeps the reduction order, hence the weights, the same on every run.
    torch.set_num_threads(1)

    def log(msg):
        print(msg, flush=True)

    if not args.reference_only:
        train(args.out, log)
    record_reference(args.out, args.reference, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
