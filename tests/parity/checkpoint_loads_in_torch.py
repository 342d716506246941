"""A kiln checkpoint is plain safetensors: read it with a 20-line reader, load
it into the equivalent torch model, and get the test accuracy kiln-train
reported. Skips (exit 77) with a loud message where python3-torch is
missing.

  checkpoint_loads_in_torch.py KILN_TRAIN SPEC DATASETS_DIR"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIPPED: python3-torch is not installed ({e}); install it to run this test")
    sys.exit(77)


def read_safetensors(path):
    """{name: tensor} and the metadata of a safetensors file."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": np.float32}
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, meta


def idx(path, offset):
    import gzip
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    trainer, spec, datasets = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([trainer, "--json", "--threads", "1", "--data-dir", datasets,
                              "--checkpoint-dir", out, spec],
                             capture_output=True, text=True, check=True)
        lines = [json.loads(line) for line in run.stdout.splitlines()]
        val = [l["metrics"]["val_accuracy"] for l in lines
               if "metrics" in l and "val_accuracy" in l["metrics"]][-1]
        ckpt = [l["checkpoint"] for l in lines if "checkpoint" in l][-1]
        tensors, meta = read_safetensors(ckpt["path"])
    assert meta["format"] == "pt", meta
    # kiln stores dense kernels as (in, out), Keras style; torch's Linear
    # weight is (out, in).
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    with torch.no_grad():
        model[1].weight.copy_(tensors["dense_1.kernel"].T)
        model[1].bias.copy_(tensors["dense_1.bias"])
        model[3].weight.copy_(tensors["dense_2.kernel"].T)
        model[3].bias.copy_(tensors["dense_2.bias"])
        d = os.path.join(datasets, "fashion-mnist")
        x = torch.tensor(idx(f"{d}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0,
                         dtype=torch.float32)
        y = torch.tensor(idx(f"{d}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"kiln-train reported val_accuracy {val:.4f}; torch on the checkpoint {acc:.4f}")
    if abs(acc - val) > 0.001:
        sys.exit(f"FAILED: accuracies differ by {abs(acc - val):.4f} (> 0.001)")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
