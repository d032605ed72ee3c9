#!/usr/bin/env python3
"""Turns `grouplin bench --json` output into the result tables of docs/PERFORMANCE.md.

    build/grouplin bench --reps 3 --json --plot-data docs/grouped_gemm.dat > gemm.json
    python3 bench/gemm_report.py gemm.json > tables.md

Prints markdown: the goals, per-operation tables (GF/s and ratios to the same-run dense sgemm and
per-expert loop), the memory-bound cases against copy bandwidth, the cases slower than the loop,
bgrad, and a per-goal summary split by rows per expert. Every number comes from the JSON.
"""

import json
import statistics
import sys

ROUTINGS = ["uniform", "skewed", "empty25", "one"]
DTYPES = ["f32", "bf16"]


def fmt(v, digits=2):
    return f"{v:.{digits}f}"


def rows_per_expert(r):
    return r["rows"] / r["experts"]


def cases(results, op):
    """(shape, T) keys in run order, and the results of `op` by (shape, T, routing)."""
    keys, by = [], {}
    for r in results:
        key = (r["shape"], r["rows"])
        if key not in keys:
            keys.append(key)
        if r["op"] == op:
            by[(r["shape"], r["rows"], r["routing"])] = r
    return keys, by


def op_table(results, op):
    keys, by = cases(results, op)
    out = [
        f"#### {op}: GroupLin F32 GF/s, and its ratio to the same-run dense sgemm / per-expert loop",
        "",
        "| shape | T | rows/expert | dense GF/s | " + " | ".join(ROUTINGS) + " | BF16 / F32 (uniform) |",
        "|---|---|---|---|" + "---|" * len(ROUTINGS) + "---|",
    ]
    for shape, t in keys:
        uniform = by.get((shape, t, "uniform"))
        if uniform is None:
            continue
        cells = []
        for routing in ROUTINGS:
            r = by.get((shape, t, routing))
            f = r and r.get("f32")
            cells.append(
                f"{f['grouplin_gflops']:.0f} ({fmt(f['vs_dense'])} / {fmt(f['vs_loop'])})" if f else "—"
            )
        bf = uniform.get("bf16")
        out.append(
            f"| {shape} | {t} | {fmt(rows_per_expert(uniform), 3).rstrip('0').rstrip('.')} | "
            f"{uniform['dense_gflops']:.0f} | " + " | ".join(cells) + f" | {fmt(bf['vs_f32']) if bf else '—'} |"
        )
    return out


def memory_table(results):
    out = [
        "#### Memory-bound cases (mean rows per active expert < 16): GB/s of weight traffic "
        "(wgrad: of weight gradients written), ratio to a same-run copy of as many bytes",
        "",
        "| shape | T | op | " + " | ".join(f"{r} F32 / BF16" for r in ROUTINGS) + " |",
        "|---|---|---|" + "---|" * len(ROUTINGS),
    ]
    seen = []
    for r in results:
        key = (r["shape"], r["rows"], r["op"])
        if r["op"] == "bgrad" or key in seen:
            continue
        seen.append(key)
    for shape, t, op in seen:
        cells, any_bound = [], False
        for routing in ROUTINGS:
            r = next((x for x in results if (x["shape"], x["rows"], x["op"], x["routing"]) == (shape, t, op, routing)), None)
            if r is None or not r["memory_bound"]:
                cells.append("—")
                continue
            any_bound = True
            parts = []
            for dt in DTYPES:
                v = r.get(dt)
                parts.append(f"{v['grouplin_gbytes']:.0f} ({fmt(v['vs_copy'])})" if v else "—")
            cells.append(" / ".join(parts))
        if any_bound:
            out.append(f"| {shape} | {t} | {op} | " + " | ".join(cells) + " |")
    return out


