"""What several ranks cost and exchange per step: the same training on 1 and N ranks.

    make bench-ranks RANKS=2        # or: .venv/bin/python bench/ranks.py --ranks 2 --json

A synthetic model sized like one CTR model's step: --tables tables of width --dim,
each looked up by one feature of --ids-per-row ids per example (ids uniform over
--vocab), an MLP 64-1 on the concatenated rows, Adagrad on the tables and SGD on
the dense weights (summed in one all-reduce on several ranks). The global batch is
--batch examples; on N ranks each rank trains on its slice (batch / N), so both runs
do the same training. Each run is a fresh process (or mpirun job) that builds the
model, runs --warmup untimed steps, then --steps timed ones.

Reported (the last stdout line is one JSON object with --json):
  step_ms_1, step_ms_N    median wall time per step (one process; the slowest
                          rank on N ranks);
  samples_per_s_1, _N     global samples per second, and their ratio `speedup`
                          (on one machine the N ranks share its cores: below 1 on a
                          2-core machine is expected; the figure is the exchange's
                          cost, not a scaling claim);
  bytes_per_rank_step     payload bytes each rank sent to other ranks per step
                          (measured by the exchange's own counter), and
  bytes_model             the same from what the step must move (per unique key
                          another rank owns: key and count out, row back, key and
                          summed gradient out; heads; the dense all-reduce),
                          which the scale-out projection uses;
  forward_bytes_per_rank_step, forward_bytes_minimum, forward_over_minimum
                          the lookups' bytes (a forward-only pass) against the
                          least any lookup must move: unique remote keys x (key +
                          row) bytes;
  mpi_ms_per_step         time the slowest rank's threads spent in exchanges
                          per step (waits for other ranks included);
  exchanges_per_step      all-to-all exchanges per step (a lookup: 2, an apply:
                          1, the dense all-reduce: 2);
  link_bytes_per_s        what one rank sends per second in exchanges of 4 MiB
                          parts, and
  empty_exchange_us       the latency of an exchange that carries nothing: the
                          transport's own bounds (bench/exchange_bench.c, in C,
                          under mpirun in the same invocation);
  step_part_exchange_us   one exchange of the step's average part size, alone
                          (the transport, not a bound: a step's parts differ in
                          size, and small ones stay in cache);
  mpi_share_of_step       mpi_ms_per_step / step_ms_N;
  projection              per-rank bytes per step for 8-64 ranks at this run's
                          per-rank batch, from bytes_model corrected by its
                          measured ratio, and their time at 25 and 100 Gb/s.

--hosts runs the N ranks on N network hosts of this machine (tests/hosts/hosts.sh:
network namespaces on a bridge, TCP between them; needs root), --link-rate RATE
(e.g. 1gbit; implies --hosts) limits each host's link. Then also:
  tcp_bytes_per_s         a plain TCP transfer from host 0 to host 1 (the link's
                          own throughput, measured in the same run);
  exchange_bound_ms       bytes_per_rank_step / tcp_bytes_per_s: the least time
                          a step's exchanges can take on this link, and
  mpi_over_bound          mpi_ms_per_step / exchange_bound_ms (the rest of the
                          exchanges' time: round trips, waiting for the slowest
                          rank's compute).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--ids-per-row", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1_000_000)
    p.add_argument("--zipf", type=float, default=0.0,
                   help="ids zipf-distributed with this exponent (> 1; 0: uniform)")
    p.add_argument("--batch", type=int, default=2048, help="global batch (examples)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hosts", action="store_true",
                   help="the ranks on network hosts of this machine (tests/hosts/hosts.sh)")
    p.add_argument("--link-rate", default=None,
                   help="each host's link limited to this rate (tc's units: 1gbit, 10gbit)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # results dir
    return p.parse_args(argv)


def worker(a: argparse.Namespace) -> None:
    """One process of a run: trains and writes <dir>/<rank>.json."""
    import numpy as np
    import tensorflow as tf

    import dynemb
    from dynemb import _state
    tf.compat.v1.disable_eager_execution()
    dynemb.init()
    rank, size = dynemb.get_rank_id(), dynemb.get_rank_size()
    local = a.batch // size
    rng = np.random.default_rng(rank + 1)
    shape = (local, a.tables, a.ids_per_row)
    batches = [(rng.zipf(a.zipf, size=shape) % a.vocab if a.zipf else
                rng.integers(0, a.vocab, size=shape)).astype(np.int64) for _ in range(8)]
    labels = rng.integers(0, 2, size=(local, 1)).astype(np.float32)
    ids = tf.compat.v1.placeholder(tf.int64, [local, a.tables, a.ids_per_row])
    opt = dynemb.optimizers.adagrad.create_hash_optimizer(0.05, 0.1)
    rows = []
    for t in range(a.tables):
        table = dynemb.create_table(tf.int64, a.dim, "t%d" % t,
                                    tf.compat.v1.random_uniform_initializer(-0.05, 0.05))
        rows.append(tf.reshape(dynemb.sparse_lookup(table, ids[:, t, :], name="f%d" % t),
                               [local, a.ids_per_row * a.dim]))
    x = tf.concat(rows, axis=1)
    hidden = tf.compat.v1.layers.dense(x, 64, activation=tf.nn.relu)
    logits = tf.compat.v1.layers.dense(hidden, 1)
    loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)) / a.batch
    dense, sparse = dynemb.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse)
    step = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            zip(dynemb.allreduce_gradients(grads[:len(dense)], average=False), dense)),
        opt.apply_gradients(zip(grads[len(dense):], sparse)))
    # all-to-all exchanges per step: a lookup's two (keys, rows), an apply's
    # one, an all-reduce's two (reduce-scatter, all-gather)
    per_op = {"DynembShardedLookup": 2, "DynembShardedApply": 1, "DynembAllreduce": 2}
    exchanges = sum(per_op.get(op.type, 0)
                    for op in tf.compat.v1.get_default_graph().get_operations())
    dense_floats = sum(int(np.prod(v.shape)) for v in dense)
    world = _state._world() if size > 1 else None  # pylint: disable=protected-access
    times = []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for s in range(a.warmup):
            sess.run(step, {ids: batches[s % len(batches)]})
        # forward only (the lookups' two exchanges per table): its bytes
        sent0 = world.bytes_sent() if world else 0
        for s in range(a.steps):
            sess.run(loss, {ids: batches[s % len(batches)]})
        forward = (world.bytes_sent() - sent0) / a.steps if world else 0
        sent0 = world.bytes_sent() if world else 0
        mpi0 = world.seconds() if world else 0.0
        for s in range(a.steps):
            t0 = time.perf_counter()
            sess.run(step, {ids: batches[s % len(batches)]})
            times.append(time.perf_counter() - t0)
        sent = (world.bytes_sent() - sent0) if world else 0
        mpi = (world.seconds() - mpi0) if world else 0.0
    out = {"rank": rank, "size": size, "times": times, "bytes_per_step": sent / a.steps,
           "forward_bytes_per_step": forward, "mpi_s_per_step": mpi / a.steps,
           "exchanges_per_step": exchanges, "dense_floats": dense_floats,
           "remote_unique_per_step": _remote_unique(batches, a, rank, size)}
    with open(os.path.join(a.worker, "%d.json" % rank), "w") as f:
        json.dump(out, f)


def _remote_unique(batches, a, rank: int, size: int) -> float:
    """Unique keys per step (summed over tables) that another rank owns: the
    keys whose rows must cross the link (the timed steps cycle over
    `batches`)."""
    import numpy as np

    from dynemb import _lib
    if size == 1:
        return 0.0
    total = 0
    for b in batches:
        for t in range(a.tables):
            keys = np.unique(b[:, t, :])
            total += sum(1 for k in keys.tolist()
                         if _lib.clib.dynemb_key_shard(int(k), size) != rank)
    return total / len(batches)


HOSTS_SH = os.path.join(ROOT, "tests", "hosts", "hosts.sh")
# The network hosts of this run (--hosts): their set's name, once made.
_HOSTS = {"name": None}


def _mpirun(ranks: int) -> list:
    if _HOSTS["name"]:
        return [HOSTS_SH, "mpirun", _HOSTS["name"], str(ranks)]
    return ["mpirun", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none",
            "-np", str(ranks)] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


_SINK = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n / (time.perf_counter() - t0), flush=True)
"""
_SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = bytes(1 << 20)
for _ in range(int(sys.argv[3])): c.sendall(buf)
c.close()
"""


def tcp_throughput(name: str, megabytes: int) -> float:
    """Bytes per second of one plain TCP stream from host 0 to host 1."""
    a1 = subprocess.run([HOSTS_SH, "addr", "1"], capture_output=True, text=True,
                        check=True).stdout.strip()
    sink = subprocess.Popen(["ip", "netns", "exec", name + "-h1", sys.executable, "-c", _SINK,
                             a1], stdout=subprocess.PIPE, text=True)
    try:
        port = sink.stdout.readline().strip()
        subprocess.run(["ip", "netns", "exec", name + "-h0", sys.executable, "-c", _SOURCE, a1,
                        port, str(megabytes)], check=True, timeout=300)
        return float(sink.stdout.readline())
    finally:
        sink.kill()
        sink.wait()


def link(ranks: int, step_part: int) -> dict:
    """The exchange's own bounds (bench/exchange_bench.c, in C, under mpirun):
    an empty exchange's latency, an exchange of `step_part`-byte parts, and
    one rank's send throughput in exchanges of 4 MiB parts. No step can
    exchange faster than its transport."""
    prog = os.path.join(ROOT, "build", "bench", "exchange_bench")
    if not os.path.isfile(prog):
        raise SystemExit("bench/ranks: %s is missing; build it with `make "
                         "build/bench/exchange_bench` (or run `make bench-ranks`)" % prog)
    out = subprocess.run(_mpirun(ranks) + [prog, str(step_part)], check=True, capture_output=True, text=True,
                         timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def run(a: argparse.Namespace, ranks: int) -> list:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", d] + [
            "--%s=%s" % (k.replace("_", "-"), v) for k, v in vars(a).items()
            if k not in ("worker", "json", "ranks", "hosts", "link_rate")]
        if ranks > 1:
            cmd = _mpirun(ranks) + cmd
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        print("bench/ranks: %d rank(s)..." % ranks, file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=1200)
        return [json.load(open(os.path.join(d, "%d.json" % r))) for r in range(ranks)]


def model_bytes(a: argparse.Namespace, n: int, dense_floats: int, remote_unique: float) -> float:
    """Bytes a rank sends to other ranks per step, from what the step must
    move: per unique key another rank owns, the key and its occurrence count
    (8 + 4 bytes) out, its row (4*dim) back, then the key and its summed
    gradient row (8 + 4*dim) out; the parts' heads (32 bytes per part for
    the lookup's two exchanges, 16 for the apply's); the dense all-reduce's
    2 (n-1)/n of the dense floats."""
    per_key = (8 + 4) + 4 * a.dim + 8 + 4 * a.dim
    heads = (n - 1) * a.tables * (32 * 2 + 16) + (n - 1) * 2 * 16
    return remote_unique * per_key + heads + 2 * 4 * dense_floats * (n - 1) / n


def minimum_forward(a: argparse.Namespace, remote_unique: float) -> float:
    """The least a lookup can move: each unique remote key once out (8
    bytes) and its row once back (4*dim)."""
    return remote_unique * (8 + 4 * a.dim)


def projection(a: argparse.Namespace, dense_floats: int, unique_share: float,
               measured_over_model: float) -> list:
    """Bytes per rank and step for 8..64 ranks at this run's per-rank batch
    (batch / ranks: more ranks, more data), with this run's share of
    unique ids among the ids, from model_bytes corrected by its measured
    ratio, and what they cost at 25 and 100 Gb/s per rank (the bandwidth
    term only: per-exchange latency depends on the network)."""
    local = a.batch // a.ranks
    ids = local * a.tables * a.ids_per_row
    rows = []
    for n in (8, 16, 32, 64):
        remote_unique = ids * unique_share * (n - 1) / n
        volume = model_bytes(a, n, dense_floats, remote_unique) * measured_over_model
        rows.append({"ranks": n, "bytes_per_rank_step": volume,
                     "ms_at_25gbps": volume / (25e9 / 8) * 1e3,
                     "ms_at_100gbps": volume / (100e9 / 8) * 1e3})
    return rows


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        worker(a)
        return 0
    if a.ranks < 2:
        raise SystemExit("bench/ranks: --ranks must be >= 2 (it compares with one process)")
    if a.hosts or a.link_rate:
        a.hosts = True
        name = "bnch%d" % (os.getpid() % 10000)
        print("bench/ranks: %d network hosts%s..." % (
            a.ranks, ", links at " + a.link_rate if a.link_rate else ""), file=sys.stderr)
        subprocess.run([HOSTS_SH, "up", name, str(a.ranks)] +
                       ([a.link_rate] if a.link_rate else []), check=True, timeout=120)
        _HOSTS["name"] = name
        try:
            return _measure(a)
        finally:
            subprocess.run([HOSTS_SH, "down", name], timeout=120)
    return _measure(a)


def _measure(a: argparse.Namespace) -> int:
    one, many = run(a, 1), run(a, a.ranks)
    # the step's average part: its bytes over its exchanges and peers
    bounds = link(a.ranks, int(statistics.mean(r["bytes_per_step"] for r in many) /
                               many[0]["exchanges_per_step"] / (a.ranks - 1)))
    med1 = statistics.median(one[0]["times"])
    medn = max(statistics.median(r["times"]) for r in many)
    sent = [r["bytes_per_step"] for r in many]
    remote = statistics.mean(r["remote_unique_per_step"] for r in many)
    dense_floats = many[0]["dense_floats"]
    out = {
        "config": {k: v for k, v in vars(a).items() if k not in ("worker", "json")},
        "step_ms_1": med1 * 1e3, "step_ms_N": medn * 1e3,
        "samples_per_s_1": a.batch / med1, "samples_per_s_N": a.batch / medn,
        "speedup": med1 / medn,
        "bytes_per_rank_step": statistics.mean(sent),
        "bytes_model": model_bytes(a, a.ranks, dense_floats, remote),
        "forward_bytes_per_rank_step": statistics.mean(
            r["forward_bytes_per_step"] for r in many),
        "forward_bytes_minimum": minimum_forward(a, remote),
        "mpi_ms_per_step": max(r["mpi_s_per_step"] for r in many) * 1e3,
        "exchanges_per_step": many[0]["exchanges_per_step"],
        "link_bytes_per_s": bounds["link_bytes_per_s"],
        "empty_exchange_us": bounds["empty_exchange_us"],
    }
    out["forward_over_minimum"] = (out["forward_bytes_per_rank_step"] /
                                   out["forward_bytes_minimum"])
    out["step_part_exchange_us"] = bounds["step_part_exchange_us"]
    out["mpi_share_of_step"] = out["mpi_ms_per_step"] / out["step_ms_N"]
    ids_per_rank = a.batch // a.ranks * a.tables * a.ids_per_row
    unique_share = remote / (ids_per_rank * (a.ranks - 1) / a.ranks)
    out["projection"] = projection(a, dense_floats, unique_share,
                                   out["bytes_per_rank_step"] / out["bytes_model"])
    if _HOSTS["name"]:
        print("bench/ranks: a plain TCP transfer between hosts 0 and 1...", file=sys.stderr)
        out["tcp_bytes_per_s"] = tcp_throughput(_HOSTS["name"], 256)
        out["exchange_bound_ms"] = out["bytes_per_rank_step"] / out["tcp_bytes_per_s"] * 1e3
        out["mpi_over_bound"] = out["mpi_ms_per_step"] / out["exchange_bound_ms"]
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print("%-22s %s" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
