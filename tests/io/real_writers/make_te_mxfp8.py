"""Writes te<VERSION>_mxfp8.pt: TransformerEngine's MXFP8Tensor as each release pickled it, made
by that release's own code, as make_te_float8.py does for Float8Tensor (its stand-ins and TE's
compiled DType enum are shared with it).

From TE's git history at each tag: MXFP8Tensor's `__reduce_ex__` and `_make_in_reduce_ex`, and
the module-level `_make_mxfp8_tensor_in_reduce_ex` (TE >= 2.16), of mxfp8_tensor.py, run in a
stand-in class of the module TE defines it in. Its arguments grew release by release (checked at
every tag): 6 (2.0-2.2), 7 with the shape (2.3-2.5), 8 with the quantizer (2.6-2.11), 9 with
with_gemm_swizzled_scales (2.12-2.15), all through getattr(MXFP8Tensor, '_make_in_reduce_ex');
then the module-level function with 9 (2.16 on). TE's dtype codes: float8 e4m3 is 6 up to 2.3, 7
from 2.4 (the enum compiled from each tag says which).

torch.save (PyTorch 2.15) pickles one expert weight [4, 64]: row-wise E4M3 codes (byte k is k %
256) and E8M0 scales padded as TE pads them ([128, 4], the [4, 2] corner 127 + r + c, the rest
0), no column-wise copy, beside a BF16 tensor. The quantizer is None: TE's code accepts and
pickles it so; its own pickled fields differ by release. tests/io/real_writers_test.cpp reads the
committed files.

    PY=$(bash scripts/peer-env.sh | tail -1)
    $PY tests/io/real_writers/make_te_mxfp8.py TE_GIT_DIR [TAG ...]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from make_te_float8 import main, source_of, stand_in  # noqa: E402

# One release of each form: 6, 7 (old numbering; and new), 8, 9 arguments, module-level.
TAGS = ["v2.0", "v2.3", "v2.4", "v2.6", "v2.12", "v2.16", "v2.18"]


def write(repo, tag, out):
    import torch
    path, source = source_of(repo, tag, "transformer_engine/pytorch/tensor/mxfp8_tensor.py")
    MXFP8Tensor, fp8_dtype, _ = stand_in(repo, tag, path, source, "MXFP8Tensor",
                                         "_make_mxfp8_tensor_in_reduce_ex")

    rows, cols = 4, 64
    codes = (torch.arange(rows * cols, dtype=torch.int32) % 256).to(torch.uint8).reshape(rows, cols)
    scales = torch.zeros(128, 4, dtype=torch.uint8)  # TE's padding of [4, 2] block scales
    for r in range(rows):
        for c in range(cols // 32):
            scales[r, c] = 127 + r + c
    t = MXFP8Tensor.__new__(MXFP8Tensor)
    t._rowwise_data, t._rowwise_scale_inv = codes, scales
    t._columnwise_data = t._columnwise_scale_inv = None
    t._fp8_dtype, t.dtype, t.shape = fp8_dtype, torch.bfloat16, codes.shape
    t._quantizer, t._with_gemm_swizzled_scales = None, False
    sd = {"experts.weight0": t,
          "dense.weight": torch.arange(6, dtype=torch.float32).to(torch.bfloat16).reshape(2, 3)}
    torch.save(sd, out)
    arity = len(MXFP8Tensor.__reduce_ex__(t, 2)[1])
    print(f"{out}: TransformerEngine {tag} ({arity} arguments, float8 e4m3 = {int(fp8_dtype)}), "
          f"torch {torch.__version__}, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main(__file__, __doc__, TAGS, write, "mxfp8")
