"""grouplin.load / save / inspect / convert / verify on files and sharded directories."""

import gc
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
import torch

import grouplin
from conftest import ROOT, address_of, inside, mapped_ranges, run_on_threads, te_checkpoint


def test_load_gives_read_only_views_of_the_mapping(tmp_path, rng):
    path = str(tmp_path / "m.safetensors")
    want = te_checkpoint(rng)
    safetensors.numpy.save_file(want, path)  # the reference writer
    got = grouplin.load(path)
    assert list(got) == list(safetensors.numpy.load_file(path))
    ranges = mapped_ranges(path)
    assert ranges, "the file is not mapped"
    for name, array in got.items():
        np.testing.assert_array_equal(array, want[name])
        assert inside(address_of(array), array.nbytes, ranges), name  # no copy
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[...] = 0


def test_arrays_keep_the_mapping_alive(tmp_path, rng):
    path = str(tmp_path / "m.safetensors")
    want = te_checkpoint(rng)
    grouplin.save(path, want)
    w = grouplin.load(path)["layers.0.experts.weight2"]  # the dict is gone at once
    gc.collect()
    os.remove(path)  # the mapping holds the inode
    gc.collect()
    np.testing.assert_array_equal(w, want["layers.0.experts.weight2"])
    del w
    gc.collect()


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_save_load_round_trip_every_dtype(tmp_path, rng, fmt):
    import ml_dtypes
    values = rng.standard_normal((3, 5)).astype(np.float32)
    tensors = {
        "f32": values, "f16": values.astype(np.float16), "f64": values.astype(np.float64),
        "bf16": values.astype(ml_dtypes.bfloat16),
        "e4m3": values.astype(ml_dtypes.float8_e4m3fn),
        "e5m2": values.astype(ml_dtypes.float8_e5m2),
        "i64": np.arange(6, dtype=np.int64), "i32": np.arange(4, dtype=np.int32) - 2,
        "i8": np.arange(3, dtype=np.int8), "u8": np.arange(7, dtype=np.uint8),
        "bool": np.array([True, False, True]), "scalar": np.array(2.5, dtype=np.float32),
    }
    if fmt == "safetensors":
        tensors["e8m0"] = np.array([1.0, 2.0, 0.25], dtype=ml_dtypes.float8_e8m0fnu)
    path = str(tmp_path / f"all.{fmt}")
    grouplin.save(path, tensors, format=fmt)
    got = grouplin.load(path)
    assert got.format == fmt
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), name


def test_peers_read_what_grouplin_writes(tmp_path, rng):
    tensors = te_checkpoint(rng)
    grouplin.save(tmp_path / "m.safetensors", tensors, metadata={"format": "pt"})
    ref = safetensors.numpy.load_file(str(tmp_path / "m.safetensors"))
    grouplin.save(tmp_path / "m.pt", tensors)
    pt = torch.load(str(tmp_path / "m.pt"), weights_only=True)
    for name, want in tensors.items():
        np.testing.assert_array_equal(ref[name], want)
        np.testing.assert_array_equal(pt[name].numpy(), want)
    assert grouplin.load(tmp_path / "m.safetensors").metadata == {"format": "pt"}


def test_grouplin_reads_what_torch_save_writes(tmp_path):
    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(3).bfloat16(),
          "view": torch.arange(10, dtype=torch.int64)[2:7]}
    torch.save(sd, str(tmp_path / "t.pt"))
    got = grouplin.load(tmp_path / "t.pt")
    assert got.format == "pt"
    np.testing.assert_array_equal(got["w"], sd["w"].numpy())
    np.testing.assert_array_equal(got["view"], sd["view"].numpy())
    assert got.dtypes["b"] == "BF16"
    assert got["b"].astype(np.float32).tolist() == [1.0, 1.0, 1.0]


def test_non_contiguous_and_torch_inputs_save_their_values(tmp_path):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous: copied
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    grouplin.save(tmp_path / "x.safetensors", {"a": a, "t": t, "list": [1.0, 2.0]})
    got = grouplin.load(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["t"], t.numpy())
    np.testing.assert_array_equal(got["list"], [1.0, 2.0])


