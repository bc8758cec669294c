#!/usr/bin/env python3
"""Runs llama.cpp's own convert_hf_to_gguf.py (from the vendored sdist) on an HF checkpoint.

    python3 tools/bench/convert_gguf.py --llama-src DIR [--pre-fallback NAME] -- \
        MODEL_DIR --outtype bf16 --outfile OUT.gguf

The converter identifies a BPE tokenizer's pre-tokenizer by hashing the ids it gives for a
fixed text and refuses unknown hashes. The random-weight Llama-3.2-1B-shaped checkpoint
carries a tokenizer re-cut from Qwen3's (the Llama 3 one is not available offline), whose hash
is unknown; --pre-fallback names the pre-tokenizer to record then. Only the vocabulary layout
matters for the benchmarks (they feed token ids), so this changes no timed work. The vendored
converter's code is imported, never copied or modified.

--q-lora-rank-zero writes deepseek2.attention.q_lora_rank = 0 for a DeepSeek checkpoint whose
q_lora_rank is null (a full-rank q_proj). The converter writes the key only when q_lora_rank
is set, and the pinned llama.cpp (src/models/deepseek2.cpp) then requires it unless the model
has 26 or 27 layers (how it recognises DeepSeek-V2-Lite); the deepseek-v2-lite-L<N> shape
keeps fewer layers. With 0 llama.cpp takes the q_proj path V2-Lite takes (attn_q; no q_a / q_b),
so the key changes no tensor and no timed work.
"""

import argparse
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", type=Path, required=True, help="vendor/llama.cpp directory")
    ap.add_argument("--pre-fallback", default=None,
                    help="pre-tokenizer name to use when the hash is not recognised")
    ap.add_argument("--q-lora-rank-zero", action="store_true",
                    help="write deepseek2.attention.q_lora_rank = 0 when q_lora_rank is null")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for convert_hf_to_gguf.py")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    src = args.llama_src.resolve()
    if not (src / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"convert_gguf: {src}/convert_hf_to_gguf.py not found")
    sys.path.insert(0, str(src))
    import convert_hf_to_gguf  # noqa: E402  (path set just above)
    from conversion import TextModel  # noqa: E402

    if args.pre_fallback:
        original = TextModel.get_vocab_base_pre
        fallback = args.pre_fallback

        def get_vocab_base_pre(self, tokenizer):
            try:
                return original(self, tokenizer)
            except NotImplementedError:
                print(f"convert_gguf: unknown pre-tokenizer hash, recording {fallback!r}",
                      file=sys.stderr)
                return fallback

        TextModel.get_vocab_base_pre = get_vocab_base_pre

    if args.q_lora_rank_zero:
        from conversion.deepseek import DeepseekV2Model  # noqa: E402

        original_params = DeepseekV2Model.set_gguf_parameters

        def set_gguf_parameters(self):
            original_params(self)
            if self.hparams.get("q_lora_rank") is None:
                print("convert_gguf: q_lora_rank is null, writing q_lora_rank = 0",
                      file=sys.stderr)
                self.gguf_writer.add_q_lora_rank(0)

        DeepseekV2Model.set_gguf_parameters = set_gguf_parameters

    sys.argv = [str(src / "convert_hf_to_gguf.py")] + rest
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
