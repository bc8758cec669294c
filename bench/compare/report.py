"""Turns the samples of bench/compare/run.py into medians, a markdown table, JSON and a PNG.

Kept apart from run.py so the table can be rebuilt from a saved results.json:
    python3 bench/compare/report.py out/compare/results.json
"""

import json
import statistics
import sys
from pathlib import Path

ENGINES = ("metrale", "llama.cpp", "hf")
BASELINE = "llama.cpp"


def metric_keys(prefill: list[int], batches: list[int],
                depth: int | None = None) -> list[tuple[str, str, str]]:
    """(section, key, column title) for every throughput figure, in table order; decode at
    depth (run.py --depth) is titled "decode b<B> @ d<depth>"."""
    at = f" @ d{depth}" if depth else ""
    return ([("prefill", str(n), f"prefill {n}") for n in prefill] +
            [("decode", str(b), f"decode b{b}{at}") for b in batches])


def kv_type(sample: dict) -> str | None:
    """The KV cache element type an engine run reported: metrale bench's and hf's kv_dtype,
    the llama.cpp peer's kv_type (older files: its kv_cache.dtype, always f16 then)."""
    return sample.get("kv_dtype") or sample.get("kv_type") or \
        (sample.get("kv_cache") or {}).get("dtype")


def medians(samples: list[dict], prefill: list[int], batches: list[int]) -> dict:
    """Median of each figure over repetitions; a figure some repetition lacks is skipped there."""
    out = {"prefill": {}, "decode": {}}
    for section, key, _ in metric_keys(prefill, batches):
        values = [s[section][key] for s in samples if key in s.get(section, {})]
        if values:
            out[section][key] = statistics.median(values)
    rss = [s["peak_rss_bytes"] for s in samples if s.get("peak_rss_bytes")]
    out["peak_rss_bytes"] = max(rss) if rss else None
    out["kv_dtype"] = next((kv_type(s) for s in samples if kv_type(s)), None)
    out["kv_bytes_per_token"] = next((s["kv_bytes_per_token"] for s in samples
                                      if s.get("kv_bytes_per_token")), None)
    out["reps"] = len(samples)
    return out


def table_rows(results: dict) -> list[dict]:
    """The rows of the table (config.rows: engine x weight format, with each row's peer and
    weight bytes); for a results.json from before formats, one row per engine, compared with
    the llama.cpp row."""
    cfg = results["config"]
    if cfg.get("rows"):
        return cfg["rows"]
    engines = [e for e in ENGINES if any(e in s for s in results["samples"].values())]
    return [{"id": e, "engine": e,
             "format": cfg.get("llama_outtype", "bf16") if e == BASELINE else "bf16",
             "peer": BASELINE if e != BASELINE and BASELINE in engines else None,
             "weight_bytes": None, "producer": {}, "error": None} for e in engines]


def step_bytes(results: dict, row_id: str | None, batch: str) -> float:
    """Weight bytes one decode step of `batch` rows reads: the row's own figure (its
    quantized checkpoint or GGUF, config.rows), else the engine's own figure (a q8_0 GGUF in
    older results.json), else the bf16 checkpoint's per-width figure (a mixture of experts
    reads more experts as the batch grows), else the one figure older files carry."""
    row = next((r for r in results["config"].get("rows") or [] if r["id"] == row_id), None)
    if row and row.get("weight_bytes"):
        return row["weight_bytes"]["per_step"][batch]
    wb = results["weight_bytes"]
    if row_id and row_id != "bf16" and isinstance(wb.get(row_id), (int, float)):
        return wb[row_id]
    return wb.get("per_step", {}).get(batch) or wb["bf16"]


