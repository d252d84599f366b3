"""Cross-check of weft's safetensors export with PyTorch (run by test_dcp.c
with /usr/bin/python3, which has torch; no safetensors package needed).

  check_safetensors.py DIR

DIR holds what the dcp_worker case st_export wrote: model.f32.safetensors,
model.bf16.safetensors, and ref.bin + ref.json (each parameter's full f32
tensor, in parameter order). Checks, reading the files with json/struct and
torch.frombuffer only:
  - the header layout (8-byte little-endian length, JSON, data offsets
    back to back, each tensor aligned to its element size, __metadata__
    {"format": "pt"});
  - f32 tensors equal the reference bitwise;
  - bf16 tensors equal torch's own rounding of the reference bitwise.
Then writes py.safetensors (PyTorch-made values, some stored as bf16) and
py_ref.bin (the f32 values weft must read back, in parameter order) for
the import half of the test. Exits non-zero on any mismatch."""
import json
import os
import struct
import sys

import torch

DT = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
      "F64": (torch.float64, 8)}


def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    out, spans = {}, []
    for name, info in header.items():
        dtype, size = DT[info["dtype"]]
        begin, end = info["data_offsets"]
        numel = 1
        for s in info["shape"]:
            numel *= s
        assert end - begin == numel * size, f"{name}: {end - begin} bytes for {numel} elements"
        assert begin % size == 0, f"{name}: offset {begin} not aligned to {size}"
        spans.append((begin, end))
        buf = bytearray(data[begin:end])
        t = torch.frombuffer(buf, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, f"gap or overlap at byte {b} (expected {pos})"
        pos = e
    assert pos == len(data), f"data buffer has {len(data)} bytes, tensors {pos}"
    return out, meta


def main():
    d = sys.argv[1]
    index = json.load(open(os.path.join(d, "ref.json")))
    raw = open(os.path.join(d, "ref.bin"), "rb").read()
    ref, at = {}, 0
    for e in index:
        numel = 1
        for s in e["shape"]:
            numel *= int(s)
        t = torch.frombuffer(bytearray(raw[at:at + 4 * numel]), dtype=torch.float32)
        ref[e["name"]] = t.reshape([int(s) for s in e["shape"]])
        at += 4 * numel
    assert at == len(raw)
    bad = 0
    f32, meta = read_st(os.path.join(d, "model.f32.safetensors"))
    assert meta == {"format": "pt"}, meta
    bf16, _ = read_st(os.path.join(d, "model.bf16.safetensors"))
    assert set(f32) == set(ref) == set(bf16), (sorted(f32), sorted(ref))
    for name, r in ref.items():
        if f32[name].dtype != torch.float32 or not torch.equal(f32[name].view(torch.int32), r.view(torch.int32)):
            print(f"f32 {name}: differs from the reference")
            bad += 1
        want = r.to(torch.bfloat16)
        if bf16[name].dtype != torch.bfloat16 or not torch.equal(bf16[name].view(torch.int16), want.view(torch.int16)):
            print(f"bf16 {name}: differs from torch's rounding")
            bad += 1
    # a file written here, for weft to import
    g = torch.Generator().manual_seed(1234)
    header, blobs, off, expect = {}, [], 0, []
    for i, e in enumerate(index):
        shape = [int(s) for s in e["shape"]]
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        if i % 3 == 1:
            t = t.to(torch.bfloat16)
            dt = "BF16"
        else:
            dt = "F32"
        flat = t.contiguous().view(-1)
        b = (flat.view(torch.int16) if dt == "BF16" else flat).numpy().tobytes()
        header[e["name"]] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
        expect.append(t.to(torch.float32).contiguous().view(-1).numpy().tobytes())
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "py.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    with open(os.path.join(d, "py_ref.bin"), "wb") as f:
        for b in expect:
            f.write(b)
    print(f"checked {len(ref)} tensors (f32 and bf16): {bad} mismatches; wrote py.safetensors")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
