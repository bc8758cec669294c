#!/usr/bin/env python3
"""Trains models/demo_mtp/: a tiny DeepSeek-V3-shaped target (MLA attention, dense SwiGLU FFNs)
with one multi-token-prediction (MTP) layer, on the demo corpus (the King James Bible, read as
tools/demo/train_demo.py reads it) with the demo's tokenizer (models/demo/tokenizer.json, not
retrained), so that `--speculative mtp` has a drafter whose drafts are accepted. It also records
the target's transformers reference continuations (tests/data/demo_mtp/reference.json) and checks
the MTP layer through tools/fixtures/models/mtp_fixtures.py's PyTorch drafter (vLLM's forward)
against this script's own training forward.

The MTP loss is DeepSeek-V3's (arXiv:2412.19437 sec. 2.2): MTP row k reads the trunk's hidden
state at k and the embedding of token k + 1 and predicts token k + 2; the total loss is
L_main + kMtpWeight * L_mtp, trained jointly from step 0. The row forward is exactly the one the
drafter runs at inference (vLLM's deepseek_mtp.py, as tools/fixtures/models/mtp_fixtures.py cites
it): the trunk's hidden after its final norm, enorm(embed) and hnorm(hidden) concatenated
(embedding first) into eh_proj, one decoder layer over the rows (causal, RoPE at the row's
position), shared_head.norm, the tied head; the row at position 0 has its embedding zeroed.

    apt-get install bible-kjv-text bible-kjv
    OMP_NUM_THREADS=1 python3 tools/demo/train_demo_mtp.py        # ~15-30 min, by load (seed kSeed)
    OMP_NUM_THREADS=1 python3 tools/demo/train_demo_mtp.py --reference-only

Seeded (kSeed) and single-threaded; the committed files are what the tests rely on.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import (AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM,
                          GenerationConfig)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3DecoderLayer,
                                                                  DeepseekV3RMSNorm)

kHere = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, kHere)
sys.path.insert(0, os.path.join(kHere, "..", "fixtures", "models"))
import train_demo  # noqa: E402  (read_kjv, the corpus)

kEos = "<|endoftext|>"
kLayers = 4
# first_k_dense_replace > num_hidden_layers: every FFN is dense, the MTP layer's (index
# kLayers) included, by the rule vLLM and metrale apply at the MTP layer's index. The MoE
# fields keep transformers' config validation happy and are unused.
kArch = dict(vocab_size=2048, hidden_size=128, num_hidden_layers=kLayers, num_attention_heads=4,
             num_key_value_heads=4, intermediate_size=384, moe_intermediate_size=64,
             n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
             topk_group=1, first_k_dense_replace=kLayers + 1, q_lora_rank=None,
             kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
             head_dim=16, rope_interleave=True, max_position_embeddings=1024,
             rms_norm_eps=1e-6, tie_word_embeddings=True, num_nextn_predict_layers=1,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0))
kSeqLen = 128
kBatch = 20
kSteps = 1000
kLr = 3e-3
kWarmup = 50
kMtpWeight = 0.3  # DeepSeek-V3's lambda for the first 10T tokens
kSeed = 2311
# The drafter reference's context: the first of these whose drafts clear the margin.
kMtpPrompts = ["And Moses said unto the LORD,", "Then the king of Israel", "And it came to pass",
               "Blessed is the man that", "For thus saith the LORD"]


class Mtp(torch.nn.Module):
    """model.layers.<L>.*: enorm, hnorm, eh_proj, a decoder layer, shared_head.norm (the head is
    the tied embedding, saved as shared_head.head.weight, a copy, as GLM-4.5 ships it)."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.enorm = DeepseekV3RMSNorm(H, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(H, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        self.layer = DeepseekV3DecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
        self.head_norm = DeepseekV3RMSNorm(H, eps=cfg.rms_norm_eps)
        assert not hasattr(self.layer.mlp, "gate"), "the MTP layer must be dense"

    def forward(self, trunk, ids, hidden):
        """ids [B, T], hidden [B, T, H] (the trunk's, after its final norm): logits [B, T-1, V]
        of rows k = 0..T-2 (embed(t_{k+1}), hidden_k) at positions k, predicting t_{k+2}."""
        B, T = ids.shape
        n = T - 1
        e = trunk.model.embed_tokens(ids[:, 1:])
        e = torch.cat([torch.zeros_like(e[:, :1]), e[:, 1:]], 1)  # position 0: zeroed (vLLM)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden[:, :n])], -1))
        pos = torch.arange(n)[None].expand(B, n)
        cos_sin = trunk.model.rotary_emb(x, pos)
        mask = torch.full((n, n), torch.finfo(x.dtype).min).triu(1)[None, None]
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        out = out[0] if isinstance(out, tuple) else out
        return trunk.lm_head(self.head_norm(out))

    def checkpoint_tensors(self, trunk):
        p = f"model.layers.{kLayers}."
        t = {p + "enorm.weight": self.enorm.weight, p + "hnorm.weight": self.hnorm.weight,
             p + "eh_proj.weight": self.eh_proj.weight,
             p + "shared_head.norm.weight": self.head_norm.weight,
             p + "shared_head.head.weight": trunk.model.embed_tokens.weight}
        for k, v in self.layer.state_dict().items():
            t[p + k] = v
        return {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in t.items()}


