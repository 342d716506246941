"""The PyTorch twins of bench/zoo.py's models: reads the same kiln job spec
(bench/specs/zoo/*.json) and builds the same layers in PyTorch, with Keras's
defaults mirrored (glorot-uniform kernels and zero biases, batch norm
momentum 0.99 -> torch momentum 0.01 and epsilon 1e-3, "same" padding
(one more cell at the bottom/right where its total is odd, as Keras pads),
average pools that leave the padding out of the mean, leaky ReLU alpha 0.3,
exact GELU, Adam with epsilon 1e-7). Images are NCHW here, NHWC in kiln.

  torch_zoo.py speed SPEC THREADS WARMUP STEPS DATA_DIR [CSV]
      trains WARMUP steps, then times STEPS more on the data set, the
      spec's batch, shuffled, as kiln-train reads it
  torch_zoo.py train SPEC THREADS EPOCHS SEED DATA_DIR [CSV]
      the spec's recipe for EPOCHS epochs, then the test accuracy (or the
      validation MSE of a regression: the last validation_split of the rows)

Set the caching malloc tunables (bench/torch_best.py) in the environment
before running it; prints one JSON line."""
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
import torch.nn.functional as F  # noqa: E402


def pair(v, default):
    if v is None:
        v = default
    return tuple(v) if isinstance(v, list) else (v, v)


def act_fn(name, alpha=None):
    if name in (None, "linear", "softmax"):  # softmax: folded into the cross-entropy loss
        return None
    return {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.3 if alpha is None else alpha),
            "elu": nn.ELU(1.0 if alpha is None else alpha), "gelu": nn.GELU(),
            "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh()}[name]


