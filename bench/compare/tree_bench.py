#!/usr/bin/env python3
"""Draft trees against chains: `metrale bench --speculative mtp|ngram --draft-tree SPEC`, each
shape beside the chain of the same depth, on the same models and prompts as spec_bench.py.

    python3 bench/compare/tree_bench.py --threads 2 --compute bf16 --decode-tokens 128 --reps 3 \\
        --mtp-trees 'chain:3;-1,-1,0,0,2,2;-1,-1,-1,0,0,3,3' --mtp-batch 1,4 \\
        --ngram-trees 'chain:4;-1,-1,0,0,1,2,3,4,5' --out out/trees

MTP runs on models/demo_mtp padded to be memory-bound, n-gram on models/demo_copy padded with
the input-grounded edit prompt (spec_bench.py's (a) and (b); tools/demo/pad_demo.py), or
(--ngram-model demo --ngram-prompt genesis) models/demo padded with bench's Genesis prompt, whose
phrases recur with different continuations ("And God said / saw / called"). Each row
is one `metrale bench` (greedy generation by B streams, --decode-tokens each, without and with
speculation, median of --reps timed runs after a warm-up, output compared token for token; a
difference fails the run), with --draft-tokens set to the shape's depth. llama.cpp's pinned
llama-lookup drafts chains only, so there is no peer row here; spec_bench.py has it.
A shape written SHAPE@P runs with --draft-branch-p P (MTP: a runner-up token becomes a branch
only where the drafter gives it at least probability P); its "nodes" are the shape's, the most
it drafts. results.json records every command and figure; table.md the table, headed by the
command.
"""

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "compare"))
import spec_bench  # noqa: E402


def depth_of(spec: str) -> int:
    if spec.startswith("chain:"):
        return int(spec[len("chain:"):])
    parents = [int(x) for x in spec.split(",")]
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth)


def nodes_of(spec: str) -> int:
    return int(spec[len("chain:"):]) if spec.startswith("chain:") else len(spec.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "release" / "src" / "metrale"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compute", default="bf16", choices=["f32", "bf16"])
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mtp-trees", default="chain:3;-1,-1,0,0,2,2")
    ap.add_argument("--mtp-batch", type=spec_bench.int_list, default=[1, 4])
    ap.add_argument("--ngram-trees", default="chain:4;-1,-1,0,0,1,2,3,4,5")
    ap.add_argument("--ngram-model", default="demo_copy", choices=["demo", "demo_copy"])
    ap.add_argument("--ngram-prompt", default="edit", choices=["edit", "genesis"],
                    help="edit: spec_bench's input-grounded copy task; genesis: bench's default "
                    "prompt, whose phrases recur with different continuations")
    ap.add_argument("--cache-dir", default=str(REPO / "build" / "bench-cache"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.draft_ladder = ""  # every batch drafts the whole shape
    cache = Path(a.cache_dir).resolve()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    commands: list = []
    mtp_model = spec_bench.padded(cache, "demo_mtp", "demo_mtp_padded")
    ngram_model = spec_bench.padded(cache, a.ngram_model, a.ngram_model + "_padded")
    ngram_prompt = spec_bench.EDIT_PROMPT if a.ngram_prompt == "edit" else spec_bench.PROMPT
    runs = []
    for kind, model, specs, batches, prompt in (
            ("mtp", mtp_model, a.mtp_trees, a.mtp_batch, spec_bench.PROMPT),
            ("ngram", ngram_model, a.ngram_trees, [1], ngram_prompt)):
        for item in filter(None, specs.split(";")):
            # SHAPE@P: an MTP tree with --draft-branch-p P.
            spec, _, branch_p = item.partition("@")
            spec_bench.log(f"{kind} {item}")
            extra = () if spec.startswith("chain:") else ("--draft-tree", spec)
            if branch_p:
                extra += ("--draft-branch-p", branch_p)
            r = spec_bench.metrale_bench(a, model, kind, depth_of(spec), batches, commands,
                                         prompt, extra)
            runs.append({"kind": kind, "tree": item, "nodes": nodes_of(spec),
                         "depth": depth_of(spec), **r})
    results = {"argv": sys.argv, "options": vars(a), "metrale_commit": spec_bench.git_commit(),
               "runs": runs, "commands": commands}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["```", "python3 " + " ".join(
        x if re.fullmatch(r"[\w./:,=-]+", x) else repr(x) for x in sys.argv), "```", "",
        f"metrale {results['metrale_commit']}; {a.threads} thread(s); --compute {a.compute}; "
        f"{a.decode_tokens} new tokens per stream; median of {a.reps}.", "",
        "| drafter | shape | nodes | depth | batch | off tokens/s | on tokens/s | on / off | "
        "accepted per verify step | drafted | accepted | identical | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for row in r["rows"]:
            lines.append(
                f"| {r['kind']} | `{r['tree']}` | {r['nodes']} | {r['depth']} | {row['batch']} | "
                f"{row['off_tps']:.0f} | {row['on_tps']:.0f} | "
                f"{row['on_tps'] / row['off_tps']:.2f}x | {row['accepted_per_step']:.2f} | "
                f"{row['drafted']} | {row['accepted']} | {'yes' if row['identical'] else 'NO'} | "
                f"{row['load']} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