def lr_at(step):
    return train_demo.cosine_lr(step, kLr, kWarmup, kSteps, 0.05)


def losses(trunk, mtp, x):
    out = trunk.model(input_ids=x, use_cache=False)
    h = out.last_hidden_state  # after the final norm
    logits = trunk.lm_head(h)
    V = logits.shape[-1]
    main = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    ml = mtp(trunk, x, h)
    aux = torch.nn.functional.cross_entropy(ml[:, :-1].reshape(-1, V), x[:, 2:].reshape(-1))
    return main, aux, ml


def train(out_dir, tokenizer_dir, log):
    chapters = train_demo.read_kjv()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos_id = tok.convert_tokens_to_ids(kEos)
    assert eos_id == 0 and len(tok) == kArch["vocab_size"], (eos_id, len(tok))
    stream = []
    for ch in chapters:
        stream += tok(ch)["input_ids"] + [eos_id]
    data = torch.tensor(stream, dtype=torch.int64)
    log(f"{len(chapters)} chapters, {data.numel()} tokens")

    torch.manual_seed(kSeed)
    cfg = DeepseekV3Config(**kArch, bos_token_id=eos_id, eos_token_id=eos_id,
                           pad_token_id=eos_id)
    cfg._attn_implementation = "sdpa"
    trunk = DeepseekV3ForCausalLM(cfg)
    mtp = Mtp(cfg)
    params = list(trunk.named_parameters()) + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    n_trunk = sum(p.numel() for p in trunk.parameters())
    log(f"{n_trunk} target parameters, {sum(p.numel() for p in mtp.parameters())} MTP")
    opt = train_demo.adamw(params, kLr)
    all_params = [p for _, p in params]
    gen = torch.Generator().manual_seed(kSeed)
    trunk.train()
    mtp.train()
    t0, ema, ema_mtp = time.time(), None, None
    for step in range(kSteps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, data.numel() - kSeqLen, (kBatch,), generator=gen)
        x = torch.stack([data[s:s + kSeqLen] for s in starts.tolist()])
        main, aux, _ = losses(trunk, mtp, x)
        loss = main + kMtpWeight * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(all_params, 1.0)
        opt.step()
        ema = main.item() if ema is None else 0.98 * ema + 0.02 * main.item()
        ema_mtp = aux.item() if ema_mtp is None else 0.98 * ema_mtp + 0.02 * aux.item()
        if step % 50 == 0 or step == kSteps - 1:
            log(f"step {step} main {main.item():.3f} (ema {ema:.3f}) mtp {aux.item():.3f} "
                f"(ema {ema_mtp:.3f}) lr {lr_at(step):.2e} {time.time() - t0:.0f}s")

    trunk.eval()
    mtp.eval()
    held = data[-kSeqLen * 32:].view(32, kSeqLen)
    with torch.no_grad():
        main, aux, ml = losses(trunk, mtp, held)
        # How often the MTP row's argmax is the token two ahead: the drafter's first-draft
        # acceptance under teacher forcing, on the last 4096 tokens of the stream.
        hit = (ml[:, :-1].argmax(-1) == held[:, 2:]).float().mean().item()
    log(f"held-out (last {held.numel()} tokens): main {main.item():.3f}, mtp {aux.item():.3f}, "
        f"mtp top-1 = t+2 {hit:.3f}")

    os.makedirs(out_dir, exist_ok=True)
    trunk.to(torch.bfloat16).save_pretrained(out_dir)
    # Append the MTP layer to the saved weights (transformers' save_pretrained has no place
    # for it; its loader drops model.layers.<L>.* again).
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    tensors.update(mtp.checkpoint_tensors(trunk))
    with tempfile.TemporaryDirectory() as tmp:
        save_file(dict(sorted(tensors.items())), os.path.join(tmp, "m.safetensors"),
                  metadata={"format": "pt"})
        shutil.move(os.path.join(tmp, "m.safetensors"), path)
    os.chmod(path, 0o644)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                     do_sample=False).save_pretrained(out_dir)
    return dict(main=main.item(), mtp=aux.item(), hit=hit)