def lora_summary(results: dict) -> dict:
    """{threads: {row id: {"base": {B: tps}, "mix": {N: {B: tps}}}}}: medians over rounds of
    each row's decode with LoRA adapters (run.py --lora-mix; samples' decode_lora) and of the
    base-model decode it is compared with: metrale's plain decode in the same process
    (decode), llama.cpp's base run of the same LoRA timing tool (decode_lora_base)."""
    out = {}
    for threads, per_row in results["samples"].items():
        rows = {}
        for row_id, samples in per_row.items():
            samples = [s for s in samples if s.get("decode_lora")]
            if not samples:
                continue
            base_key = "decode_lora_base" if "decode_lora_base" in samples[0] else "decode"
            base, mix = {}, {}
            for b in samples[0][base_key]:
                values = [s[base_key][b] for s in samples if b in s.get(base_key, {})]
                base[b] = statistics.median(values)
            for n in samples[0]["decode_lora"]:
                mix[n] = {}
                for b in samples[0]["decode_lora"][n]:
                    values = [s["decode_lora"][n][b] for s in samples
                              if b in s["decode_lora"].get(n, {})]
                    mix[n][b] = statistics.median(values)
            rows[row_id] = {"base": base, "base_source": base_key, "mix": mix,
                            "reps": len(samples)}
        if rows:
            out[threads] = rows
    return out


def lora_lines(results: dict, lsum: dict) -> list[str]:
    """The LoRA section (run.py --lora-mix): the command exactly as run above a table of
    decode tokens/s per engine, adapter count and batch width, each beside its engine's own
    base model, and the greedy check with lora-0 in both engines."""
    cfg = results["config"]
    lora = cfg.get("lora")
    if not lora:
        return []
    lines = ["", "## Many LoRA adapters per batch", ""] + command_block(results)
    lines += [f"Random rank-{lora['rank']} PEFT adapters (lora_alpha = rank) on every "
              f"{'/'.join(p.removesuffix('_proj') for p in lora['targets'])} projection of "
              f"every layer (`{' '.join(lora['generator'])}`). \"base\": the engine's "
              "base-model decode in the same process."]
    engines = cfg.get("engines") or []
    if "metrale" in engines:
        lines[-1] += (f" metrale loads all {lora['count']} adapters (`--lora-dtype "
                      f"{lora['dtype']}`) and decodes with rows cycling through the first N of "
                      "them; N = 0: base-model rows through the adapter pool.")
    lc = lora.get("llama_cpp") or {}
    if "llama.cpp" in engines:
        lines[-1] += " llama.cpp applies one adapter (lora-0) to every row, its only mode"
        if lc.get("error"):
            lines[-1] += f"; its adapter could not be prepared: {short(lc['error'])}"
        elif lc:
            lines[-1] += (" (converted by the vendored `convert_lora_to_gguf.py --outtype "
                          "bf16`; timed with and without it in one process by "
                          "tools/bench/llama_lora_bench.cpp, llama-batched-bench's decode "
                          "loop, because the pinned llama-batched-bench accepts `--lora` but "
                          "never applies it)")
        lines[-1] += "."
    lines[-1] += " % of base: tokens/s over the same engine's base row."
    lines += ["", "| threads | engine | adapters | batch | tok/s | % of base |",
              "|---|---|---|---|---|---|"]
    ids = {r["id"]: r for r in table_rows(results)}
    for threads, rows in lsum.items():
        for row_id, r in rows.items():
            engine = ids.get(row_id, {}).get("engine", row_id)
            label = row_id if row_id != engine else engine
            for b, base in r["base"].items():
                entries = [("base", base)] + [
                    ({"0": "0 (base rows via the pool)"}.get(n, n), v.get(b))
                    for n, v in r["mix"].items()]
                for name, v in entries:
                    pct = 100 * v / base if v is not None and base else None
                    lines.append(f"| {threads} | {label} | {name} | {b} | {fmt(v)} | "
                                 f"{fmt(pct)} |")
    lines.append("")
    lines.append(f"Medians of {cfg['reps']} interleaved repetitions (each engine run times "
                 "its base and LoRA decode in the same process).")
    g = results.get("greedy_lora") or {}
    for line, pair in zip(greedy_lines({"greedy": g}), g.get("pairs", [])):
        line = line.replace("Greedy tokens (", "Greedy tokens with lora-0 (", 1)
        e = pair.get("adapter_effect")
        if e:
            changed = [name for name in ("metrale", "llama.cpp")
                       if e.get(f"{name}_ids_differ_from_base")]
            line += (" The adapter changed the greedy ids of " + " and ".join(changed)
                     if changed else " The adapter left both engines' greedy ids as the base "
                     "model's (a mild random adapter), so identical ids here show less than "
                     "they would otherwise")
            line += (f"; it moved llama.cpp's top-2 margins by up to "
                     f"{fmt(e.get('llama_cpp_margin_max_change'), '.3g')}.")
        lines += ["", line]
    return lines


