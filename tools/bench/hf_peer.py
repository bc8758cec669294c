#!/usr/bin/env python3
"""HF transformers (torch, CPU) as a benchmark peer.

    python3 tools/bench/hf_peer.py --model HF_DIR --threads 2 [--prefill 128,512]
        [--batch 1,4,16] [--decode-tokens 64] [--reps 1] [--json]

Same interface and output object as `metrale bench --json`:
{"prefill": {"128": tps, ...}, "decode": {"1": tps, ...}, "weight_bytes": n,
 "peak_rss_bytes": n, ...}.

What is timed, per repetition (the median over --reps is reported):
* prefill N: one forward of N random token ids (batch 1) from an empty cache, computing the
  logits of the last position only (logits_to_keep=1, as llama-bench does); tokens / seconds.
* decode B: B sequences each start from --decode-prompt random tokens (one untimed forward
  fills the cache; 16 by default, as `metrale bench` does), then --decode-tokens greedy steps
  of [B, 1] ids with a DynamicCache are timed; B * steps / seconds.
Weights are loaded as bf16 and torch computes in bf16 (activations bf16; its CPU matmuls run
through oneDNN/MKL bf16 kernels, which accumulate in fp32, with AVX512_BF16 where present).
Threads: torch.set_num_threads(T) and one inter-op thread.
"""

import argparse
import inspect
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from llama_cpp_peer import int_list  # the one --prefill/--batch parser of tools/bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", type=int_list, default=[128, 512])
    ap.add_argument("--batch", type=int_list, default=[1, 4, 16])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-prompt", type=int, default=16)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        sys.exit(f"hf_peer: {args.model}/config.json not found (expected an HF checkpoint dir)")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model.eval()
    vocab = model.config.vocab_size
    # transformers 5.x renamed past_key_values to cache (the old name warns until removal).
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    gen = torch.Generator().manual_seed(args.seed)

    def ids(batch: int, n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, n), generator=gen)

    def time_prefill(n: int) -> float:
        x = ids(1, n)
        start = time.perf_counter()
        model(input_ids=x, use_cache=True, logits_to_keep=1)
        return n / (time.perf_counter() - start)

    def time_decode(batch: int, steps: int) -> float:
        out = model(input_ids=ids(batch, args.decode_prompt), use_cache=True, logits_to_keep=1)
        cache = getattr(out, cache_kw)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt, use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            cache = getattr(out, cache_kw)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return batch * steps / (time.perf_counter() - start)

    with torch.inference_mode():
        # Warm-up: first calls pay for lazy init and kernel selection.
        model(input_ids=ids(1, 16), use_cache=True, logits_to_keep=1)
        time_decode(1, 2)
        prefill = {n: [] for n in args.prefill}
        decode = {b: [] for b in args.batch}
        for _ in range(args.reps):
            for n in args.prefill:
                prefill[n].append(time_prefill(n))
            for b in args.batch:
                decode[b].append(time_decode(b, args.decode_tokens))

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "prefill": {str(n): statistics.median(v) for n, v in prefill.items()},
        "decode": {str(b): statistics.median(v) for b, v in decode.items()},
        "weight_bytes": weight_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "compute_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cache": "DynamicCache",
        "kv_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),  # the cache's
        "depth": args.decode_prompt,  # tokens of context before the timed decode steps
        "attn_implementation": model.config._attn_implementation,
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