def _drafter(model_dir):
    """mtp_fixtures.Drafter over the checkpoint (its __init__ hooks an MoE router, which this
    dense MTP layer has not: the fields are set directly)."""
    import mtp_fixtures
    target, layer, mtp_t, cfg = mtp_fixtures._decoder_layer(model_dir, dict(kind="nextn"))
    drafter = mtp_fixtures.Drafter.__new__(mtp_fixtures.Drafter)
    drafter.target, drafter.layer, drafter.cfg, drafter.kind = target, layer, cfg, "nextn"
    drafter.eps, drafter.mtp = cfg["rms_norm_eps"], mtp_t
    drafter.embed = target.model.embed_tokens.weight
    return drafter


@torch.no_grad()
def record_mtp_reference(model_dir, ref_path, log):
    """tests/data/demo_mtp/mtp_reference.safetensors, in the layout of the fixtures' (made as
    mtp_fixtures.record makes them, tests/data/fixtures/README.md "MTP drafter references"):
    the first kTokens of a kMtpPrompts entry and its greedy continuation, the target's
    post-norm hiddens, every exact drafter row, and kChainDrafts chained drafts from kPrompt and
    kPrompt + kChainBOffset."""
    drafter = _drafter(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    for text in kMtpPrompts:
        reason = _record_mtp_reference(drafter, tok, text, ref_path, log)
        if reason is None:
            return
        log(f"mtp reference: prompt {text!r} rejected: {reason}")
    raise RuntimeError("no prompt gives the drafter reference its margins")


def _record_mtp_reference(drafter, tok, text, ref_path, log):
    import mtp_fixtures as mf
    target = drafter.target
    prompt = torch.tensor(tok(text)["input_ids"])
    assert prompt.numel() < mf.kTokens
    seq = prompt.clone()
    for _ in range(mf.kTokens - prompt.numel()):  # no-cache greedy
        nxt = target(seq[None], use_cache=False).logits[0, -1].argmax()
        seq = torch.cat([seq, nxt[None]])
    ids, P, N = seq, mf.kPrompt, mf.kTokens
    hidden = target.model(input_ids=ids[None], use_cache=False).last_hidden_state[0].float()
    exact_h, exact_logits = drafter.rows(ids[1:], hidden[:N - 1], torch.arange(N - 1))
    rec = {"ids": ids, "target_hidden": hidden.contiguous(), "logits": exact_logits.contiguous(),
           "hidden_out": exact_h.contiguous()}
    margin = float("inf")
    for tag, position in (("chain_a", P), ("chain_b", P + mf.kChainBOffset)):
        row_ids, row_hidden = ids[1:position + 1].clone(), hidden[:position].clone()
        drafts, logits, outs = [], [], []
        for _ in range(mf.kChainDrafts):
            h, lg = drafter.rows(row_ids, row_hidden, torch.arange(row_ids.numel()))
            top2 = torch.topk(lg[-1], 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            drafts.append(int(lg[-1].argmax()))
            logits.append(lg[-1])
            outs.append(h[-1])
            row_ids = torch.cat([row_ids, torch.tensor([drafts[-1]])])
            row_hidden = torch.cat([row_hidden, h[-1:]])
        rec[f"{tag}.position"] = torch.tensor([position], dtype=torch.int64)
        rec[f"{tag}.ids"] = torch.tensor(drafts, dtype=torch.int64)
        rec[f"{tag}.logits"] = torch.stack(logits).contiguous()
        rec[f"{tag}.hidden_out"] = torch.stack(outs).contiguous()
        assert (logits[0] - exact_logits[position - 1]).abs().max() < 1e-4
    exact_margin = min(float((lambda t: t[0] - t[1])(torch.topk(r, 2).values))
                       for r in exact_logits)
    if min(margin, exact_margin) < mf.kMinDraftMargin:
        return f"a top-2 near-tie (chained {margin:.2e}, exact rows {exact_margin:.2e})"
    os.makedirs(os.path.dirname(ref_path), exist_ok=True)
    save_file(rec, ref_path, metadata={
        "generator": f"tools/demo/train_demo_mtp.py (transformers {transformers.__version__}, "
                     f"torch {torch.__version__.split('+')[0]})"})
    os.chmod(ref_path, 0o644)
    acc = int((exact_logits.argmax(-1)[:N - 2] == ids[2:]).sum())
    log(f"mtp reference: prompt {text!r}, {N - 1} exact rows, chain_a {rec['chain_a.ids'].tolist()}, chain_b "
        f"{rec['chain_b.ids'].tolist()}, draft margin {margin:.3f}, exact-row margin "
        f"{exact_margin:.3f}, exact rows whose argmax is the token two ahead {acc}/{N - 2}")
    return None


@torch.no_grad()
def check_mtp_reference(model_dir, log):
    """The MTP layer through mtp_fixtures.Drafter (vLLM's forward, transformers' decoder layer
    loaded by transformers from the checkpoint) equals this script's Mtp.forward on the saved
    (bf16) weights: the layout written is the one the reference (and so metrale) reads."""
    drafter = _drafter(model_dir)
    target = drafter.target
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor(tok("And God said unto Moses, I AM THAT I AM")["input_ids"])
    hidden = target.model(input_ids=ids[None], use_cache=False).last_hidden_state[0].float()
    n = ids.numel() - 1
    _, ref_logits = drafter.rows(ids[1:], hidden[:n], torch.arange(n))
    mine = Mtp(DeepseekV3Config(**json.load(open(os.path.join(model_dir, "config.json")))))
    p = f"model.layers.{kLayers}."
    sd = {k[len(p):]: v.float() for k, v in load_file(
        os.path.join(model_dir, "model.safetensors")).items() if k.startswith(p)}
    mine.enorm.weight.copy_(sd["enorm.weight"])
    mine.hnorm.weight.copy_(sd["hnorm.weight"])
    mine.eh_proj.weight.copy_(sd["eh_proj.weight"])
    mine.head_norm.weight.copy_(sd["shared_head.norm.weight"])
    mine.layer.load_state_dict({k: sd[k] for k in mine.layer.state_dict()})
    mine.layer.self_attn.config._attn_implementation = "eager"
    assert torch.equal(sd["shared_head.head.weight"], target.model.embed_tokens.weight)
    ours = mine(target, ids[None], hidden[None])[0]
    diff = (ours - ref_logits).abs().max().item()
    log(f"MTP forward vs mtp_fixtures.Drafter: max |logit diff| {diff:.2e} over {n} rows")
    assert diff < 1e-3, diff
    return ref_logits


def record_reference(model_dir, ref_path, log):
    train_demo.record_reference(
        model_dir, ref_path, log, model_class=DeepseekV3ForCausalLM,
        generator="tools/demo/train_demo_mtp.py", model_name="models/demo_mtp",
        note="greedy, stops early at eos (the eos id is then the last greedy id); "
             "transformers drops the MTP layer, so this is the target alone")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/demo_mtp")
    ap.add_argument("--tokenizer", default="models/demo")
    ap.add_argument("--reference", default="tests/data/demo_mtp/reference.json")
    ap.add_argument("--mtp-reference", default="tests/data/demo_mtp/mtp_reference.safetensors")
    ap.add_argument("--reference-only", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="for a timing trial only")
    args = ap.parse_args()
    if args.steps is not None:
        global kSteps
        kSteps = args.steps
    torch.set_num_threads(1)  # as train_demo.py: shared cores, repeatable reductions
    transformers.utils.logging.set_verbosity_error()

    def log(msg):
        print(msg, flush=True)

    if not args.reference_only:
        train(args.out, args.tokenizer, log)
    check_mtp_reference(args.out, log)
    record_reference(args.out, args.reference, log)
    record_mtp_reference(args.out, args.mtp_reference, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
