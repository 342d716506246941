"""The PyTorch side of bench/engine.py, on the same models as kiln:

  torch_engine.py step mlp|cnn THREADS STEPS [bf16]
                                                 training-step speed, random data; bf16:
                                                 under torch.autocast("cpu", torch.bfloat16)
  torch_engine.py train mlp|cnn THREADS EPOCHS DATA_DIR
                                                 the Fashion-MNIST recipe (Adam 1e-3,
                                                 batch 128, inputs / 255), test accuracy

Prints one JSON line."""
import gzip
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_best import use_caching_malloc  # noqa: E402

use_caching_malloc()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

BATCH = 128


def model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def step(kind, threads, steps, bf16=False):
    torch.manual_seed(1)
    m = model(kind)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-7)
    x = torch.rand(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    loss_fn = nn.CrossEntropyLoss()
    for s in range(-5, steps):
        if s == 0:
            t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
    secs = time.perf_counter() - t0
    return {"framework": "pytorch-autocast-bf16" if bf16 else "pytorch", "model": kind,
            "threads": threads,
            "ms_per_step": secs / steps * 1e3, "samples_per_s": steps * BATCH / secs,
            "peak_rss_mib": peak_rss_mib()}


def train(kind, threads, epochs, data, seed=42):
    torch.manual_seed(seed)
    d = f"{data}/fashion-mnist"
    x = torch.tensor(idx(f"{d}/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0,
                     dtype=torch.float32)
    y = torch.tensor(idx(f"{d}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    tx = torch.tensor(idx(f"{d}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0,
                      dtype=torch.float32)
    ty = torch.tensor(idx(f"{d}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    m = model(kind)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0])
        for i in range(0, x.shape[0], BATCH):
            idxs = perm[i:i + BATCH]
            opt.zero_grad()
            loss_fn(m(x[idxs]), y[idxs]).backward()
            opt.step()
    train_s = time.perf_counter() - t0
    with torch.no_grad():
        acc = (m(tx).argmax(1) == ty).float().mean().item()
    return {"framework": "pytorch", "model": kind, "threads": threads, "epochs": epochs,
            "train_s": train_s, "samples_per_s": epochs * x.shape[0] / train_s,
            "val_accuracy": acc, "peak_rss_mib": peak_rss_mib()}


def main():
    mode, kind, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    if mode == "step":
        out = step(kind, threads, int(sys.argv[4]), len(sys.argv) > 5 and sys.argv[5] == "bf16")
    else:
        seed = int(sys.argv[6]) if len(sys.argv) > 6 else 42
        out = train(kind, threads, int(sys.argv[4]), sys.argv[5], seed)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
