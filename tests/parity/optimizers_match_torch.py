"""PyTorch parity: the reference MLP (784-512-256-10 relu) and a CNN with
every layer type (conv2d, batch norm and the relu after it, separable and depthwise conv, residual
add, max / avg / global average pool, dense) start from the same weights
(kiln writes them as safetensors, torch loads them), train 20 steps on the
same batches with each optimizer, and must agree on every loss and every
final weight (and batch norm moving statistics) as
torch.allclose(rtol=1e-4, atol=1e-5) requires. Skips (exit 77) with a loud
message where python3-torch is missing.

Learning rates are chosen so that 20 float32 steps are well conditioned: at
lr 0.05 plain SGD on the CNN, torch in float32 itself leaves torch in float64
by 1e-5 at step 3 and 3e-3 by step 13 (a ReLU or pooling decision flips on
rounding), and kiln there tracks the float64 run instead; such a setting
compares rounding luck, not implementations. RMSProp's epsilon is 1e-5 for
the same reason: with the relu after the CNN's batch norm, some gradients
are sums that cancel to within rounding of 0, and an epsilon of 1e-7 (or,
by luck of which ones, 1e-4) lets RMSProp's division blow their rounding
up to a learning-rate-sized step (3e-4 apart in 20 steps, the same with
kiln's batch norm backward fused or not). KILN_PARITY_VERBOSE=1 prints
every step's losses.

The GEMM is part of that luck. On the MLP's random inputs a first-layer
pre-activation lands within float32 rounding of zero now and then (one at
-7.3e-8 in double was seen), and a ReLU then goes one way or the other
depending on the order the 784 products are summed in. Torch here sums
them with OpenBLAS, so ctest runs the full comparison with KILN_GEMM=openblas
(like-for-like arithmetic), and the CNN again with kiln's own GEMM;
tests/engine/test_sgemm.c holds kiln's GEMM to a double reference.

  optimizers_match_torch.py KILN_PARITY [MODELS]   (MODELS: mlp,cnn by default)"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIPPED: python3-torch is not installed ({e}); install it to run this test")
    sys.exit(77)

STEPS = 20
RTOL, ATOL = 1e-4, 1e-5
OPTIMIZERS = ["sgd", "sgd_nesterov", "adam", "adamw", "rmsprop", "adagrad"]


def read_safetensors(path):
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        out[name] = torch.from_numpy(
            np.frombuffer(data[begin:end], dtype=np.float32).reshape(t["shape"]).copy())
    return out


def torch_optimizer(name, params):
    """The hyperparameters kiln-parity uses for the same name."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.02)
    if name == "sgd_nesterov":
        return torch.optim.SGD(params, lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7, weight_decay=0.01)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=3e-4, alpha=0.9, eps=1e-5, momentum=0.5)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=0.01, eps=1e-7, initial_accumulator_value=0.1)
    raise ValueError(name)


# Parameters stay in kiln's (Keras) layouts, so weights compare directly;
# the forward passes permute them into torch's NCHW conventions.
def conv_w(w):  # (KH, KW, C, F) -> (F, C, KH, KW)
    return w.permute(3, 2, 0, 1)


def depthwise_w(w):  # (KH, KW, C, M) -> (C*M, 1, KH, KW), out channel c*M + m
    kh, kw, c, m = w.shape
    return w.permute(2, 3, 0, 1).reshape(c * m, 1, kh, kw)


def mlp_forward(p, state, x):
    h = x.reshape(x.shape[0], -1)
    h = F.relu(h @ p["d1.kernel"] + p["d1.bias"])
    h = F.relu(h @ p["d2.kernel"] + p["d2.bias"])
    return h @ p["d3.kernel"] + p["d3.bias"]


