#!/usr/bin/env python3
"""Predicted decode speed of a distributed run (docs/distributed.md, "Cost model").

One decode step of one sequence over N ranks, experts split (each rank holds a
contiguous block of E/N experts of every layer, everything else in full):

  step = compute + exchanges + message
  compute   = bytes the slowest rank reads / memory bandwidth: the non-routed weights
              (attention, shared experts, router, norms and the output head, which
              rank 0 reads: it is the slowest rank when loads are equal)
              plus the routed experts of that rank's that the token chose. With k of E
              experts chosen at random, the slowest rank holds the expected maximum
              over ranks (simulated below), not k/N.
  exchanges = per MoE layer one all-gather of k rows of n_embd floats: latency
              ceil(log2 N) * alpha plus (N-1)/N * k * n_embd * 4 bytes / link bandwidth
  message   = rank 0's step message: ceil(log2 N) * alpha

Usage: distributed_cost_model.py [--alpha-us 25] [--link-gbps 25] [--mem-gbs 50]
       [--machine-gib 64] [--check N ALPHA_US LINK_GBPS COMPUTE_MS] (one measured case)
"""
import argparse
import math
import random

GIB = 1024 ** 3
# Shapes (tessera-gen presets and the models' config.json); bytes at Q4_K_M, about
# 4.85 bits per weight over a file's mix of Q4_K and Q6_K tensors.
BYTES_PER_PARAM = 4.85 / 8
SHAPES = {
    # name: (MoE layers, n_embd, experts, chosen, params of one routed expert, params of
    # everything else (the total less the routed experts), of which the token embedding
    # table: held by every rank but read one row a token)
    "Qwen3-30B-A3B": (48, 2048, 128, 8, 3 * 2048 * 768, 1.5e9, 2048 * 151936),
    "Qwen3.5-397B-A17B": (60, 4096, 512, 10, 3 * 4096 * 1024, 9.85e9, 4096 * 248320),
    "DeepSeek-V3": (58, 7168, 256, 8, 3 * 7168 * 2048, 17.1e9, 7168 * 129280),
}


def expected_max_load(experts, chosen, ranks, trials=20000, seed=1):
    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        load = [0] * ranks
        for e in rng.sample(range(experts), chosen):
            load[e * ranks // experts] += 1
        total += max(load)
    return total / trials


def predict(shape, ranks, alpha_s, link_bps, mem_bps):
    layers, embd, experts, chosen, exp_params, other_params, table_params = shape
    exp_bytes = exp_params * BYTES_PER_PARAM
    other_bytes = other_params * BYTES_PER_PARAM
    read_bytes = (other_params - table_params) * BYTES_PER_PARAM
    max_load = expected_max_load(experts, chosen, ranks)
    compute = (read_bytes + layers * max_load * exp_bytes) / mem_bps
    lat = math.ceil(math.log2(ranks)) * alpha_s if ranks > 1 else 0.0
    bw = (ranks - 1) / ranks * chosen * embd * 4 / link_bps
    exchanges = layers * (lat + bw) if ranks > 1 else 0.0
    per_rank_bytes = other_bytes + layers * experts * exp_bytes / ranks
    return compute, exchanges, lat, per_rank_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha-us", type=float, default=25.0, help="one small-message latency (us)")
    ap.add_argument("--link-gbps", type=float, default=25.0, help="link bandwidth (Gb/s)")
    ap.add_argument("--mem-gbs", type=float, default=50.0, help="a machine's effective memory read bandwidth (GB/s)")
    ap.add_argument("--machine-gib", type=float, default=64.0, help="memory per machine (GiB)")
    ap.add_argument("--check", nargs=5, metavar=("SHAPE", "N", "ALPHA_US", "LINK_GBPS", "COMPUTE_MS"),
                    help="predict one measured case: exchange time per token (ms) from a measured latency")
    a = ap.parse_args()
    if a.check:
        shape, n, alpha, link, compute_ms = a.check
        layers, embd, _, chosen, *_ = SHAPES[shape]
        n = int(n)
        lat = math.ceil(math.log2(n)) * float(alpha) * 1e-6
        bw = (n - 1) / n * chosen * embd * 4 / (float(link) * 1e9 / 8)
        ex = layers * (lat + bw) + lat
        print(f"{shape}, {n} ranks: exchanges {ex * 1e3:.3f} ms per token; with {compute_ms} ms of compute "
              f"{1.0 / (ex + float(compute_ms) / 1e3):.2f} tok/s")
        return
    print(f"assumptions: latency {a.alpha_us} us, link {a.link_gbps} Gb/s, memory {a.mem_gbs} GB/s, "
          f"{a.machine_gib} GiB per machine (a rank may use 90%)")
    print("| model | machines | per machine | compute ms | exchanges ms | tok/s |")
    print("|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        for n in (4, 8, 16):
            compute, exchanges, lat, per_rank = predict(shape, n, a.alpha_us * 1e-6, a.link_gbps * 1e9 / 8,
                                                        a.mem_gbs * 1e9)
            fits = per_rank <= 0.9 * a.machine_gib * GIB
            step = compute + exchanges + lat
            speed = f"{1.0 / step:.1f}" if fits else "does not fit"
            print(f"| {name} | {n} | {per_rank / GIB:.1f} GiB | {compute * 1e3:.1f} | {exchanges * 1e3:.2f} | {speed} |")


if __name__ == "__main__":
    main()
