"""grouplin.GroupedLinear on NumPy arrays: values, layouts, views, lifetimes, errors, threads."""

import gc

import numpy as np
import pytest

import grouplin
from conftest import address_of, run_on_threads

LAYOUTS = ["per-expert", "contiguous", "single"]


def reference_forward(layer, x, splits):
    ys, row = [], 0
    for i, m in enumerate(splits):
        w = layer.expert_weight(i).astype(np.float64)
        b = layer.expert_bias(i).astype(np.float64)
        ys.append(x[row:row + m].astype(np.float64) @ w.T + b)
        row += m
    return np.concatenate(ys)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_backward_match_a_per_expert_loop(rng, layout):
    layer = grouplin.GroupedLinear(num_gemms=4, in_features=24, out_features=40,
                                   weight_layout=layout, seed=3)
    assert layer.weight_layout == layout
    splits = [5, 0, 9, 2]
    x = rng.standard_normal((16, 24)).astype(np.float32)
    y = layer.forward(x, splits)
    np.testing.assert_allclose(y, reference_forward(layer, x, splits), rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal((16, 40)).astype(np.float32)
    dx = layer.backward(dy)
    row = 0
    for i, m in enumerate(splits):
        w = layer.expert_weight(i)
        np.testing.assert_allclose(dx[row:row + m], dy[row:row + m] @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(layer.expert_weight_grad(i), dy[row:row + m].T @ x[row:row + m],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(layer.expert_bias_grad(i), dy[row:row + m].sum(0),
                                   rtol=1e-5, atol=1e-5)
        row += m


def test_layouts_give_the_same_bits(rng):
    x = rng.standard_normal((10, 8)).astype(np.float32)
    outs = [grouplin.GroupedLinear(3, 8, 6, weight_layout=l, seed=9).forward(x, [4, 4, 2])
            for l in LAYOUTS]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


def test_expert_weight_is_a_writable_view(rng):
    layer = grouplin.GroupedLinear(2, 4, 3)
    w = layer.expert_weight(1)
    assert address_of(w) == address_of(layer.expert_weight(1))
    w[...] = 0
    layer.expert_bias(1)[...] = 7
    y = layer.forward(rng.standard_normal((2, 4)).astype(np.float32), [1, 1])
    assert y[1].tolist() == [7.0, 7.0, 7.0]


def test_forward_reads_x_in_place_and_keeps_it_for_backward(rng):
    layer = grouplin.GroupedLinear(2, 6, 5)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    assert grouplin._core.data_address(x) == address_of(x)  # no copy on the way in
    want = x.copy()
    layer.forward(x, [2, 2])
    del x
    gc.collect()  # the layer holds its own reference
    layer.backward(np.ones((4, 5), np.float32))
    np.testing.assert_allclose(layer.expert_weight_grad(0), np.ones((5, 2)) @ want[:2],
                               rtol=1e-6)


def test_non_contiguous_input_gives_the_right_values(rng):
    layer = grouplin.GroupedLinear(2, 4, 3)
    wide = rng.standard_normal((6, 8)).astype(np.float32)
    x = wide[:, ::2]
    assert not x.flags.c_contiguous
    np.testing.assert_array_equal(layer.forward(x, [3, 3]),
                                  layer.forward(np.ascontiguousarray(x), [3, 3]))
    # The extension itself copies such an array rather than misread it.
    np.testing.assert_array_equal(layer._core.forward(x, None, [3, 3], "numpy"),
                                  layer.forward(np.ascontiguousarray(x), [3, 3]))


def test_bf16_layer_with_ml_dtypes(rng):
    import ml_dtypes
    layer = grouplin.GroupedLinear(2, 8, 4, params_dtype="BF16")
    x = rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    y = layer.forward(x, [1, 2])
    assert y.dtype == ml_dtypes.bfloat16
    f32 = reference_forward(layer, x.astype(np.float32), [1, 2])
    np.testing.assert_allclose(y.astype(np.float32), f32, rtol=2e-2, atol=2e-2)


def test_fp8_layer_runs_on_dequantized_weights(rng):
    layer = grouplin.GroupedLinear(2, 128, 64, params_dtype="F8_E4M3", activation_dtype="F32")
    scale = layer.expert_weight_scale(0)
    assert scale.shape == (1, 1) and scale.dtype == np.float32
    codes = layer.expert_weight(0)
    values = codes.astype(np.float32) * scale[0, 0]
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = layer.forward(x, [2, 0])
    np.testing.assert_allclose(y, x @ values.T + layer.expert_bias(0), rtol=1e-4, atol=1e-4)
    with pytest.raises(grouplin.Error) as e:
        layer.backward(np.ones((2, 64), np.float32))
        layer.expert_weight_grad(0)
    assert e.value.code == "Fp8WeightsNotTrainable"


@pytest.mark.parametrize("source", LAYOUTS)
@pytest.mark.parametrize("target", LAYOUTS)
def test_state_dict_loads_into_any_layout(rng, source, target):
    a = grouplin.GroupedLinear(3, 5, 4, weight_layout=source, seed=1)
    b = grouplin.GroupedLinear(3, 5, 4, weight_layout=target, seed=2)
    report = b.load_state_dict(a.state_dict())
    assert report["missing"] == [] and report["unexpected"] == []
    x = rng.standard_normal((6, 5)).astype(np.float32)
    assert a.forward(x, [2, 2, 2]).tobytes() == b.forward(x, [2, 2, 2]).tobytes()


def test_load_state_dict_is_all_or_nothing(rng):
    layer = grouplin.GroupedLinear(2, 3, 4, bias=False)
    before = layer.expert_weight(0).copy()
    sd = {"weight0": np.ones((4, 3), np.float32), "weight1": np.ones((5, 3), np.float32)}
    with pytest.raises(grouplin.Error) as e:
        layer.load_state_dict(sd)
    assert e.value.code == "ShapeMismatch" and "weight1" in str(e.value)
    np.testing.assert_array_equal(layer.expert_weight(0), before)


def test_bad_arguments_raise(rng):
    layer = grouplin.GroupedLinear(2, 3, 4)
    x = np.zeros((4, 3), np.float32)
    cases = [
        (lambda: layer.forward(x, [1, 2]), "SplitSumMismatch"),
        (lambda: layer.forward(x, [4]), "SplitCountMismatch"),
        (lambda: layer.forward(x.astype(np.float64), [2, 2]), "DTypeMismatch"),
        (lambda: layer.forward(np.zeros((4, 3, 1), np.float32), [2, 2]), "ShapeMismatch"),
        (lambda: layer.forward(np.zeros((4, 3), np.complex64), [2, 2]), "UnsupportedDType"),
        (lambda: grouplin.GroupedLinear(2, 3, 4).backward(np.zeros((4, 4), np.float32)),
         "BackwardBeforeForward"),
        (lambda: layer.expert_weight(2), "OutOfBounds"),
        (lambda: grouplin.GroupedLinear(0, 3, 4), "InvalidArgument"),
        (lambda: grouplin.GroupedLinear(2, 3, 4, weight_layout="stacked"), "InvalidArgument"),
        (lambda: grouplin.GroupedLinear(2, 3, 4, params_dtype="F16"), "UnsupportedDType"),
    ]
    for call, code in cases:
        with pytest.raises(grouplin.Error) as e:
            call()
        assert e.value.code == code, (code, str(e.value))
    with pytest.raises(TypeError):
        layer.forward("x", [2, 2])
    with pytest.raises((TypeError, ValueError)):
        layer.forward(x, ["a", 2])
    with pytest.raises((TypeError, ValueError)):
        layer.forward(x, "ab")
    with pytest.raises(TypeError):
        layer._core.forward(x, None, [2, 2], 7)


def test_one_layer_on_several_threads(rng):
    layer = grouplin.GroupedLinear(4, 64, 64, seed=5)
    xs = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(8)]
    want = [layer.forward(x, [8, 8, 8, 8]).copy() for x in xs]
    got = {}

    def work(k):
        for _ in range(20):
            got[k] = layer.forward(xs[k], [8, 8, 8, 8])
            layer.backward(np.ones((32, 64), np.float32))

    assert run_on_threads(work, 8) == []
    for k in range(8):
        assert got[k].tobytes() == want[k].tobytes()


def test_weight_packing_needs_mark_weights_written_after_writes_through_views(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    packed, plain = (grouplin.GroupedLinear(2, 64, 32, params_dtype="BF16", seed=1)
                     for _ in range(2))
    packed.set_weight_packing()
    x = rng.standard_normal((40, 64)).astype(ml_dtypes.bfloat16)
    splits = [8, 32]
    assert np.array_equal(packed.forward(x, splits), plain.forward(x, splits))
    if packed.packed_weight_bytes == 0:
        pytest.skip("this CPU's kernels widen BF16 (no AVX512-BF16 or AMX): nothing is packed")
    for m in (packed, plain):
        m.expert_weight(1)[...] = 0
    assert not np.array_equal(packed.forward(x, splits), plain.forward(x, splits))  # not seen
    packed.mark_weights_written()
    assert np.array_equal(packed.forward(x, splits), plain.forward(x, splits))
    plain.load_state_dict(grouplin.GroupedLinear(2, 64, 32, params_dtype="BF16",
                                                 seed=2).state_dict())
    packed.load_state_dict(plain.state_dict())  # a load is seen without being told
    assert np.array_equal(packed.forward(x, splits), plain.forward(x, splits))


def test_torch_tensors_in_give_torch_tensors_out(rng):
    import torch
    layer = grouplin.GroupedLinear(2, 4, 3, seed=1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = layer.forward(torch.from_numpy(x), torch.tensor([1, 2]))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), layer.forward(x, [1, 2]))
    dx = layer.backward(torch.ones(3, 3))
    assert isinstance(dx, torch.Tensor) and dx.shape == (3, 4)
