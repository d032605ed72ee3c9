"""FP8 `.pt` files both ways with PyTorch 2.x itself: what torch.save writes GroupLin reads, and
what GroupLin writes torch.load(weights_only=True) reads, every byte the same."""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

from peers import SOURCE, ScratchTest, grouplin

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]


def codes(shape, dtype, first=0):
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n, dtype=torch.int32) + first) % 256).to(torch.uint8).view(dtype).reshape(
        shape).clone()


def same(a, b):
    """Same dtype, shape and bytes (float8 compares by its codes)."""
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def te_module(n=4):
    """A TransformerEngine-named module of FP8 experts with their 128 x 128 block scales, beside
    dense entries of the dtypes torch pickles with _rebuild_tensor_v3."""
    sd = {}
    for i in range(n):
        sd[f"mlp.experts.weight{i}"] = codes((8, 16), torch.float8_e4m3fn, 17 * i)
    for i in range(n):
        sd[f"mlp.experts.weight{i}_scale_inv"] = torch.full((1, 1), 0.5 + i, dtype=torch.float32)
    sd["e5m2"] = codes((4, 16), torch.float8_e5m2)
    sd["e8m0"] = codes((16,), torch.float8_e8m0fnu)
    sd["u16"] = torch.arange(6, dtype=torch.int32).to(torch.uint16).reshape(2, 3)
    sd["bf16"] = torch.arange(6, dtype=torch.float32).to(torch.bfloat16).reshape(2, 3)
    return sd


class TorchPt(ScratchTest):
    def test_grouplin_pt_output_loads_with_weights_only(self):
        sd = te_module()
        save_file(sd, self.path("in.safetensors"))
        for layout in ("single", "per-expert"):
            with self.subTest(layout=layout):
                out = self.path(f"{layout}.pt")
                grouplin("convert", self.path("in.safetensors"), out, "--layout", layout)
                got = torch.load(out, weights_only=True)
                if layout == "single":
                    want = {k: v for k, v in sd.items() if not k.startswith("mlp.experts.")}
                    want["mlp.experts.weight"] = torch.stack(
                        [sd[f"mlp.experts.weight{i}"] for i in range(4)])
                    want["mlp.experts.weight_scale_inv"] = torch.stack(
                        [sd[f"mlp.experts.weight{i}_scale_inv"] for i in range(4)])
                else:
                    want = sd
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    self.assertTrue(same(got[k], want[k]), k)

    def test_torch_save_float8_reads_in_grouplin(self):
        sd = te_module()
        torch.save(sd, self.path("in.pt"))
        grouplin("convert", self.path("in.pt"), self.path("out.safetensors"), "--layout",
                 "per-expert")
        got = load_file(self.path("out.safetensors"))
        self.assertEqual(sorted(got), sorted(sd))
        for k in sd:
            self.assertTrue(same(got[k], sd[k]), k)

    def test_committed_fixture_is_what_its_script_writes(self):
        # tests/io/real_writers_test.cpp reads the committed file without PyTorch: it must hold
        # what torch.save writes of the script's dict, and load as such.
        script = os.path.join(SOURCE, "tests", "io", "real_writers", "make_torch_float8.py")
        fresh = self.path("fresh.pt")
        subprocess.run([sys.executable, script, fresh], check=True, capture_output=True)
        committed = torch.load(os.path.join(os.path.dirname(script), "torch2_15_float8.pt"),
                               weights_only=True)
        again = torch.load(fresh, weights_only=True)
        self.assertEqual(list(committed), list(again))
        for k in again:
            self.assertTrue(same(committed[k], again[k]), k)
