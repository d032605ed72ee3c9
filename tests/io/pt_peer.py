"""PyTorch peer for the .pt interoperability tests (tests/io/pt_interop_test.cpp).

  pt_peer.py save DIR            write torch.save files DIR/<case>.pt and manifests DIR/<case>.json
  pt_peer.py check FILE JSON [FILE JSON ...]
                                 torch.load(FILE, weights_only=True) must match the manifest
  pt_peer.py check_v3 FILE JSON  for files torch 1.13 cannot load (float8 / uint16 via
                                 _rebuild_tensor_v3): unpickle data.pkl with CPython's own
                                 unpickler and stand-ins for the torch names, then compare bytes

A manifest: {"tensors": [{"name", "dtype" (GroupLin spelling), "shape", "hex"}...],
             "shares": [[name, name, ...], ...]   tensors that must share one storage
             "module": "mlp"                       optional: load into that torch module too
             "metadata": true                      optional: require a `_metadata` with a root entry}
Exit status 0 when everything matches; otherwise a message on stderr and status 1.
"""
import collections
import io
import json
import os
import pickle
import sys
import zipfile

import torch

TORCH_TO_GROUPLIN = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def tensor_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def describe(sd):
    return [{"name": k, "dtype": TORCH_TO_GROUPLIN[v.dtype], "shape": list(v.shape),
             "hex": tensor_bytes(v).hex()} for k, v in sd.items()]


def make_module(kind):
    assert kind == "mlp", kind
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))


def cases():
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    out = {}
    out["dtypes"] = (collections.OrderedDict([
        ("f32", rnd(2, 3)), ("bf16", rnd(3, 2, dtype=torch.bfloat16)),
        ("f16", rnd(5, dtype=torch.float16)), ("f64", rnd(2, 2, dtype=torch.float64)),
        ("i64", torch.arange(-3, 4, dtype=torch.int64)), ("i32", torch.arange(6, dtype=torch.int32).reshape(2, 3)),
        ("i16", torch.tensor([-7, 300], dtype=torch.int16)), ("i8", torch.tensor([-128, 5, 127], dtype=torch.int8)),
        ("u8", torch.tensor([0, 200, 255], dtype=torch.uint8)), ("bool", torch.tensor([True, False, True])),
    ]), [])
    experts = collections.OrderedDict()
    for i in range(4):
        experts[f"decoder.layers.0.mlp.fc1.weight{i}"] = rnd(3, 2)
    for i in range(4):
        experts[f"decoder.layers.0.mlp.fc1.bias{i}"] = rnd(3)
    experts["decoder.layers.1.mlp.fc1.weight"] = rnd(4, 3, 2, dtype=torch.bfloat16)
    experts["decoder.layers.1.mlp.fc1.bias"] = rnd(4, 3, dtype=torch.bfloat16)
    out["experts"] = (experts, [])
    base = torch.arange(24, dtype=torch.float32)
    same = rnd(2, 2)
    out["shared"] = (collections.OrderedDict([
        ("full", base), ("first", base[:12].view(3, 4)), ("second", base[12:]), ("row", base.view(6, 4)[2]),
        ("x", same), ("y", same),
    ]), [["full", "first", "second", "row"], ["x", "y"]])
    out["edge"] = (collections.OrderedDict([
        ("empty", torch.zeros(0, 3)), ("scalar", torch.tensor(2.5)), ("empty_i64", torch.zeros(0, dtype=torch.int64)),
        ("one", torch.ones(1)),
    ]), [])
    w = rnd(3, 4)
    m = rnd(3, 5)
    out["noncontig"] = (collections.OrderedDict([
        ("wt", w.t()), ("expanded", rnd(1, 4).expand(3, 4)), ("sliced", m[:, 1:3]),
    ]), [])
    torch.manual_seed(5)
    out["module"] = (make_module("mlp").state_dict(), [])
    out["plain_dict"] = ({"a": rnd(2), "b": rnd(1, 2)}, [])
    out["parameter"] = (collections.OrderedDict([
        ("p", torch.nn.Parameter(rnd(2, 2))), ("q", torch.zeros(2)),
    ]), [])
    return out