def keras_same(k, s, h, w):
    """Keras's (TensorFlow's) "same" padding of an h x w input as (left,
    right, top, bottom): the total that gives ceil(size / stride) outputs,
    the odd cell at the bottom/right (a stride-2 convolution on an even
    size pads only there)."""
    def side(size, kk, ss):
        total = max((-(-size // ss) - 1) * ss + kk - size, 0)
        return total // 2, total - total // 2
    (top, bottom), (left, right) = side(h, k[0], s[0]), side(w, k[1], s[1])
    return left, right, top, bottom


def conv_same(conv, k, s, h, w):
    """conv (built without padding) with Keras's "same" padding in front:
    torch's own padding argument where it is symmetric, an explicit zero
    pad where it is not."""
    left, right, top, bottom = keras_same(k, s, h, w)
    if left == right and top == bottom:
        conv.padding = (top, left)
        return conv
    return nn.Sequential(nn.ZeroPad2d((left, right, top, bottom)), conv)


class AsymmetricPool(nn.Module):
    """A pool with Keras's "same" padding where it is not symmetric (a 3x3
    stride-2 window on an even size: one more cell at the bottom and right):
    max over -inf padding, or the mean of the cells inside."""

    def __init__(self, is_max, k, s, pads):
        super().__init__()
        self.is_max, self.k, self.s, self.pads = is_max, k, s, pads

    def forward(self, x):
        if self.is_max:
            return F.max_pool2d(F.pad(x, self.pads, value=float("-inf")), self.k, self.s)
        total = F.avg_pool2d(F.pad(x, self.pads), self.k, self.s, divisor_override=1)
        ones = F.pad(torch.ones_like(x[:1, :1]), self.pads)
        return total / F.avg_pool2d(ones, self.k, self.s, divisor_override=1)


class Layer(nn.Module):
    """One spec layer: its module and where its inputs come from."""

    def __init__(self, spec, shapes, names):
        super().__init__()
        t = spec["type"]
        self.kind = t
        self.inputs = [names[n] for n in spec.get("inputs", [])] or [len(shapes) - 1]
        ins = [shapes[i] for i in self.inputs]
        shape = ins[0]
        self.act = act_fn(spec.get("activation"), spec.get("alpha"))
        self.mod = None
        if t == "dense":
            self.mod = nn.Linear(shape[0], spec["units"], bias=spec.get("use_bias", True))
            out = (spec["units"],)
        elif t == "flatten":
            out = (int(np.prod(shape)),)
        elif t in ("relu", "leaky_relu", "elu", "softmax"):  # activation layers by Keras's names
            self.act = act_fn(t, spec.get("negative_slope", spec.get("alpha")))
            out = shape
        elif t == "activation":
            out = shape
        elif t in ("conv2d", "depthwise_conv2d", "separable_conv2d"):
            c, h, w = shape
            k = pair(spec.get("kernel_size"), 3)
            s = pair(spec.get("strides"), 1)
            same = spec.get("padding", "valid") == "same"
            bias = spec.get("use_bias", True)
            mult = spec.get("depth_multiplier", 1)
            d = pair(spec.get("dilation_rate"), 1)
            ek = ((k[0] - 1) * d[0] + 1, (k[1] - 1) * d[1] + 1)  # the dilated kernel's extent

            def padded(conv):
                return conv_same(conv, ek, s, h, w) if same else conv
            if t == "conv2d":
                self.mod = padded(nn.Conv2d(c, spec["filters"], k, s, 0, d, bias=bias))
                oc = spec["filters"]
            elif t == "depthwise_conv2d":
                self.mod = padded(nn.Conv2d(c, c * mult, k, s, 0, d, groups=c, bias=bias))
                oc = c * mult
            else:  # Keras's SeparableConv2D: depthwise without bias, then pointwise
                self.mod = nn.Sequential(padded(nn.Conv2d(c, c * mult, k, s, 0, d, groups=c,
                                                          bias=False)),
                                         nn.Conv2d(c * mult, spec["filters"], 1, bias=bias))
                oc = spec["filters"]
            if same:
                oh, ow = -(-h // s[0]), -(-w // s[1])
            else:
                oh, ow = (h - ek[0]) // s[0] + 1, (w - ek[1]) // s[1] + 1
            out = (oc, oh, ow)
        elif t == "batch_norm":
            bn = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
            self.mod = bn(shape[0], eps=spec.get("epsilon", 1e-3),
                          momentum=1.0 - spec.get("momentum", 0.99))
            out = shape
        elif t == "dropout":
            self.mod = nn.Dropout(spec["rate"])
            out = shape
        elif t in ("max_pool2d", "avg_pool2d"):
            c, h, w = shape
            k = pair(spec.get("pool_size"), 2)
            s = pair(spec["strides"], 1) if "strides" in spec else k
            same = spec.get("padding", "valid") == "same"
            pads = keras_same(k, s, h, w) if same else (0, 0, 0, 0)
            if pads[0] != pads[1] or pads[2] != pads[3]:
                self.mod = AsymmetricPool(t == "max_pool2d", k, s, pads)
            elif t == "max_pool2d":
                self.mod = nn.MaxPool2d(k, s, (pads[2], pads[0]))
            else:
                self.mod = nn.AvgPool2d(k, s, (pads[2], pads[0]), count_include_pad=False)
            if same:
                out = (c, -(-h // s[0]), -(-w // s[1]))
            else:
                out = (c, (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1)
        elif t == "global_avg_pool2d":
            out = (shape[0],)
        elif t == "add":
            out = shape
        elif t == "concatenate":
            out = (sum(x[0] for x in ins),) + tuple(shape[1:])
        else:
            raise ValueError(f"layer type {t} has no twin")
        self.out_shape = out

    def forward(self, xs):
        x = xs[0]
        if self.kind == "flatten":
            x = torch.flatten(x, 1)
        elif self.kind == "global_avg_pool2d":
            x = x.mean((2, 3))
        elif self.kind == "add":
            for y in xs[1:]:
                x = x + y
        elif self.kind == "concatenate":
            x = torch.cat(xs, 1)
        elif self.mod is not None:
            x = self.mod(x)
        if self.act is not None:
            x = self.act(x)
        return x


class Twin(nn.Module):
    def __init__(self, spec):
        super().__init__()
        m = spec["model"]
        shape = tuple(m["input_shape"])
        if len(shape) == 3:
            shape = (shape[2], shape[0], shape[1])
        shapes, names, layers = [shape], {"input": 0}, []
        for i, ls in enumerate(m["layers"]):
            layer = Layer(ls, shapes, names)
            layers.append(layer)
            shapes.append(layer.out_shape)
            names[ls.get("name", f"{ls['type']}_{i}")] = i + 1
        self.layers = nn.ModuleList(layers)
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Conv2d)):
                nn.init.xavier_uniform_(mod.weight)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, x):
        outs = [x]
        for layer in self.layers:
            outs.append(layer([outs[i] for i in layer.inputs]))
        return outs[-1]


def idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)  # read-only: copy before use


def load(spec, data, csv):
    """(x, y, test_x, test_y) as float32 inputs (images / 255, NCHW)."""
    if spec["loss"] == "mse":
        rows = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=np.float32)
        n_val = int(len(rows) * spec["dataset"]["validation_split"] + 0.5)
        x, y = torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, -1:].copy())
        return x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    d = f"{data}/fashion-mnist"

    def images(name):
        return torch.from_numpy(idx(f"{d}/{name}", 16).reshape(-1, 1, 28, 28).copy()).float().div_(255.0)

    def labels(name):
        return torch.from_numpy(idx(f"{d}/{name}", 8).astype(np.int64))
    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def setup(spec, seed):
    torch.manual_seed(seed)
    m = Twin(spec)
    opt = torch.optim.Adam(m.parameters(), lr=spec["optimizer"]["learning_rate"], eps=1e-7)
    loss_fn = nn.MSELoss() if spec["loss"] == "mse" else nn.CrossEntropyLoss()
    return m, opt, loss_fn