def summarize(results: dict) -> dict:
    """Adds per-(threads, row) medians, ratios to each row's llama.cpp peer and roofline
    fractions."""
    cfg = results["config"]
    prefill, batches = cfg["prefill"], cfg["batch"]
    depth = cfg.get("depth") or 0
    peers = {r["id"]: r.get("peers") or ([r["peer"]] if r.get("peer") else [])
             for r in table_rows(results)}
    summary = {}
    for threads, per_row in results["samples"].items():
        bw = results["bandwidth"].get(threads, {}).get("median_gbs")
        rows = {}
        for row_id, samples in per_row.items():
            if not samples:
                continue
            row = medians(samples, prefill, batches)
            row["weight_bytes_b1"] = step_bytes(results, row_id, "1")
            # At depth (run.py --depth) each of a step's B rows also reads its depth tokens of
            # KV cache; without --depth KV reads are ignored (16 tokens or none: negligible).
            kv = depth * (row["kv_bytes_per_token"] or 0)
            if depth:
                row["kv_read_bytes_b1"] = kv
            if bw:
                # Decode reads every weight it needs once per step, whatever the batch width,
                # so B rows per step can reach B x bandwidth / (bytes of that step) tokens/s.
                # Dense: the same weight bytes at every width.
                row["roofline_tps_b1"] = bw * 1e9 / (step_bytes(results, row_id, "1") + kv)
                row["roofline_fraction"] = {
                    b: v / (int(b) * bw * 1e9 / (step_bytes(results, row_id, b) + int(b) * kv))
                    for b, v in row["decode"].items()}
            rows[row_id] = row
        for row_id, row in rows.items():
            ratios = {}
            for peer in peers.get(row_id, []):
                base = rows.get(peer)
                if base:
                    ratios[peer] = {
                        f"{section} {key}": row[section][key] / base[section][key]
                        for section, key, _ in metric_keys(prefill, batches)
                        if key in row[section] and key in base[section] and base[section][key] > 0}
            if ratios:
                row["ratio_to_peers"] = ratios
                row["peer"] = next(iter(ratios))
                row["ratio_to_peer"] = ratios[row["peer"]]
                row["ratio_to_llama_cpp"] = row["ratio_to_peer"]  # the name before formats
        summary[threads] = rows
    return summary


def fmt(v, spec=".1f") -> str:
    return "—" if v is None else format(v, spec)


def command_block(results: dict) -> list[str]:
    """The command that produced these results, as recorded by run.py."""
    cmd = results.get("command")
    if not cmd:
        return ["(results.json records no command: it predates run.py recording it)", ""]
    out = ["Produced by (from the repository root):", "", "```sh", cmd, "```", ""]
    m = results["config"].get("metrale")
    if m:
        commit = (m.get("git") or {}).get("commit") or "unknown"
        dirty = " with local changes" if (m.get("git") or {}).get("modified_files") else ""
        where = (f"metrale at {commit[:12]}{dirty}" if m.get("built_from_this_tree", True)
                 else f"metrale binary {m['binary']} (not built by this run; tree at "
                      f"{commit[:12]}{dirty})")
        kv = f" `--kv-dtype {m['kv_dtype']}`" if "kv_dtype" in m else ""
        out += [f"{where}, `metrale bench` with "
                f"`--compute {m.get('compute')}` `--weights {m.get('weights')}`{kv} "
                "(every flag: results.json, config.metrale.flags).", ""]
    lc = results["config"].get("llama_cpp")
    if lc:
        out += [f"llama.cpp: {lc['package']} sdist, vendoring {lc['llama_cpp_repository']}@"
                f"{lc['llama_cpp_commit']}.", ""]
    return out


