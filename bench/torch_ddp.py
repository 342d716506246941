"""PyTorch DistributedDataParallel on the CPU (gloo), the reference for
bench/dist_scaling.sh: the Fashion-MNIST CNN of bench/torch_engine.py, Adam
1e-3, a per-process batch, one thread per process, each process on its own
slice of every global batch (as kiln's replicas are).

  torch_ddp.py PROCESSES BATCH STEPS DATA_DIR

Prints one JSON line: examples per second over all processes, timed after
5 warm-up steps, data already in memory."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_best import use_caching_malloc  # noqa: E402

use_caching_malloc()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from torch_engine import idx, model  # noqa: E402

WARMUP = 5


def worker(rank, world, batch, steps, data, out):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(42)
    x = torch.tensor(idx(f"{data}/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0,
                     dtype=torch.float32)
    y = torch.tensor(idx(f"{data}/train-labels-idx1-ubyte.gz", 8).astype("int64"))
    net = torch.nn.parallel.DistributedDataParallel(model("cnn"))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = batch * world
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(7))
    for s in range(-WARMUP, steps):
        if s == 0:
            dist.barrier()
            t0 = time.perf_counter()
        start = ((s + WARMUP) * global_batch + rank * batch) % (len(x) - global_batch)
        rows = perm[start:start + batch]
        opt.zero_grad()
        loss_fn(net(x[rows]), y[rows]).backward()
        opt.step()
    dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        out.put({"framework": "pytorch-ddp-gloo", "processes": world, "batch": batch,
                 "steps": steps, "seconds": secs, "examples_per_s": steps * global_batch / secs,
                 "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    world, batch, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    data = sys.argv[4] if len(sys.argv) > 4 else "/usr/share/datasets/fashion-mnist"
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(worker, args=(world, batch, steps, data, out), nprocs=world, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