def test_save_is_atomic(tmp_path, rng):
    path = tmp_path / "m.safetensors"
    grouplin.save(path, {"a": np.ones(3, np.float32)})
    before = path.read_bytes()
    with pytest.raises(grouplin.Error) as e:  # a dtype GroupLin has not: nothing written
        grouplin.save(path, {"a": np.ones(3, np.float32), "c": np.ones(2, np.complex64)})
    assert e.value.code == "UnsupportedDType"
    assert "'c'" in str(e.value) or '"c"' in str(e.value)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


def _inspect_cli(cli, path):
    out = subprocess.run([cli, "inspect", str(path), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_inspect_is_the_cli_document(tmp_path, rng, cli):
    path = tmp_path / "m.safetensors"
    grouplin.save(path, te_checkpoint(rng))
    doc = grouplin.inspect(path)
    assert doc == _inspect_cli(cli, path)
    assert {"grouped_modules", "tensors", "totals", "problems", "warnings"} <= set(doc)
    (module,) = doc["grouped_modules"]
    assert module["prefix"] == "layers.0.experts."
    assert module["num_experts"] == 4 and module["layout"] == "per-expert"
    assert doc["totals"]["experts"] == 4


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
@pytest.mark.parametrize("bias", [True, False])
def test_convert_between_layouts_is_exact(tmp_path, rng, fmt, bias):
    # TransformerEngine names without _extra_state: what GroupLin writes, GroupLin recognises
    # without rules (a stacked bias tells the stack from a convolution; a safetensors output
    # declares a lone stacked weight in its metadata). A lone stack in a .pt takes rules="te".
    sd = te_checkpoint(rng, bias=bias)
    src = tmp_path / f"per.{fmt}"
    grouplin.save(src, sd)
    single = tmp_path / f"single.{fmt}"
    report = grouplin.convert(src, single, layout="single")
    assert report["output_tensors"] == (3 if bias else 2) and report["grouped_modules"] == 1
    assert report["rules"] == ["te"] and report["rules_from"] == "names"
    got = grouplin.load(single)
    np.testing.assert_array_equal(got["layers.0.experts.weight"],
                                  np.stack([sd[f"layers.0.experts.weight{i}"] for i in range(4)]))
    np.testing.assert_array_equal(got["embed.weight"], sd["embed.weight"])
    if fmt == "safetensors":  # the reference reader takes the output, declaration included
        from safetensors import safe_open
        with safe_open(str(single), "np") as f:
            declared = (f.metadata() or {}).get("grouplin.grouped_modules")
            assert declared == (None if bias else '["layers.0.experts."]')
        ref = safetensors.numpy.load_file(str(single))
        assert ref.keys() == got.keys()
        for name, value in ref.items():
            assert value.tobytes() == got[name].tobytes()
    rules = "te" if fmt == "pt" and not bias else None
    assert grouplin.verify(src, single, rules=rules).same
    back = tmp_path / f"back.{fmt}"
    grouplin.convert(single, back, layout="per-expert", rules=rules)
    assert grouplin.load(back).keys() == sd.keys()
    for name, want in sd.items():
        assert grouplin.load(back)[name].tobytes() == want.tobytes()
    if rules:
        with pytest.raises(grouplin.Error) as e:
            grouplin.convert(single, tmp_path / "again.pt", layout="per-expert")
        assert e.value.code == "NoGroupedModules" and "--rules te" in str(e.value)


def test_convert_sharded_hub_checkpoint_to_stacked(tmp_path):
    import hf_shards_peer  # shards written by the reference safetensors, as the Hub has them
    hub = str(tmp_path / "hub")
    hf_shards_peer.make(hub, "qwen", True)
    fused = str(tmp_path / "fused")
    report = grouplin.convert(hub, fused, layout="single", max_shard_size="1KB")
    assert report["directory_output"] and len(report["output_files"]) > 1
    assert report["rules_from"] == "model_type", report  # config.json names the family
    assert "config.json" in report["copied_files"]
    assert hf_shards_peer.check_fused(hub, fused, "qwen") == []  # transformers 5's fused form
    assert grouplin.verify(hub, fused).same
    loaded = grouplin.load(fused)
    assert loaded.model_type == "qwen3_moe" or loaded.model_type != ""
    assert len(loaded.shards) == len(report["output_files"]) - 1  # the shards and the index


def test_a_family_named_by_config_json_goes_with_the_converted_file(tmp_path):
    # A fused Mixtral written to one file (no config.json beside it) converts back under
    # Mixtral's own names, and verify reads a side without config.json by the other's family.
    import hf_shards_peer
    hub = str(tmp_path / "hub")
    hf_shards_peer.make(hub, "mixtral", True)
    fused = tmp_path / "fused.safetensors"
    report = grouplin.convert(hub, fused, layout="single")
    assert report["rules_from"] == "model_type"
    from safetensors import safe_open
    with safe_open(str(fused), "np") as f:
        assert f.metadata()["grouplin.model_type"] == "mixtral"
    back = tmp_path / "back.safetensors"
    grouplin.convert(fused, back, layout="per-expert")
    assert sorted(grouplin.load(back).keys()) == sorted(grouplin.load(hub).keys())
    result = grouplin.verify(hub, back)
    assert result.same, result.differences
    # A fused file without the record: verify against the directory reads it as Mixtral.
    plain = tmp_path / "plain.safetensors"
    sd = grouplin.load(fused)
    grouplin.save(plain, {k: sd[k] for k in sd.keys()})
    result = grouplin.verify(hub, plain)
    assert result.same, result.differences
    assert any("read by the rules of" in w.message for w in result.warnings)


def test_convert_expert_range_and_progress(tmp_path, rng):
    sd = te_checkpoint(rng, experts=6)
    grouplin.save(tmp_path / "m.safetensors", sd)
    seen = []
    grouplin.convert(tmp_path / "m.safetensors", tmp_path / "r.safetensors", layout="single",
                     experts=(2, 5), progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1]
    w = grouplin.load(tmp_path / "r.safetensors")["layers.0.experts.weight"]
    np.testing.assert_array_equal(w, np.stack([sd[f"layers.0.experts.weight{i}"]
                                               for i in range(2, 5)]))


def test_a_failing_progress_callback_leaves_nothing(tmp_path, rng):
    grouplin.save(tmp_path / "m.safetensors", te_checkpoint(rng))

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grouplin.convert(tmp_path / "m.safetensors", tmp_path / "o.safetensors", progress=stop)
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_verify_lists_differences(tmp_path, rng):
    sd = te_checkpoint(rng)
    grouplin.save(tmp_path / "a.safetensors", sd)
    sd["layers.0.experts.weight1"] = sd["layers.0.experts.weight1"].copy()
    sd["layers.0.experts.weight1"][2, 3] += 1
    grouplin.save(tmp_path / "b.pt", sd)
    r = grouplin.verify(tmp_path / "a.safetensors", tmp_path / "b.pt", max_listed=5)
    assert not r.same and not r
    assert r.differing == 1
    assert "weight1" in r.differences[0] and "[2, 3]" in r.differences[0]


def test_errors_name_code_problems_and_input(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 12}      ")
    with pytest.raises(grouplin.Error) as e:
        grouplin.load(bad)
    err = e.value
    assert err.code in grouplin._core.error_code_names()
    assert str(err).startswith(err.code + ": ") and "bad.safetensors" in str(err)
    assert err.problems and err.problems[0].code == err.code
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.code, copy.message, str(copy)) == (err.code, err.message, str(err))
    with pytest.raises(grouplin.Error) as e:
        grouplin.convert(bad, tmp_path / "o.safetensors", layout="stacked")
    assert e.value.code == "InvalidArgument" and "stacked" in str(e.value)
    with pytest.raises(grouplin.Error) as e:
        grouplin.load(tmp_path / "missing.pt")
    assert e.value.code == "IoError" and "missing.pt" in e.value.message
    with pytest.raises(TypeError):
        grouplin.load(42)


def test_every_error_code_reaches_python_by_name():
    for code in grouplin._core.error_code_names():
        with pytest.raises(grouplin.Error) as e:
            grouplin._core.raise_error(code, "why")
        assert e.value.code == code and e.value.message == "why"


def test_free_functions_run_on_several_threads(tmp_path, rng):
    sd = te_checkpoint(rng, experts=8, out_features=64, in_features=64)
    grouplin.save(tmp_path / "m.safetensors", sd)
    results = {}

    def work(k):
        out = tmp_path / f"o{k}.{'pt' if k % 2 else 'safetensors'}"
        grouplin.convert(tmp_path / "m.safetensors", out, layout="single")
        results[k] = (grouplin.verify(tmp_path / "m.safetensors", out, rules="te").same,
                      grouplin.load(out)["layers.0.experts.weight"].sum())

    assert run_on_threads(work, 6) == []
    assert len({r for r in results.values()}) == 1 and all(r[0] for r in results.values())


RAW_VIEW = r"""
import sys
sys.modules["ml_dtypes"] = None  # as if it were not installed
import numpy as np, grouplin
path = sys.argv[1]
bits = np.array([0x3f80, 0x4000, 0xbf80], dtype=np.uint16)  # 1, 2, -1 in BF16
grouplin.save(path, {"w": bits, "codes": np.array([0x38, 0x40], np.uint8)},
              dtypes={"w": "BF16", "codes": "F8_E4M3"})
c = grouplin.load(path)
assert c["w"].dtype == np.uint16 and c.dtypes["w"] == "BF16", c["w"].dtype
assert c["w"].tolist() == bits.tolist()
assert c["codes"].dtype == np.uint8 and c.dtypes["codes"] == "F8_E4M3"
assert grouplin.numpy_dtype("BF16") == np.uint16
layer = grouplin.GroupedLinear(2, 3, 4, params_dtype="BF16")
assert layer.expert_weight(0).dtype == np.uint16
y = layer.forward(np.zeros((2, 3), np.uint16), [1, 1])
assert y.dtype == np.uint16 and y.shape == (2, 4)
print("ok")
"""


def test_without_ml_dtypes_bf16_and_fp8_are_raw_codes(tmp_path):
    out = subprocess.run([sys.executable, "-c", RAW_VIEW, str(tmp_path / "raw.safetensors")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    import ml_dtypes
    c = grouplin.load(tmp_path / "raw.safetensors")  # with ml_dtypes: its types, same bits
    assert c["w"].dtype == ml_dtypes.bfloat16
    assert c["w"].astype(np.float32).tolist() == [1.0, 2.0, -1.0]
    assert c["codes"].astype(np.float32).tolist() == [1.0, 2.0]


def test_the_python_example_runs_on_a_hub_checkpoint(tmp_path):
    import hf_shards_peer
    hub = str(tmp_path / "hub")
    hf_shards_peer.make(hub, "qwen", True)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python",
                                                       "moe_checkpoint.py"), hub,
                          str(tmp_path / "fused")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "verify: same" in out.stdout
    worst = float(out.stdout.rsplit("loop: ", 1)[1])
    assert worst < 0.1  # BF16 outputs against an F32 loop


def test_training_checkpoint_of_several_models_reads_the_one_named(tmp_path):
    # Megatron-LM's model_optim_rng.pt of two model chunks, written by torch.save of PyTorch 2.15
    # (tests/io/real_writers/make_torch_wrappers.py).
    vp = os.path.join(ROOT, "tests", "io", "real_writers", "torch2_15_megatron_vp.pt")
    with pytest.raises(grouplin.Error) as e:
        grouplin.inspect(vp)
    assert e.value.code == "SeveralStateDicts"
    doc = grouplin.inspect(vp, state_dict_key="model1")
    assert [m["num_experts"] for m in doc["grouped_modules"]] == [4]
    out = str(tmp_path / "chunk1.safetensors")
    grouplin.convert(vp, out, layout="single", state_dict_key="model1")
    w = grouplin.load(out)["experts.weight"]
    assert w[2].reshape(-1)[5] == 1205.0  # model1's weights are model0's + 1000
    assert grouplin.verify(vp, out, state_dict_key="model1").same
