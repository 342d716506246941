"""The input pipeline's speed beside PyTorch's DataLoader, in one run:
pipeline-only throughput (samples/s) on Fashion-MNIST with normalize +
random horizontal flip + shuffle + batch 128, for kiln (made in the
consumer's thread, 1 and 2 producer threads, auto) and for a DataLoader
doing the same work (num_workers 0 and 2); then training the example MLP
with prefetch "auto" against the same steps fed from batches already in
memory.

  /usr/bin/python3 bench/pipeline.py [--build build] [--epochs 2]

The figures are for reading, never for gating CI."""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionMNIST(Dataset):
    """The same work per example as kiln's pipeline: x / 255, then a coin
    flip for a left-right mirror; channels last like kiln's (28, 28, 1)."""

    def __init__(self, images, labels):
        self.x = torch.from_numpy(images.copy())
        self.y = torch.from_numpy(labels.astype(np.int64))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].float().div_(255.0)
        if torch.rand(()) < 0.5:
            x = torch.flip(x, dims=(1,))
        return x.unsqueeze(-1), self.y[i]


def torch_throughput(ds, workers, epochs):
    loader = DataLoader(ds, batch_size=128, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)
    samples = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            samples += len(y)
    return samples / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(1)
    bench = os.path.join(args.build, "bench", "kiln-bench-pipeline")
    out = subprocess.run([bench, args.data, str(args.epochs)], check=True, text=True,
                         capture_output=True).stdout
    kiln = json.loads(out)
    ds = FashionMNIST(read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz")),
                      read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz")))
    torch_sps = {w: torch_throughput(ds, w, args.epochs) for w in (0, 2)}
    best_torch = max(torch_sps.values())

    print(f"pipeline only: Fashion-MNIST, normalize + flip + shuffle + batch 128, "
          f"{args.epochs} epochs, {os.cpu_count()} CPUs")
    print(f"{'':34} {'samples/s':>12} {'/ best DataLoader':>18}")
    for name, row in kiln["throughput"].items():
        label = f"kiln {name} (threads {row['threads']}, prefetch {row['prefetch']})"
        print(f"{label:34} {row['samples_per_s']:12.0f} {row['samples_per_s'] / best_torch:17.1f}x")
    for w, sps in torch_sps.items():
        print(f"{'torch DataLoader num_workers=' + str(w):34} {sps:12.0f} {sps / best_torch:17.1f}x")
    t = kiln["train"]
    print()
    print(f"training the example MLP, {t['epochs']} epochs, one compute thread:")
    print(f"  batches already in memory   {t['in_memory_s']:.3f} s")
    print(f"  pipeline, prefetch auto     {t['prefetch_auto_s']:.3f} s  "
          f"(threads {t['auto_threads']}, prefetch {t['auto_prefetch']}, "
          f"consumer waited {t['consumer_wait_s']:.3f} s)")
    print(f"  auto / in memory            {t['prefetch_auto_s'] / t['in_memory_s']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