def save(folder):
    os.makedirs(folder, exist_ok=True)
    for name, (sd, shares) in cases().items():
        torch.save(sd, os.path.join(folder, name + ".pt"))
        manifest = {"tensors": describe(sd), "shares": shares}
        with open(os.path.join(folder, name + ".json"), "w") as f:
            json.dump(manifest, f)
    # A file saved through a file object: its folder is "archive", not the file's stem.
    sd, shares = cases()["dtypes"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    with open(os.path.join(folder, "bytesio.pt"), "wb") as f:
        f.write(buf.getvalue())
    with open(os.path.join(folder, "bytesio.json"), "w") as f:
        json.dump({"tensors": describe(sd), "shares": shares}, f)


def compare(got, manifest):
    """got: list of (name, dtype, shape, bytes) in file order."""
    want = manifest["tensors"]
    names = [g[0] for g in got]
    if names != [w["name"] for w in want]:
        raise AssertionError(f"names {names} != {[w['name'] for w in want]}")
    for (name, dtype, shape, data), w in zip(got, want):
        if dtype != w["dtype"] or list(shape) != w["shape"]:
            raise AssertionError(f"{name}: {dtype} {list(shape)} != {w['dtype']} {w['shape']}")
        if data.hex() != w["hex"]:
            raise AssertionError(f"{name}: bytes {data.hex()} != {w['hex']}")


def check(path, manifest_path):
    with open(manifest_path) as f:
        manifest = json.load(f)
    sd = torch.load(path, weights_only=True)
    if not isinstance(sd, collections.OrderedDict if manifest.get("metadata") else dict):
        raise AssertionError(f"top level is {type(sd)}")
    compare([(k, TORCH_TO_GROUPLIN[v.dtype], v.shape, tensor_bytes(v)) for k, v in sd.items()], manifest)
    for group in manifest.get("shares", []):
        ptrs = {sd[n].storage().data_ptr() for n in group}
        if len(ptrs) != 1:
            raise AssertionError(f"{group} do not share one storage")
    meta = getattr(sd, "_metadata", None)
    if manifest.get("metadata") and (meta is None or "" not in meta):
        raise AssertionError("no _metadata with a root entry")
    if "module" in manifest:
        module = make_module(manifest["module"])
        module.load_state_dict(sd, strict=True)
        for k, v in module.state_dict().items():
            if not torch.equal(v, sd[k]):
                raise AssertionError(f"module parameter {k} differs after load_state_dict")


class _Stub:
    def __init__(self, name):
        self.name = name


def check_v3(path, manifest_path):
    with open(manifest_path) as f:
        manifest = json.load(f)
    z = zipfile.ZipFile(path)
    names = z.namelist()
    folder = names[0].split("/")[0]
    if f"{folder}/byteorder" in names and z.read(f"{folder}/byteorder") != b"little":
        raise AssertionError("byteorder is not little")
    itemsize = {"float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1), "uint16": ("U16", 2),
                "uint32": ("U32", 4), "uint64": ("U64", 8)}
    typed = {"FloatStorage": ("F32", 4), "DoubleStorage": ("F64", 8), "HalfStorage": ("F16", 2),
             "BFloat16Storage": ("BF16", 2), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
             "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
             "BoolStorage": ("BOOL", 1)}

    def rebuild(storage, offset, size, stride, requires_grad, hooks, dtype=None, metadata=None):
        kind, data = storage
        if dtype is not None:
            if kind != "UntypedStorage":
                raise AssertionError("_rebuild_tensor_v3 with a typed storage")
            gl, isz = itemsize[dtype.name]
        else:
            gl, isz = typed[kind]
        numel = 1
        for s in size:
            numel *= s
        expect = 1
        for i in reversed(range(len(size))):
            if size[i] != 1 and stride[i] != expect:
                raise AssertionError(f"non-contiguous stride {stride}")
            expect *= size[i]
        return (gl, list(size), data[offset * isz:(offset + numel) * isz])

    def rebuild_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
        return rebuild(storage, offset, size, stride, requires_grad, hooks, None, metadata)

    allowed = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): rebuild_v2,
        ("torch._utils", "_rebuild_tensor_v3"): rebuild,
    }

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed:
                return allowed[(module, name)]
            if module == "torch" and name != "UntypedStorage":
                return _Stub(name)
            # As PyTorch 2.x pickles the class, and the one spelling its weights_only unpickler
            # accepts (checked with PyTorch 2.15 itself in tests/peers/test_torch_pt.py).
            if (module, name) == ("torch.storage", "UntypedStorage"):
                return _Stub(name)
            raise AssertionError(f"unexpected global {module}.{name}")

        def persistent_load(self, pid):
            tag, storage_type, key, location, numel = pid
            data = z.read(f"{folder}/data/{key}")
            isz = 1 if storage_type.name == "UntypedStorage" else typed[storage_type.name][1]
            if numel * isz != len(data):
                raise AssertionError(f"storage {key}: numel {numel} vs {len(data)} bytes")
            return (storage_type.name, data)

    sd = Unpickler(io.BytesIO(z.read(f"{folder}/data.pkl"))).load()
    compare([(k, v[0], v[1], v[2]) for k, v in sd.items()], manifest)


def main():
    cmd = sys.argv[1]
    try:
        if cmd == "save":
            save(sys.argv[2])
        elif cmd == "check":
            args = sys.argv[2:]
            if not args or len(args) % 2 != 0:
                raise AssertionError("check takes FILE JSON pairs")
            for i in range(0, len(args), 2):
                try:
                    check(args[i], args[i + 1])
                except AssertionError as e:
                    raise AssertionError(f"{args[i]}: {e}")
        elif cmd == "check_v3":
            check_v3(sys.argv[2], sys.argv[3])
        else:
            raise AssertionError(f"unknown command {cmd}")
    except AssertionError as e:
        print(f"pt_peer {cmd}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