def slower_than_loop(results, limit=0.95):
    slow = []
    for r in results:
        for dt in DTYPES:
            v = r.get(dt)
            if v and v.get("vs_loop", 1) < limit:
                slow.append(f"- {r['shape']} T={r['rows']} {r['routing']} {r['op']} {dt}: {fmt(v['vs_loop'])}")
    total = sum(1 for r in results for dt in DTYPES if r.get(dt))
    return [f"#### Cases slower than the per-expert loop (ratio < {limit})", "", f"{len(slow)} of {total}"] + slow


def bgrad_table(results):
    out = [
        "#### bgrad (column sums of dy): GB/s of dy read and bias gradients written, ratio to copy and to the loop, uniform routing",
        "",
        "| shape | T | F32 GB/s | x copy | x loop | BF16 GB/s | x copy | x loop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["op"] != "bgrad" or r["routing"] != "uniform":
            continue
        cells = []
        for dt in DTYPES:
            v = r.get(dt)
            cells += [f"{v['grouplin_gbytes']:.1f}", fmt(v["vs_copy"]), fmt(v["vs_loop"])] if v else ["—"] * 3
        out.append(f"| {r['shape']} | {r['rows']} | " + " | ".join(cells) + " |")
    return out


def summary(results):
    """Per goal: cases met, median and minimum, split into bands of rows per expert."""

    def line(name, values, limit):
        if not values:
            return f"| {name} | no cases |"
        met = sum(1 for v in values if v >= limit)
        return (f"| {name} | {met} of {len(values)} (median {fmt(statistics.median(values))}, "
                f"min {fmt(min(values))}) |")

    out = ["| goal | cases met (median, min) |", "|---|---|"]
    for op, limit in [("forward", 0.90), ("dgrad", 0.85), ("wgrad", 0.85)]:
        for lo, hi, band in [(32, 128, "32-64"), (128, 1e9, ">= 128")]:
            for dt in DTYPES:
                vals = [r[dt]["vs_dense"] for r in results
                        if r["op"] == op and dt in r and lo <= r["rows_per_expert"] < hi]
                out.append(line(f"{op} >= {limit} x dense, {band} rows/expert, {dt.upper()}", vals, limit))
    for dt in DTYPES:
        vals = [r[dt]["vs_copy"] for r in results
                if r["memory_bound"] and r["op"] != "bgrad" and dt in r]
        out.append(line(f"memory-bound >= 0.80 x copy (weights), {dt.upper()}", vals, 0.8))
        vals = [r[dt]["vs_copy"] for r in results if r["op"] == "bgrad" and dt in r]
        out.append(line(f"bgrad >= 0.80 x copy (dy + db), {dt.upper()}", vals, 0.8))
    vals = [r["bf16"]["vs_f32"] for r in results if "bf16" in r and r["bf16"].get("vs_f32")]
    out.append(line("BF16 >= 0.80 x F32", vals, 0.8))
    for op in ["forward", "dgrad", "wgrad", "bgrad"]:
        for dt in DTYPES:
            vals = [r[dt]["vs_loop"] for r in results if r["op"] == op and dt in r]
            out.append(line(f"never slower than the loop, {op} {dt.upper()}", vals, 1.0))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gemm_report.py BENCH.json")
    with open(sys.argv[1]) as f:
        data = json.load(f)
    results = data["results"]
    lines = [f"`{data['machine']}`, best of {data['reps']} interleaved repetitions", "", "#### Goals", "",
             "| goal | cases met | worst case |", "|---|---|---|"]
    for g in data["goals"]:
        lines.append(f"| {g['goal']} | {g['met']} of {g['cases']} | {fmt(g['worst'])} ({g['worst_case']}) |")
    for op in ["forward", "dgrad", "wgrad"]:
        lines += [""] + op_table(results, op)
    lines += [""] + memory_table(results)
    lines += [""] + slower_than_loop(results)
    lines += [""] + bgrad_table(results)
    lines += ["", "#### Summary by rows per expert", ""] + summary(results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