def batches(n, batch, epochs_or_none):
    """Shuffled batch indices, epoch after epoch (forever when None)."""
    e = 0
    while epochs_or_none is None or e < epochs_or_none:
        perm = torch.randperm(n)
        for i in range(0, n, batch):
            yield perm[i:i + batch]
        e += 1


def speed(spec, warmup, steps, data, csv):
    x, y, _, _ = load(spec, data, csv)
    m, opt, loss_fn = setup(spec, 42)
    m.train()
    batch = spec["pipeline"]["batch_size"]
    it = batches(x.shape[0], batch, None)
    for s in range(-warmup, steps):
        if s == 0:
            t0 = time.perf_counter()
        i = next(it)
        opt.zero_grad()
        loss_fn(m(x[i]), y[i]).backward()
        opt.step()
    secs = time.perf_counter() - t0
    return {"examples_per_s": steps * batch / secs, "ms_per_step": secs / steps * 1e3}


def train(spec, epochs, seed, data, csv):
    x, y, tx, ty = load(spec, data, csv)
    m, opt, loss_fn = setup(spec, seed)
    t0 = time.perf_counter()
    m.train()
    for i in batches(x.shape[0], spec["pipeline"]["batch_size"], epochs):
        opt.zero_grad()
        loss_fn(m(x[i]), y[i]).backward()
        opt.step()
    train_s = time.perf_counter() - t0
    m.eval()
    with torch.no_grad():
        out = torch.cat([m(tx[i:i + 1000]) for i in range(0, tx.shape[0], 1000)])
    if spec["loss"] == "mse":
        return {"test_mse": F.mse_loss(out, ty).item(), "train_s": train_s}
    return {"test_accuracy": (out.argmax(1) == ty).float().mean().item(), "train_s": train_s}


def main():
    mode, spec_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    with open(spec_path) as f:
        spec = json.load(f)
    csv = sys.argv[7] if len(sys.argv) > 7 else None
    if mode == "speed":
        out = speed(spec, int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], csv)
    else:
        out = train(spec, int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], csv)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
