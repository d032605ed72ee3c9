"""A Hugging Face MoE checkpoint from Python: inspect it, convert its experts to stacked
tensors (transformers v5's fused form), check the conversion bit for bit, and run one layer's
experts with GroupLin's GroupedLinear.

    python examples/python/moe_checkpoint.py Qwen3-30B-A3B/ Qwen3-30B-A3B-fused/

IN is a sharded Hugging Face directory (an index and its shards, config.json beside them).
Needs ml_dtypes (`pip install grouplin[ml_dtypes]`) for the BF16 activations of step 3.
"""

import sys

import ml_dtypes  # BF16 arrays as a NumPy type (without it GroupLin gives uint16 codes)
import numpy as np

import grouplin


def main(src: str, dst: str) -> None:
    # 1. What is there: from the headers only, instant at any size.
    doc = grouplin.inspect(src)
    print(f"{src}: {len(doc['shards'])} shard(s), model_type {doc['model_type']!r}, "
          f"{doc['totals']['grouped_modules']} grouped modules, {doc['totals']['experts']} experts")
    module = doc["grouped_modules"][0]
    print(f"first: {module['prefix']} {module['layout']}, {module['num_experts']} experts, "
          f"{module['dtype']}, rules {module['rules']}")

    # 2. Every module's experts stacked, streaming (about 1 MiB of memory), then checked.
    report = grouplin.convert(src, dst, layout="single", force=True)
    print(f"{dst}: {report['output_tensors']} tensors in {len(report['output_files'])} file(s), "
          f"{report['data_bytes']} bytes; copied {report['copied_files']}")
    result = grouplin.verify(src, dst)
    assert result.same, result.differences
    print(f"verify: same, {result.tensors_compared} tensors")

    # 3. The first layer's gate/up projection as a GroupedLinear: zero-copy views of the file.
    experts = grouplin.load(dst)
    gate_up = experts[module["prefix"] + "gate_up_proj"]  # [N, 2 * intermediate, hidden]
    n, out_features, in_features = gate_up.shape
    layer = grouplin.GroupedLinear(num_gemms=n, in_features=in_features,
                                   out_features=out_features, bias=False,
                                   params_dtype=experts.dtypes[module["prefix"] + "gate_up_proj"],
                                   weight_layout="single")
    layer.load_state_dict({"weight": gate_up})  # any layout loads into any layout

    rng = np.random.default_rng(0)
    m_splits = rng.multinomial(4 * n, [1.0 / n] * n).tolist()  # rows routed to each expert
    x = rng.standard_normal((sum(m_splits), in_features)).astype(np.float32)
    if layer.activation_dtype == "BF16":
        x = x.astype(ml_dtypes.bfloat16)
    y = layer.forward(x, m_splits)
    print(f"forward: x {x.shape} {x.dtype} -> y {y.shape} {y.dtype}, m_splits {m_splits}")

    # The same with NumPy, expert by expert.
    row, worst = 0, 0.0
    for e, m in enumerate(m_splits):
        want = x[row:row + m].astype(np.float32) @ gate_up[e].astype(np.float32).T
        worst = max(worst, float(np.abs(y[row:row + m].astype(np.float32) - want).max(initial=0)))
        row += m
    print(f"largest difference from a per-expert NumPy loop: {worst:.3g}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
