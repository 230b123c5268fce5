#!/usr/bin/env python3
"""The JAX peer of the `session` bench: a jit-compiled training step of the README's main model.

The model is the one `tessera train` trains by default, on one device: Flatten (28 x 28) ->
Dense 256 (ReLU) -> Dense 128 (ReLU) -> Dense 10 (softmax), sparse softmax cross-entropy,
plain SGD at 0.1, f32, micro-batches of 32, Glorot-uniform kernels and zero biases.

What a "step" is, on both sides: one micro-batch of 32 samples through the forward and the
backward pass, its gradients added to the accumulated ones, with the weight update amortised
over M micro-batches. `tessera train` accumulates M = 4 micro-batches per update, so the peer
jit-compiles one whole weight update - M forward and backward passes, the summed gradients,
the SGD update - and reports the time of an update divided by M. Every update's micro-batches
come from a shuffled host array and are handed to the compiled function as NumPy arrays, as a
JAX training loop feeds its steps (the transfer to the device is timed, as Tessera's infeed is).
The data are random digits (the timing does not depend on them).

The last line of standard output is one JSON object; `seconds_per_step` is the figure the bench
compares against:

    {"peer": "jax", "seconds_per_step": 0.00038, ...}

With `--serve`, the peer compiles and warms up, prints one JSON line (`{"peer": "jax", "ready":
true, ...}`), then times one run of `--updates` updates for each line read from standard input
and prints its JSON line (`{"seconds_per_step": ...}`), until standard input closes: the bench
interleaves these runs with its own sessions, so that both see the machine in the same state.

Exit status 2 (and a line on standard error) when JAX is not installed.
"""

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per update (M)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--updates", type=int, default=250, help="weight updates per timed run")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--serve", action="store_true", help="one timed run per line read from standard input"
    )
    args = parser.parse_args()
    if min(args.batch_size, args.accumulation, args.updates, args.runs) < 1:
        print("jax_mlp_step: sizes and counts must be at least 1", file=sys.stderr)
        return 1

    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except ImportError as e:
        print(f"jax_mlp_step: JAX is not installed ({e})", file=sys.stderr)
        return 2

    b, m, lr = args.batch_size, args.accumulation, args.learning_rate
    sizes = [28 * 28, 256, 128, 10]
    rng = np.random.default_rng(args.seed)

    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

    params = [
        (jnp.asarray(glorot(i, o)), jnp.zeros((o,), jnp.float32))
        for i, o in zip(sizes[:-1], sizes[1:])
    ]

    def loss_fn(params, x, y):
        h = x.reshape((x.shape[0], -1))
        for w, c in params[:-1]:
            h = jax.nn.relu(h @ w + c)
        w, c = params[-1]
        logits = h @ w + c
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    grad_fn = jax.value_and_grad(loss_fn)

    @jax.jit
    def update(params, xs, ys):
        """M micro-batches forward and backward, gradients summed, one SGD update."""
        total = jax.tree_util.tree_map(jnp.zeros_like, params)
        loss_sum = jnp.float32(0.0)
        for i in range(m):
            loss, g = grad_fn(params, xs[i], ys[i])
            total = jax.tree_util.tree_map(jnp.add, total, g)
            loss_sum = loss_sum + loss
        params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, total)
        return params, loss_sum / m

    samples = 8000
    images = (rng.random((samples, 28, 28)) < 0.2).astype(np.float32)
    labels = rng.integers(0, 10, samples).astype(np.int32)
    per_update = m * b

    def batches(n: int):
        """`n` updates' micro-batches from the reshuffled data, as host arrays."""
        out, order, at = [], rng.permutation(samples), 0
        for _ in range(n):
            if at + per_update > samples:
                order, at = rng.permutation(samples), 0
            idx = order[at : at + per_update]
            at += per_update
            out.append((images[idx].reshape(m, b, 28, 28), labels[idx].reshape(m, b)))
        return out

    # Compile and warm up.
    for xs, ys in batches(10):
        params, loss = update(params, xs, ys)
    loss.block_until_ready()

    def timed_run() -> float:
        nonlocal params
        feed = batches(args.updates)
        start = time.perf_counter()
        loss = None
        for xs, ys in feed:
            params, loss = update(params, xs, ys)
        loss.block_until_ready()
        return time.perf_counter() - start

    about = {
        "micro_batch": b,
        "accumulation": m,
        "updates_per_run": args.updates,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    if args.serve:
        print(json.dumps({"peer": "jax", "ready": True, **about}), flush=True)
        for _ in sys.stdin:
            seconds = timed_run()
            print(json.dumps({"seconds_per_step": seconds / (args.updates * m)}), flush=True)
        return 0

    times = [timed_run() for _ in range(args.runs)]
    per_step = statistics.median(times) / (args.updates * m)
    print(
        json.dumps(
            {
                "peer": "jax",
                "seconds_per_step": per_step,
                "runs": args.runs,
                "run_seconds": times,
                **about,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