def cnn_forward(p, state, x):
    h = x.permute(0, 3, 1, 2)  # NHWC -> NCHW
    h = F.relu(F.conv2d(h, conv_w(p["conv.kernel"]), p["conv.bias"], padding=1))
    # kiln's momentum 0.9 is torch's 0.1
    bn = F.relu(F.batch_norm(h, state["bn.moving_mean"], state["bn.moving_variance"],
                             p["bn.gamma"], p["bn.beta"], training=True, momentum=0.1, eps=1e-3))
    c = bn.shape[1]
    s = F.conv2d(bn, depthwise_w(p["sep.depthwise_kernel"]), None, padding=1, groups=c)
    s = F.relu(F.conv2d(s, conv_w(p["sep.pointwise_kernel"]), p["sep.bias"]))
    h = bn + s
    h = F.conv2d(h, depthwise_w(p["dw.depthwise_kernel"]), p["dw.bias"], groups=c)
    h = F.max_pool2d(h, 2)
    h = F.avg_pool2d(h, 2, stride=1)
    h = h.mean((2, 3))
    return h @ p["out.kernel"] + p["out.bias"]


def run(parity, model, opt_name):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([parity, model, opt_name, str(STEPS), out], check=True)
        init = read_safetensors(os.path.join(out, "init.safetensors"))
        final = read_safetensors(os.path.join(out, "final.safetensors"))
        kiln_losses = [float(v) for v in open(os.path.join(out, "losses.txt"))]
        xs = np.fromfile(os.path.join(out, "x.bin"), dtype=np.float32)
        ys = np.fromfile(os.path.join(out, "y.bin"), dtype=np.int32)
    state = {k: v.clone() for k, v in init.items() if "moving" in k}
    params = {k: v.clone().requires_grad_(True) for k, v in init.items() if "moving" not in k}
    shape = (STEPS, 16, 10, 10, 3) if model == "cnn" else (STEPS, 32, 28, 28, 1)
    xs = torch.from_numpy(xs.reshape(shape))
    ys = torch.from_numpy(ys.astype(np.int64).reshape(shape[:2]))
    forward = cnn_forward if model == "cnn" else mlp_forward
    opt = torch_optimizer(opt_name, list(params.values()))
    torch_losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(forward(params, state, xs[s]), ys[s])
        loss.backward()
        opt.step()
        torch_losses.append(loss.item())
    problems = []
    tl, kl = torch.tensor(torch_losses), torch.tensor(kiln_losses)
    if os.environ.get("KILN_PARITY_VERBOSE"):
        for s, (a, b) in enumerate(zip(kiln_losses, torch_losses)):
            print(f"  step {s + 1:2d}: kiln {a:.8f} torch {b:.8f} diff {a - b:+.2e}")
    if not torch.allclose(kl, tl, rtol=RTOL, atol=ATOL):
        i = int((kl - tl).abs().argmax())
        problems.append(f"loss at step {i + 1}: kiln {kl[i]:.7f} vs torch {tl[i]:.7f}")
    for name, want in list(params.items()) + list(state.items()):
        got = final[name]
        want = want.detach()
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            diff = (got - want).abs()
            problems.append(f"{name}: max |diff| {diff.max():.3g} "
                            f"(at {int(diff.argmax())}, torch {want.flatten()[diff.argmax()]:.6g})")
    worst = max((final[n] - v.detach()).abs().max().item()
                for n, v in list(params.items()) + list(state.items()))
    return problems, kiln_losses[-1], torch_losses[-1], worst


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    parity = sys.argv[1]
    models = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mlp", "cnn"]
    failed = 0
    for model in models:
        for opt_name in OPTIMIZERS:
            problems, kl, tl, worst = run(parity, model, opt_name)
            status = "ok" if not problems else "FAILED"
            print(f"{model:3s} {opt_name:12s} {status}: loss after {STEPS} steps kiln {kl:.6f} "
                  f"torch {tl:.6f}; largest weight difference {worst:.2e}")
            for p in problems[:5]:
                print(f"    {p}")
            failed += bool(problems)
    total = len(models) * len(OPTIMIZERS)
    print(f"{total - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
