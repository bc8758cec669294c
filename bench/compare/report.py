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


def metric_keys(prefill: list[int], batches: list[int]) -> list[tuple[str, str, str]]:
    """(section, key, column title) for every throughput figure, in table order."""
    return ([("prefill", str(n), f"prefill {n}") for n in prefill] +
            [("decode", str(b), f"decode b{b}") for b in batches])


def medians(samples: list[dict], prefill: list[int], batches: list[int]) -> dict:
    """Median of each figure over repetitions; a figure some repetition lacks is skipped there."""
    out = {"prefill": {}, "decode": {}}
    for section, key, _ in metric_keys(prefill, batches):
        values = [s[section][key] for s in samples if key in s.get(section, {})]
        if values:
            out[section][key] = statistics.median(values)
    rss = [s["peak_rss_bytes"] for s in samples if s.get("peak_rss_bytes")]
    out["peak_rss_bytes"] = max(rss) if rss else None
    out["reps"] = len(samples)
    return out


def step_bytes(results: dict, engine: str | None, batch: str) -> float:
    """Weight bytes one decode step of `batch` rows reads: the engine's own figure (a q8_0
    GGUF), else the checkpoint's per-width figure (a mixture of experts reads more experts as
    the batch grows), else the one figure older results.json files carry."""
    wb = results["weight_bytes"]
    if engine and engine != "bf16" and wb.get(engine):
        return wb[engine]
    return wb.get("per_step", {}).get(batch) or wb["bf16"]


def summarize(results: dict) -> dict:
    """Adds per-(threads, engine) medians, ratios to llama.cpp and roofline fractions."""
    cfg = results["config"]
    prefill, batches = cfg["prefill"], cfg["batch"]
    summary = {}
    for threads, per_engine in results["samples"].items():
        bw = results["bandwidth"].get(threads, {}).get("median_gbs")
        rows = {}
        for engine, samples in per_engine.items():
            if not samples:
                continue
            row = medians(samples, prefill, batches)
            if bw:
                # Decode reads every weight it needs once per step, whatever the batch width,
                # so B rows per step can reach B x bandwidth / (bytes of that step) tokens/s
                # (KV reads ignored). Dense: the same bytes at every width.
                row["roofline_tps_b1"] = bw * 1e9 / step_bytes(results, engine, "1")
                row["roofline_fraction"] = {
                    b: v / (int(b) * bw * 1e9 / step_bytes(results, engine, b))
                    for b, v in row["decode"].items()}
            rows[engine] = row
        base = rows.get(BASELINE)
        for engine, row in rows.items():
            if base:
                row["ratio_to_llama_cpp"] = {
                    f"{section} {key}": row[section][key] / base[section][key]
                    for section, key, _ in metric_keys(prefill, batches)
                    if key in row[section] and key in base[section] and base[section][key] > 0}
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
        out += [f"{where}, `metrale bench` with "
                f"`--compute {m.get('compute')}` `--weights {m.get('weights')}` "
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


def greedy_line(results: dict) -> str | None:
    """The greedy check's one line (run.py's "greedy" entry), or None when results.json has
    none (older runs, --no-greedy, or not both metrale and llama.cpp)."""
    g = results.get("greedy")
    if not g or g.get("skipped"):
        return None
    head = (f"Greedy tokens ({g['tokens']} from the same {len(g['prompt'])}-token prompt, "
            f"{g['precision']}, {g['threads']} thread(s)): ")
    if g.get("errors"):
        return head + "not compared: " + "; ".join(
            f"{e} failed ({msg.strip().splitlines()[0] if msg.strip() else 'no output'})"
            for e, msg in g["errors"].items()) + " (results.json, greedy.errors)."
    k = g.get("first_difference")
    if k is None:
        return head + "identical."
    m = g.get("llama_cpp_margin_at_difference")
    runner_up = {True: ", where metrale took llama.cpp's runner-up",
                 False: ", where metrale's token was not llama.cpp's runner-up"}.get(
        g.get("metrale_took_llama_cpp_runner_up"), "")
    return head + (f"first differ at step {k} (0-based; llama.cpp's top-2 margin there: "
                   f"{fmt(m, '.4g')}{runner_up}); ids in results.json, greedy.")


def markdown(results: dict, summary: dict) -> str:
    cfg = results["config"]
    cols = metric_keys(cfg["prefill"], cfg["batch"])
    head = ["threads", "engine"] + [c[2] + " t/s" for c in cols] + \
           ["peak RSS MiB", "b1 % roofline"]
    lines = command_block(results)
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for threads, rows in summary.items():
        for engine in ENGINES:
            row = rows.get(engine)
            if not row:
                continue
            vals = [fmt(row[s].get(k)) for s, k, _ in cols]
            rss = row["peak_rss_bytes"]
            frac = row.get("roofline_fraction", {}).get("1")
            lines.append("| " + " | ".join([threads, engine] + vals + [
                fmt(rss / 2**20 if rss else None, ".0f"),
                fmt(frac * 100 if frac is not None else None, ".0f")]) + " |")
    lines.append("")
    ratio_rows = [(threads, engine, row["ratio_to_llama_cpp"])
                  for threads, rows in summary.items() for engine in ENGINES
                  for row in [rows.get(engine)]
                  if row and engine != BASELINE and "ratio_to_llama_cpp" in row]
    if ratio_rows:
        lines.append(f"Ratio to llama.cpp ({cfg['llama_outtype']}, same threads; > 1 is faster):")
        lines.append("")
        head = ["threads", "engine"] + [c[2] for c in cols]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for threads, engine, r in ratio_rows:
            lines.append("| " + " | ".join([threads, engine] + [
                fmt(r.get(f"{s} {k}"), ".2f") for s, k, _ in cols]) + " |")
        lines.append("")
    bw = ", ".join(f"{t} thread(s) {fmt(v.get('median_gbs'))} GB/s"
                   for t, v in results["bandwidth"].items())
    lines.append(f"Read bandwidth (bench/bandwidth_probe, median of runs): {bw}. "
                 f"{bytes_note(results)} Medians of {cfg['reps']} interleaved repetitions.")
    greedy = greedy_line(results)
    if greedy:
        lines += ["", greedy]
    won = sorted({r.get("strategy_text") for runs in results.get("bandwidth_runs", {}).values()
                  for r in runs if r.get("strategy_text")})
    if won:
        lines.append("")
        lines.append("Probe read strategies that won the sweep: " + "; ".join(won) + ".")
    return "\n".join(lines) + "\n"


def chart(results: dict, summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    cols = metric_keys(cfg["prefill"], cfg["batch"])
    threads = list(summary)
    fig, axes = plt.subplots(1, len(cols), figsize=(3.2 * len(cols), 3.6))
    if len(cols) == 1:
        axes = [axes]
    engines = [e for e in ENGINES if any(e in rows for rows in summary.values())]
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
                              label="bf16 roofline" if j == 0 else None)
        ax.set_xticks(range(len(threads)), [f"{t} thr" for t in threads])
        ax.set_title(title + " (t/s)", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"{cfg['model']} — {cfg['precision']}, medians of {cfg['reps']} interleaved reps",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict, out_dir: Path, chart_png: bool = True) -> str:
    summary = summarize(results)
    results["summary"] = summary
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
