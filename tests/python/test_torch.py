"""grouplin.torch: checkpoints as torch tensors (DLPack, copy-on-write) and the nn.Module."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import grouplin
import grouplin.torch as gtorch
from conftest import ROOT, inside, mapped_ranges

LAYOUTS = ["per-expert", "contiguous", "single"]


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_load_views_a_copy_on_write_mapping(tmp_path):
    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(4).bfloat16()}
    path = str(tmp_path / "m.pt")
    torch.save(sd, path)
    before = digest(path)
    got = gtorch.load(path)
    ranges = mapped_ranges(path)
    for name, t in got.items():
        assert isinstance(t, torch.Tensor) and t.dtype == sd[name].dtype
        assert torch.equal(t, sd[name])
        assert inside(t.data_ptr(), t.numel() * t.element_size(), ranges), name  # no copy
    got["w"][0, 0] = 100.0  # never crashes, never reaches the file
    got["w"].add_(1)
    assert got["w"][0, 0].item() == 101.0
    assert digest(path) == before
    assert torch.equal(gtorch.load(path)["w"], sd["w"])


def test_load_reads_what_weights_only_refuses(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "io", "te_fp8_peer.py"),
                          str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path = str(tmp_path / "te_float8.pt")
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    got = gtorch.load(path)
    assert got.dtypes["w"] == "F8_E4M3"
    codes = got["w"].view(torch.uint8) if got["w"].dtype != torch.uint8 else got["w"]
    assert codes.flatten().tolist() == [0x10 + k for k in range(12)]
    assert got["w_scale_inv"].flatten().tolist() == [0.5]


def test_tensors_cross_by_dlpack_without_a_copy():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert grouplin._core.data_address(t) == t.data_ptr()
    b = torch.ones(4, dtype=torch.bfloat16)
    assert grouplin._core.data_address(b) == b.data_ptr()


def loop_reference(x, splits, weights, biases):
    outs, row = [], 0
    for w, b, m in zip(weights, biases, splits):
        outs.append(F.linear(x[row:row + m], w, b))
        row += m
    return torch.cat(outs)


def expert_tensors(layer, n):
    if layer.weight_layout == "single":
        return [layer.weight[i] for i in range(n)], [layer.bias[i] for i in range(n)]
    return ([getattr(layer, f"weight{i}") for i in range(n)],
            [getattr(layer, f"bias{i}") for i in range(n)])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_autograd_matches_a_per_expert_linear_loop(layout):
    torch.manual_seed(0)
    n, splits = 4, [3, 0, 6, 2]
    layer = gtorch.GroupedLinear(n, 16, 12, weight_layout=layout, seed=4)
    x = torch.randn(11, 16, requires_grad=True)
    y = layer(x, splits)
    (y * torch.arange(12.0)).sum().backward()
    weights, biases = expert_tensors(layer, n)
    ref_w = [w.detach().clone().requires_grad_() for w in weights]
    ref_b = [b.detach().clone().requires_grad_() for b in biases]
    ref_x = x.detach().clone().requires_grad_()
    ref = loop_reference(ref_x, splits, ref_w, ref_b)
    (ref * torch.arange(12.0)).sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    params = dict(layer.named_parameters())
    if layout == "single":
        torch.testing.assert_close(params["weight"].grad, torch.stack([w.grad for w in ref_w]))
        torch.testing.assert_close(params["bias"].grad, torch.stack([b.grad for b in ref_b]))
    else:
        for i in range(n):
            torch.testing.assert_close(params[f"weight{i}"].grad, ref_w[i].grad)
            torch.testing.assert_close(params[f"bias{i}"].grad, ref_b[i].grad)


def test_two_forwards_before_backward_each_get_their_gradient():
    torch.manual_seed(1)
    layer = gtorch.GroupedLinear(2, 8, 8, bias=False)
    x1, x2 = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    y = layer(layer(x1, [2, 2]) + x2, [1, 3])  # the layer twice in one graph
    y.sum().backward()
    w = [layer.weight0.detach().clone().requires_grad_(),
         layer.weight1.detach().clone().requires_grad_()]
    r1, r2 = x1.detach().clone().requires_grad_(), x2.detach().clone().requires_grad_()
    zero = [None, None]
    ref = loop_reference(loop_reference(r1, [2, 2], w, zero) + r2, [1, 3], w, zero)
    ref.sum().backward()
    torch.testing.assert_close(x1.grad, r1.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight0.grad, w[0].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight1.grad, w[1].grad, rtol=1e-5, atol=1e-5)


def test_stateless_grouped_linear_matches_the_loop_and_the_layer():
    torch.manual_seed(2)
    n, splits, other = 3, [4, 0, 3], [1, 5, 1]
    w = torch.randn(n, 6, 5, requires_grad=True)
    b = torch.randn(n, 6, requires_grad=True)
    x1, x2 = torch.randn(7, 5, requires_grad=True), torch.randn(7, 5, requires_grad=True)
    y1 = gtorch.grouped_linear(x1, splits, w, b)
    y2 = gtorch.grouped_linear(x2, torch.tensor(other), w, b)  # in flight before y1's backward
    (y1.square().sum() + y2.sum()).backward()
    rw, rb = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    r1, r2 = x1.detach().clone().requires_grad_(), x2.detach().clone().requires_grad_()
    ref1 = loop_reference(r1, splits, list(rw), list(rb))
    ref2 = loop_reference(r2, other, list(rw), list(rb))
    (ref1.square().sum() + ref2.sum()).backward()
    torch.testing.assert_close(y1, ref1, rtol=1e-5, atol=1e-5)
    for got, want in ((x1.grad, r1.grad), (x2.grad, r2.grad), (w.grad, rw.grad), (b.grad, rb.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The layer's own weights through the stateless call: the layer's bits.
    layer = gtorch.GroupedLinear(n, 5, 6, weight_layout="single", seed=3)
    with torch.no_grad():
        assert torch.equal(gtorch.grouped_linear(x1, splits, layer.weight, layer.bias),
                           layer(x1, splits))
    with pytest.raises(grouplin.Error) as e:
        gtorch.grouped_linear(x1, [4, 0], w, b)
    assert e.value.code == "SplitCountMismatch"


def test_kernels_run_on_torchs_openmp_threads_with_the_same_bits():
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch's ops do not run on OpenMP here")
    library = gtorch.use_torch_threads(True)
    assert os.path.basename(library).startswith(("libgomp", "libiomp5", "libomp"))
    assert grouplin._core.openmp_threads() == library
    torch.manual_seed(4)
    splits = [64, 0, 100, 36]
    x = torch.randn(200, 256, requires_grad=True)
    w = torch.randn(4, 192, 256, requires_grad=True)
    runs = []
    for on in (True, False):
        assert (gtorch.use_torch_threads(on) is None) == (not on)
        x.grad = w.grad = None
        y = gtorch.grouped_linear(x, splits, w)
        y.square().sum().backward()
        runs.append((y.detach(), x.grad, w.grad))
    assert grouplin._core.openmp_threads() == ""
    for got, want in zip(*runs):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # Imported, grouplin.torch turns it on unless GROUPLIN_OWN_THREADS=1 says not to.
    for own, want in (("0", library), ("1", "")):
        out = subprocess.run(
            [sys.executable, "-c", "import grouplin.torch, grouplin._core as c; "
             "print(c.openmp_threads())"], capture_output=True, text=True, check=True,
            env=dict(os.environ, GROUPLIN_OWN_THREADS=own)).stdout.strip()
        assert out == want
    gtorch.use_torch_threads(True)


def test_a_weight_changed_before_backward_is_refused_as_torch_refuses_it():
    layer = gtorch.GroupedLinear(2, 4, 3, seed=5)
    x = torch.randn(5, 4, requires_grad=True)
    y = layer(x, [2, 3])
    with torch.no_grad():
        layer.weight0.add_(1.0)  # an optimizer step between forward and backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_trains_inside_a_torch_model_as_a_linear_loop_does():
    torch.manual_seed(2)
    experts = gtorch.GroupedLinear(4, 8, 8, seed=1)
    dense = torch.nn.Linear(8, 8)
    ref_dense = torch.nn.Linear(8, 8)
    ref_dense.load_state_dict(dense.state_dict())
    ref_w = [torch.nn.Parameter(getattr(experts, f"weight{i}").detach().clone()) for i in range(4)]
    ref_b = [torch.nn.Parameter(getattr(experts, f"bias{i}").detach().clone()) for i in range(4)]
    opt = torch.optim.SGD(list(dense.parameters()) + list(experts.parameters()), lr=0.1)
    ref_opt = torch.optim.SGD(list(ref_dense.parameters()) + ref_w + ref_b, lr=0.1)
    x, target, splits = torch.randn(16, 8), torch.randn(16, 8), [4, 4, 4, 4]
    losses = []
    for _ in range(20):
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = F.mse_loss(experts(torch.relu(dense(x)), splits), target)
        ref_loss = F.mse_loss(loop_reference(torch.relu(ref_dense(x)), splits, ref_w, ref_b),
                              target)
        loss.backward()
        ref_loss.backward()
        opt.step()
        ref_opt.step()
        losses.append(loss.item())
        assert abs(loss.item() - ref_loss.item()) < 1e-5
    assert losses[-1] < losses[0]
    for i in range(4):
        torch.testing.assert_close(getattr(experts, f"weight{i}"), ref_w[i], rtol=1e-5, atol=1e-5)
    # The optimizer's in-place updates are the C++ layer's weights.
    np.testing.assert_array_equal(experts._core.expert_weight(2, "numpy"),
                                  experts.weight2.detach().numpy())


def test_bf16_tensors_in_and_out():
    layer = gtorch.GroupedLinear(2, 8, 4, params_dtype=torch.bfloat16)
    x = torch.randn(3, 8).bfloat16()
    with torch.no_grad():
        y = layer(x, [2, 1])
    assert y.dtype == torch.bfloat16 and layer.weight0.dtype == torch.bfloat16
    ref = loop_reference(x.float(), [2, 1], [layer.weight0.float(), layer.weight1.float()],
                         [layer.bias0.float(), layer.bias1.float()])
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weight_packing_sees_what_pytorch_writes(layout):
    """With weight packing on, every write PyTorch makes to the weights (an optimizer step, torch's
    own load_state_dict, an in-place op) is seen by the next forward: the packed layer gives the
    bits of an unpacked twin throughout."""
    torch.manual_seed(3)
    n, splits = 3, [1, 20, 33]
    packed, plain = (gtorch.GroupedLinear(n, 96, 40, params_dtype=torch.bfloat16,
                                          weight_layout=layout, seed=5) for _ in range(2))
    packed.set_weight_packing(True)
    assert packed.weight_packing and not plain.weight_packing
    x = torch.randn(sum(splits), 96).bfloat16()

    def same(after):
        with torch.no_grad():
            assert torch.equal(packed(x, splits), plain(x, splits)), after

    same("the first forward")
    if packed.packed_weight_bytes == 0:
        pytest.skip("this CPU's kernels widen BF16 (no AVX512-BF16 or AMX): nothing is packed")
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (packed, plain)]
    for m, opt in zip((packed, plain), opts):
        opt.zero_grad()
        m(x, splits).float().square().sum().backward()
        opt.step()
    same("an optimizer step")
    state = gtorch.GroupedLinear(n, 96, 40, params_dtype=torch.bfloat16, weight_layout=layout,
                                 seed=9).state_dict()
    packed.load_state_dict(state)
    plain.load_state_dict(state)
    same("torch's load_state_dict")
    with torch.no_grad():
        for m in (packed, plain):
            next(p for name, p in m.named_parameters() if name.startswith("weight")).mul_(-2)
    same("an in-place op")
    packed.set_weight_packing(False)
    assert packed.packed_weight_bytes == 0


def test_torch_load_state_dict_takes_the_layers_own_state_dict():
    a = gtorch.GroupedLinear(2, 6, 5, seed=1)
    b = gtorch.GroupedLinear(2, 6, 5, seed=2)
    state = a.state_dict()
    assert "_extra_state" in state
    b.load_state_dict(state)  # strict: nothing missing, nothing unexpected
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value), name


def test_state_dict_round_trip_through_torch_save_into_another_layout(tmp_path):
    a = gtorch.GroupedLinear(3, 6, 5, weight_layout="per-expert", seed=7)
    torch.save(a.state_dict(), str(tmp_path / "a.pt"))
    assert set(torch.load(str(tmp_path / "a.pt"))) >= {"weight0", "bias2"}
    b = gtorch.GroupedLinear(3, 6, 5, weight_layout="single", seed=8)
    report = b.load_grouplin_state_dict(gtorch.load(tmp_path / "a.pt"))
    assert report["missing"] == [] and report["layout_conversions"]
    x = torch.randn(6, 6)
    with torch.no_grad():
        assert torch.equal(a(x, [2, 2, 2]), b(x, [2, 2, 2]))
    torch.testing.assert_close(b.weight[1], a.weight1)


def test_cuda_or_bad_tensors_raise_not_crash():
    layer = gtorch.GroupedLinear(2, 4, 4)
    with pytest.raises(grouplin.Error) as e:
        layer(torch.zeros(4, 4, dtype=torch.float64), [2, 2])
    assert e.value.code == "DTypeMismatch"
    with pytest.raises(grouplin.Error):
        layer(torch.zeros(4, 4), [3, 3])
    y = layer(torch.zeros(8, 8)[:, ::2].t().contiguous().t()[:4], [2, 2])  # odd strides: copied
    assert y.shape == (4, 4)


def test_fp8_weights_are_buffers_and_inputs_still_get_gradients():
    import ml_dtypes
    layer = gtorch.GroupedLinear(2, 128, 64, params_dtype="F8_E4M3", activation_dtype="F32")
    assert [n for n, _ in layer.named_parameters()] == ["bias0", "bias1"]
    assert {"weight0", "weight1", "weight0_scale_inv"} <= {n for n, _ in layer.named_buffers()}
    x = torch.randn(3, 128, requires_grad=True)
    layer(x, [1, 2]).sum().backward()
    # dx of a sum: each row's expert's dequantized weights (code x scale) summed over outputs.
    values = []
    for i in range(2):
        codes = getattr(layer, f"weight{i}").view(torch.uint8).numpy()
        scale = getattr(layer, f"weight{i}_scale_inv").numpy()
        values.append(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale[0, 0])
    want = np.stack([values[0].sum(0), values[1].sum(0), values[1].sum(0)])
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.bias0.grad, torch.ones(64))
    torch.testing.assert_close(layer.bias1.grad, torch.full((64,), 2.0))
