"""Reads a nebula checkpoint with the reference `safetensors` package (numpy backend) and compares
every tensor bit for bit with the raw parameter arena dumped beside it; then writes the same
tensors back with safetensors.numpy.save_file for the C side to read. Exit 77 = skip."""
import hashlib
import json
import struct
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # not installed: let CTest report a skip
    print(f"skip: {e}")
    sys.exit(77)


def main(ckpt, raw, manifest, out):
    arena = np.fromfile(raw, dtype="<f4")
    tensors = load_file(ckpt)
    with safe_open(ckpt, framework="numpy") as f:
        meta = f.metadata()
    want = {}
    for line in open(manifest):
        name, off, *shape = line.split()
        want[name] = (int(off), tuple(int(s) for s in shape))
    if set(tensors) != set(want):
        print("tensor names differ:", sorted(set(tensors) ^ set(want)))
        return 1
    for name, (off, shape) in want.items():
        t = tensors[name]
        n = int(np.prod(shape)) if shape else 1
        ref = arena[off:off + n].reshape(shape)
        if t.dtype != np.float32 or t.shape != shape:
            print(f"{name}: dtype {t.dtype} shape {t.shape}, want float32 {shape}")
            return 1
        if not np.array_equal(t.view(np.uint32), ref.view(np.uint32)):
            print(f"{name}: values differ")
            return 1
    with open(ckpt, "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hl))
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if meta.get("sha256") != digest or header["__metadata__"]["sha256"] != digest:
        print(f"sha256 in metadata {meta.get('sha256')} != sha256 of data {digest}")
        return 1
    print(f"safetensors {__import__('safetensors').__version__}: {len(tensors)} tensors, "
          f"{arena.size} floats identical, sha256 ok")
    # write them back with the reference writer (its own tensor order and alignment)
    buf = save_file(tensors, out, metadata={k: v for k, v in meta.items() if k != "sha256"})
    with open(out, "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        f.read(hl)
        digest = hashlib.sha256(f.read()).hexdigest()
    meta2 = dict(meta)
    meta2["sha256"] = digest
    save_file(tensors, out, metadata=meta2)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