def bytes_note(results: dict) -> str:
    wb = results["weight_bytes"]
    moe = wb.get("moe")
    if not moe:
        return f"Weight bytes per decode step: {wb['bf16'] / 1e9:.3f} GB (bf16)."
    widths = ", ".join(f"batch {b}: {v / 1e9:.3f} GB" for b, v in wb["per_step"].items())
    parts = ""
    comps = wb.get("components")
    if comps:  # results.json from before the breakdown has none
        names = {"experts_b1": f"top-{moe['top_k']} experts", "lm_head": "lm_head",
                 "attention": "attention", "linear_attention": "linear attention",
                 "shared_expert": "shared expert", "router": "router", "norms": "norms",
                 "other": "other"}
        parts = "; batch 1 = " + " + ".join(
            f"{names.get(k, k)} {v / 1e9:.3f}" for k, v in
            sorted(comps.items(), key=lambda kv: -kv[1]) if v) + " GB"
    return (f"Active weight bytes per decode step (bf16; top-{moe['top_k']} of {moe['experts']} "
            f"experts per token, uniform routing expected at batch > 1; "
            f"{wb['total'] / 1e9:.2f} GB in all): {widths}{parts}.")


def kv_line(results: dict) -> str | None:
    """What each row's engine reported it keeps in its KV cache per token (all layers), from
    the first sample that says: metrale bench's kv_bytes_per_token (its f32 pages), the llama.cpp
    peer's figure computed from the GGUF as llama_kv_cache sizes it (kv_cache.layout)."""
    seen = {}
    for per_row in results["samples"].values():
        for row_id, samples in per_row.items():
            s = next((x for x in samples if x.get("kv_bytes_per_token")), None)
            if s and row_id not in seen:
                layout = (s.get("kv_cache") or {}).get("layout") or \
                    (f"{s['kv_dtype']} pages" if s.get("kv_dtype") else None)
                seen[row_id] = f"{row_id} {s['kv_bytes_per_token']:,} B" + (
                    f" ({layout})" if layout else "")
    logs = sorted({(p.get("llama.cpp") or {}).get("kv_cache_log") or ""
                   for p in (results.get("greedy") or {}).get("pairs", [])} - {""})
    if not seen and not logs:
        return None
    line = "KV cache per token, all layers: " + "; ".join(seen.values()) + "."
    if logs:
        line += " llama.cpp's own log of the cache it allocated (greedy check, its small " \
                "context): " + "; ".join(f"`{x.strip()}`" for x in logs) + "."
    return line


def greedy_lines(results: dict) -> list[str]:
    """One line per greedy-check pair (run.py's "greedy" entry: {"pairs": [...]}, or one
    pair's dict in older files); none for older runs, --no-greedy, or not both engines."""
    g = results.get("greedy")
    if not g or g.get("skipped"):
        return []
    return [greedy_line(p) for p in g.get("pairs", [g])]


def greedy_line(g: dict) -> str:
    """The greedy check's line for one (metrale format, llama.cpp format) pair."""
    different = g.get("quantizers", "").startswith("different")
    pair = (f"metrale {g['metrale_format']} vs llama.cpp {g['llama_format']}, "
            if "metrale_format" in g else "")
    head = (f"Greedy tokens ({pair}{g['tokens']} from the same {len(g['prompt'])}-token "
            f"prompt, {g['precision']}, {g['threads']} thread(s)"
            + (f"; {g['quantizers']}" if g.get("quantizers") else "") + "): ")
    if g.get("errors"):
        return head + "not compared: " + "; ".join(
            f"{e} failed ({short(msg, 160)})"
            for e, msg in g["errors"].items()) + " (results.json, greedy.errors)."
    k = g.get("first_difference")
    if k is None:
        return head + "identical."
    m = g.get("llama_cpp_margin_at_difference")
    runner_up = {True: ", where metrale took llama.cpp's runner-up",
                 False: ", where metrale's token was not llama.cpp's runner-up"}.get(
        g.get("metrale_took_llama_cpp_runner_up"), "")
    tail = (" Expected: the weights come from different quantizers, so the logits differ by "
            "more than rounding; not a failure." if different else "")
    return head + (f"first differ at step {k} (0-based; llama.cpp's top-2 margin there: "
                   f"{fmt(m, '.4g')}{runner_up}); ids in results.json, greedy.{tail}")


