"""3x3 and 5x5 convolutions by Winograd against the GEMM: the same kiln-train,
KILN_WINOGRAD=off and on, runs interleaved, medians of --repeats.

  /usr/bin/python3 bench/winograd.py [--build build-rel] [--repeats 3]
                                     [--threads 2] [--models cnn,resnet,...]
                                     [--json winograd.json]

Models: the zoo's that have 3x3 stride-1 convolutions (cnn, resnet,
inception; bench/specs/zoo), two wide networks outside it
(bench/specs/wide: a stride-2 stem, then two 3x3 "same" convolutions of
256 channels on 14x14, or of 512 on 7x7, global average pooling; batch
32), where the products go by chunks (docs/engine.md), and two of
bench/specs/other: vgg_bn (two 5x5 convolutions, F(2x2, 5x5)) and
dilated_res (a 3x3 convolution of dilation 2, by phases). Each run trains
WARMUP steps, then STEPS more; examples/s come from the times kiln-train's
--json progress lines arrive, as in bench/zoo.py. Prints a markdown
table; --json writes every run."""
import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import zoo  # noqa: E402

# model: (spec, warm-up steps, timed steps)
MODELS = {
    "cnn": (os.path.join(zoo.SPECS, "cnn.json"), 5, 30),
    "resnet": (os.path.join(zoo.SPECS, "resnet.json"), 3, 10),
    "inception": (os.path.join(zoo.SPECS, "inception.json"), 3, 10),
    "conv256": (os.path.join(ROOT, "bench", "specs", "wide", "conv256.json"), 2, 6),
    "conv512": (os.path.join(ROOT, "bench", "specs", "wide", "conv512.json"), 2, 6),
    "vgg_bn": (os.path.join(ROOT, "bench", "specs", "other", "vgg_bn.json"), 3, 10),
    "dilated_res": (os.path.join(ROOT, "bench", "specs", "other", "dilated_res.json"), 3, 10),
}


def speed(build, model, threads, winograd):
    """examples/s of one run, KILN_WINOGRAD=on or off."""
    path, warm, steps = MODELS[model]
    with open(path) as f:
        spec = json.load(f)
    spec["pipeline"]["take"] = (warm + steps) * spec["pipeline"]["batch_size"]
    spec["epochs"] = 1
    spec["log_every_steps"] = 1
    spec["dataset"] = {"name": spec["dataset"]["name"], "validation": "none"}
    os.environ["KILN_WINOGRAD"] = winograd
    with tempfile.TemporaryDirectory() as wd:
        lines, _ = zoo.kiln_run(build, spec, threads, wd, wd)
    at = {}
    for t, line in lines:
        if "metrics" in line and "loss" in line["metrics"]:
            at.setdefault(line["step"], t)
    last = max(at)
    return (last - warm) * spec["pipeline"]["batch_size"] / (at[last] - at[warm])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-rel"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json")
    args = ap.parse_args()
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model {m!r}: one of {', '.join(MODELS)}")
    runs = {(m, w): [] for m in models for w in ("off", "on")}
    for r in range(args.repeats):
        for m in models:
            for w in ("off", "on"):
                runs[(m, w)].append(speed(args.build, m, args.threads, w))
            print(f"  repeat {r + 1}/{args.repeats} {m}: GEMM {runs[(m, 'off')][-1]:.0f}, "
                  f"Winograd {runs[(m, 'on')][-1]:.0f} examples/s", flush=True)
    print("\n| model | threads | GEMM ex/s | Winograd ex/s | Winograd / GEMM |")
    print("|---|---|---|---|---|")
    rows = []
    for m in models:
        off, on = (statistics.median(runs[(m, w)]) for w in ("off", "on"))
        rows.append({"model": m, "threads": args.threads, "gemm": off, "winograd": on,
                     "runs": {w: runs[(m, w)] for w in ("off", "on")}})
        print(f"| {m} | {args.threads} | {off:,.0f} | {on:,.0f} | **{on / off:.2f}** |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
