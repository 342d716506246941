"""The Fashion-MNIST MLP recipe of examples/fmnist-mlp.json in PyTorch:
784-256-10 ReLU, Adam (lr 0.002, eps 1e-7), batch 128, shuffled, 2 epochs,
inputs scaled to [0, 1], test accuracy after each epoch. The reference that
bench/mlp_fmnist.py runs side by side with kiln-train."""
import gzip
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_best import use_caching_malloc  # noqa: E402

use_caching_malloc()

import torch  # noqa: E402

DATA = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
EPOCHS = int(sys.argv[3]) if len(sys.argv) > 3 else 2


def idx(name, offset):
    with gzip.open(f"{DATA}/{name}") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(42)
    xtr = torch.tensor(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0,
                       dtype=torch.float32)
    ytr = torch.tensor(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xte = torch.tensor(idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0,
                       dtype=torch.float32)
    yte = torch.tensor(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.002, eps=1e-7)
    for epoch in range(1, EPOCHS + 1):
        perm = torch.randperm(len(xtr))
        for start in range(0, len(xtr), 128):
            batch = perm[start:start + 128]
            loss = torch.nn.functional.cross_entropy(model(xtr[batch]), ytr[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(f"epoch {epoch} val_accuracy {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