def row_failure(results: dict, row: dict, threads: str) -> str | None:
    """The first error of a row that has no sample at this thread count."""
    if row.get("error"):
        return row["error"]
    for f in results.get("failures", []):
        if f.get("engine") == row["id"] and str(f.get("threads")) == threads:
            return f.get("error")
    return None


def short(err: str, n: int = 90) -> str:
    lines = [ln.strip() for ln in (err or "").strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else "no output"
    if lines and lines[0].startswith(("exit status", "timed out", "preparing")):
        text = lines[0].rstrip(":") + (": " + lines[-1] if len(lines) > 1 else "")
    text = text.replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def gb(v) -> str:
    return fmt(v / 1e9 if v is not None else None, ".3f")


def head_type(row: dict) -> str | None:
    """A llama.cpp row's output head type: output.weight, else the tied token_embd."""
    types = (row.get("producer") or {}).get("tensor_types") or {}
    return types.get("output.weight") or types.get("token_embd.weight")


def format_notes(results: dict) -> list[str]:
    """One bullet per quantized (or non-bf16) row: how its weights were made, what stays in
    higher precision, and the bytes a batch-1 decode step reads, by kind."""
    out = []
    by_id = {r["id"]: r for r in table_rows(results)}
    for r in table_rows(results):
        wb, prod = r.get("weight_bytes"), r.get("producer") or {}
        if r["format"] == "bf16" or not wb:
            continue
        kinds = " + ".join(f"{k} {gb(v)}" for k, v in sorted(
            (wb.get("by_kind") or {}).items(), key=lambda kv: -kv[1]) if v >= 5e5)
        line = f"- `{r['id']}`: "
        if r["engine"] == "llama.cpp":
            types: dict[str, list[str]] = {}
            for kind, t in (prod.get("tensor_types") or {}).items():
                name = "norms" if kind.endswith("norm.weight") else kind.removesuffix(".weight")
                if name not in types.setdefault(t, []):
                    types[t].append(name)
            cmd = prod.get("command")
            line += (f"{prod.get('tool', '')} (llama.cpp@"
                     f"{(prod.get('llama_cpp') or {}).get('llama_cpp_commit', '?')}"
                     + (f", `llama-quantize {' '.join(cmd[1:-4] + ['BF16.gguf', 'OUT.gguf'] + cmd[-2:-1])}`"
                        if cmd else "") + "); tensor types: " +
                     "; ".join(f"{t} {', '.join(n)}" for t, n in types.items()))
        elif prod.get("producer") == "nvidia-modelopt":
            v, recipe = prod.get("versions") or {}, prod.get("recipe") or {}
            cal = recipe.get("calibration") or {}
            exclude = ((prod.get("hf_quant_config") or {}).get("quantization") or {}).get(
                "exclude_modules")
            line += (f"{prod.get('description', r['format'])}: nvidia-modelopt "
                     f"{v.get('nvidia-modelopt', '?')}, mtq {recipe.get('preset', '?')} "
                     f"calibrated on {cal.get('sequences', '?')} x {cal.get('tokens', '?')} "
                     f"random ids (seed {cal.get('seed', '?')}), export_hf_checkpoint, "
                     f"excluded {exclude}")
        else:
            v = prod.get("versions") or {}
            line += (f"{prod.get('description', r['format'])}: llmcompressor "
                     f"{v.get('llmcompressor', '?')}, compressed-tensors "
                     f"{v.get('compressed-tensors', '?')}, data-free oneshot, ignore "
                     f"{(prod.get('recipe') or {}).get('ignore')}")
        line += (f"; {gb(wb['per_step']['1'])} GB per batch-1 decode step"
                 + (f" ({kinds} GB)" if kinds else "") + ".")
        peer = by_id.get(r.get("peer") or "")
        if r["engine"] != "llama.cpp" and peer and peer.get("weight_bytes"):
            head = head_type(peer)
            line += (f" Its peer `{peer['id']}` reads {gb(peer['weight_bytes']['per_step']['1'])}"
                     f" GB" + (f" (output head {head})" if head else "") + ".")
        if r.get("error"):
            line += f" Not run: {short(r['error'])}."
        out.append(line)
    return out


def depth_line(results: dict, summary: dict) -> str | None:
    """What decode at depth (run.py --depth) means in each engine, and each engine's KV cache
    type; None without --depth."""
    cfg = results["config"]
    depth = cfg.get("depth")
    if not depth:
        return None
    parts = {"metrale": f"`metrale bench --depth {depth}`",
             "llama.cpp": f"`llama-bench -d {depth}` (its {depth}-token prompt untimed) at batch "
                          f"1, `llama-batched-bench -npp {depth}` wider",
             "hf": f"`hf_peer.py --decode-prompt {depth}`"}
    engines = [e for e in ENGINES if e in (cfg.get("engines") or [])]
    kv = {}
    for srows in summary.values():
        for r in table_rows(results):
            if r["id"] in srows and srows[r["id"]].get("kv_dtype"):
                kv.setdefault(r["engine"], set()).add(srows[r["id"]]["kv_dtype"])
    return (f"Decode at depth {depth}: each timed decode step follows {depth} tokens of context "
            "per sequence (" + "; ".join(f"{e}: {parts[e]}" for e in engines) + "); prefill "
            "from an empty cache. KV cache: " + ", ".join(
                f"{e} {'/'.join(sorted(kv[e]))}" for e in engines if e in kv) +
            f". The roofline adds the KV bytes a step reads ({depth} x batch x the row's KV "
            "bytes per token) to its weight bytes.")


def markdown(results: dict, summary: dict) -> str:
    cfg = results["config"]
    cols = metric_keys(cfg["prefill"], cfg["batch"], cfg.get("depth"))
    rows = table_rows(results)
    with_formats = bool(cfg.get("rows"))
    with_kv = any(row.get("kv_dtype") for srows in summary.values() for row in srows.values())
    head = ["threads", "engine"] + (["format"] if with_formats else []) + \
           (["KV"] if with_kv else []) + \
           [c[2] + " t/s" for c in cols] + ["peak RSS MiB"] + \
           (["GB/step"] if with_formats else []) + ["b1 % roofline"]
    lines = command_block(results)
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for threads, srows in summary.items():
        for r in rows:
            lead = [threads, r["engine"] if with_formats else r["id"]] + \
                   ([r["format"]] if with_formats else [])
            row = srows.get(r["id"])
            if with_kv:
                lead.append((row or {}).get("kv_dtype") or "—")
            if not row:
                err = row_failure(results, r, threads)
                if err:
                    lines.append("| " + " | ".join(lead + [f"failed: {short(err)}"] + [
                        "—"] * (len(head) - len(lead) - 1)) + " |")
                continue
            vals = [fmt(row[s].get(k)) for s, k, _ in cols]
            rss = row["peak_rss_bytes"]
            frac = row.get("roofline_fraction", {}).get("1")
            lines.append("| " + " | ".join(lead + vals + [
                fmt(rss / 2**20 if rss else None, ".0f")] +
                ([gb(row.get("weight_bytes_b1"))] if with_formats else []) + [
                fmt(frac * 100 if frac is not None else None, ".0f")]) + " |")
    lines.append("")
    ratio_rows = [(threads, r, srows[r["id"]])
                  for threads, srows in summary.items() for r in rows
                  if r["id"] in srows and "ratio_to_peer" in srows[r["id"]]]
    if ratio_rows:
        if with_formats:
            lines.append("Ratio to each llama.cpp row of the same weight bit width (`vs`; "
                         "same threads; > 1 is faster):")
        else:
            lines.append(f"Ratio to llama.cpp ({cfg['llama_outtype']}, same threads; > 1 is "
                         "faster):")
        lines.append("")
        head = ["threads", "engine"] + (["format", "vs"] if with_formats else []) + \
               [c[2] for c in cols]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for threads, r, row in ratio_rows:
            for peer, ratio in row.get("ratio_to_peers", {row.get("peer"): row["ratio_to_peer"]}).items():
                lead = [threads] + ([r["engine"], r["format"], peer] if with_formats
                                    else [r["id"]])
                lines.append("| " + " | ".join(lead + [
                    fmt(ratio.get(f"{s} {k}"), ".2f") for s, k, _ in cols]) + " |")
        lines.append("")
    bw = ", ".join(f"{t} thread(s) {fmt(v.get('median_gbs'))} GB/s"
                   for t, v in results["bandwidth"].items())
    lines.append(f"Read bandwidth (bench/bandwidth_probe, median of runs): {bw}. "
                 f"{bytes_note(results)} Medians of {cfg['reps']} interleaved repetitions.")
    dl = depth_line(results, summary)
    if dl:
        lines += ["", dl]
    kv = kv_line(results)
    if kv:
        lines += ["", kv]
    notes = format_notes(results)
    if notes:
        lines += ["", "Weight formats (GB/step and the roofline: the bytes a decode step reads "
                  "from that row's own checkpoint or GGUF — packed weights, scales and zero "
                  "points, norms, and the lm_head / tied embedding streamed whole; an untied "
                  "input embedding only gathered):", ""] + notes
    for line in greedy_lines(results):
        lines += ["", line]
    won = sorted({r.get("strategy_text") for runs in results.get("bandwidth_runs", {}).values()
                  for r in runs if r.get("strategy_text")})
    if won:
        lines.append("")
        lines.append("Probe read strategies that won the sweep: " + "; ".join(won) + ".")
    lines += lora_lines(results, results.get("lora_summary") or lora_summary(results))
    return "\n".join(lines) + "\n"


def chart(results: dict, summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    cols = metric_keys(cfg["prefill"], cfg["batch"], cfg.get("depth"))
    threads = list(summary)
    engines = [r["id"] for r in table_rows(results) if any(r["id"] in rows
                                                           for rows in summary.values())]
    fig, axes = plt.subplots(1, len(cols), figsize=(
        max(3.2 * len(cols), 8.0 if len(engines) > 3 else 0), 3.6 if len(engines) <= 3 else 4.4))
    if len(cols) == 1:
        axes = [axes]
    width = 0.8 / max(1, len(engines))
    bw = results["bandwidth"]
    for ax, (section, key, title) in zip(axes, cols):
        for i, engine in enumerate(engines):
            xs, ys = [], []
            for j, t in enumerate(threads):
                v = summary[t].get(engine, {}).get(section, {}).get(key)
                if v is not None:
                    xs.append(j + (i - (len(engines) - 1) / 2) * width)
                    ys.append(v)
            if ys:
                bars = ax.bar(xs, ys, width, label=engine)
                ax.bar_label(bars, fmt="%.0f" if max(ys) >= 10 else "%.1f", fontsize=7)
        if section == "decode":
            # bf16 roofline of this batch width: weights streamed once per step.
            for j, t in enumerate(threads):
                gbs = bw.get(t, {}).get("median_gbs")
                if gbs:
                    roof = int(key) * gbs * 1e9 / step_bytes(results, None, key)
                    ax.hlines(roof, j - 0.45, j + 0.45, colors="gray", linestyles="--",
                              label=("bf16 roofline" + (" (weights only)" if cfg.get("depth")
                                                        else "")) if j == 0 else None)
        ax.set_xticks(range(len(threads)), [f"{t} thr" for t in threads])
        ax.set_title(title + " (t/s)", fontsize=10)
    title = f"{cfg['model']} — {cfg['precision']}, medians of {cfg['reps']} interleaved reps"
    if len(engines) <= 3:
        axes[0].legend(fontsize=8)
        axes[-1].legend(fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
    else:  # one legend for all panels, below them; the long title on two lines
        handles, labels = axes[-1].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
        fig.suptitle(title.replace("; ", ";\n", 1), fontsize=9)
        fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 4) // 5), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict, out_dir: Path, chart_png: bool = True) -> str:
    summary = summarize(results)
    results["summary"] = summary
    if results["config"].get("lora"):
        results["lora_summary"] = lora_summary(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(results, summary)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    (out_dir / "table.md").write_text(md)
    if chart_png:
        try:
            chart(results, summary, out_dir / "chart.png")
        except ImportError:
            print("report: matplotlib missing (python3 -m pip install matplotlib); no chart.png",
                  file=sys.stderr)
    return md


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_JSON")
    src = Path(sys.argv[1])
    print(write(json.loads(src.read_text()), src.parent))
