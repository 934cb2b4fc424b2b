"""Write a serving trace: the batches of a simulated continuous-batching server, one step a line.

    python3 benchmarks/make_trace.py [--out examples/serving-trace.jsonl] [--steps 40] [--seed 0]

Requests arrive (Poisson, ``--rate`` a step) with long-tailed prompts (log-normal, median ``--prompt-median``
tokens, capped at ``--max-prompt``) and log-normal output lengths. The scheduler is vLLM's with chunked prefill:
each step has a budget of ``--budget`` tokens and at most ``--max-running`` requests; the running requests come
first (a decode is one token, a prompt being prefilled takes its next chunk of at most ``--chunk`` tokens), then
waiting requests are admitted, first come first served, while budget and seats last. The last chunk of a prompt
samples the request's first token; a request leaves once it has generated its output. Every prompt begins with the
same ``--shared-prefix`` tokens (a system prompt), computed once and kept in the cache (prefix caching): a request's
keys include them, its prefill computes only the tokens after them, so every request of a step has at least that
many cached keys, and ``attnbench run --shared-prefix`` up to that length replays the trace with the prefix stored
once.

Each step is one batch of ``attnbench.serving``: every request it computes as ``[new tokens, keys]``, keys being
the request's KV cache after the new tokens are appended (a decode: ``[1, prefix + prompt + generated so far]``; a
prefill chunk: ``[chunk, prefix + prompt tokens prefilled so far, this chunk included]``). After ``--warmup`` steps
(an empty server fills up), one step in ``--every`` is written, ``--steps`` of them, as
``{"name": "step N", "requests": [[new, keys], ...]}`` under a ``#`` header line saying how the file was made
(``serving.read_trace`` skips it). Replay it with ``attnbench run --batch-trace examples/serving-trace.jsonl``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "serving-trace.jsonl"
PARAMETERS = ("steps", "seed", "rate", "shared_prefix", "prompt_median", "prompt_sigma", "max_prompt", "output_median",
              "output_sigma", "max_output", "budget", "chunk", "max_running", "warmup", "every")
"""The options that decide the trace (all but --out), written into its header."""


@dataclass
class Request:
    prompt: int
    """Tokens of the prompt after the shared prefix (computed by the request's prefill)."""
    output: int
    """Tokens the request generates (the first one by its last prefill chunk)."""
    prefilled: int = 0
    generated: int = 0


def lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))


def poisson(rng: random.Random, rate: float) -> int:
    """Knuth's method (rates of a few a step)."""
    limit, n, p = math.exp(-rate), 0, rng.random()
    while p > limit:
        n += 1
        p *= rng.random()
    return n


def simulate(args) -> list[tuple[int, list[list[int]]]]:
    """The sampled steps: (step number, its [new, keys] requests)."""
    rng = random.Random(args.seed)
    waiting: collections.deque[Request] = collections.deque()
    running: list[Request] = []
    sampled = []
    last = args.warmup + args.every * args.steps
    shared = args.shared_prefix  # in every request's cache before its first chunk
    for step in range(1, last + 1):
        for _ in range(poisson(rng, args.rate)):
            waiting.append(Request(prompt=lognormal(rng, args.prompt_median, args.prompt_sigma, 16, args.max_prompt),
                                   output=lognormal(rng, args.output_median, args.output_sigma, 1, args.max_output)))
        budget, batch = args.budget, []
        for r in running:  # running first: decodes, then the next chunk of prompts still prefilling
            if budget <= 0:
                break
            if r.prefilled < r.prompt:
                chunk = min(r.prompt - r.prefilled, args.chunk, budget)
                r.prefilled += chunk
                batch.append((r, [chunk, shared + r.prefilled]))
                budget -= chunk
            else:
                batch.append((r, [1, shared + r.prompt + r.generated]))
                budget -= 1
        while waiting and budget > 0 and len(running) < args.max_running:  # then admit, first come first served
            r = waiting.popleft()
            chunk = min(r.prompt, args.chunk, budget)
            r.prefilled = chunk
            running.append(r)
            batch.append((r, [chunk, shared + chunk]))
            budget -= chunk
        for r, _ in batch:  # a decode, or a prompt's last chunk, generates a token
            if r.prefilled == r.prompt:
                r.generated += 1
        running = [r for r in running if r.generated < r.output]
        if step > args.warmup and (step - args.warmup) % args.every == 0:
            sampled.append((step, [pair for _, pair in batch]))
    return sampled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSONL file to write (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=40, help="steps written (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of arrivals and lengths (default: %(default)s)")
    ap.add_argument("--rate", type=float, default=1.0, help="requests arriving a step, on average (default: %(default)s)")
    ap.add_argument("--shared-prefix", type=int, default=1024, help="tokens of a system prompt every prompt begins "
                    "with, cached once (default: %(default)s)")
    ap.add_argument("--prompt-median", type=int, default=1024, help="median prompt tokens after the shared prefix "
                    "(default: %(default)s)")
    ap.add_argument("--prompt-sigma", type=float, default=1.1, help="log-normal sigma of prompts (default: %(default)s)")
    ap.add_argument("--max-prompt", type=int, default=32768, help="longest prompt (default: %(default)s)")
    ap.add_argument("--output-median", type=int, default=128, help="median output tokens (default: %(default)s)")
    ap.add_argument("--output-sigma", type=float, default=1.0, help="log-normal sigma of outputs (default: %(default)s)")
    ap.add_argument("--max-output", type=int, default=4096, help="longest output (default: %(default)s)")
    ap.add_argument("--budget", type=int, default=8192, help="tokens computed a step (default: %(default)s)")
    ap.add_argument("--chunk", type=int, default=2048, help="most tokens of one prefill chunk (default: %(default)s)")
    ap.add_argument("--max-running", type=int, default=256, help="most requests running (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=600, help="steps simulated before the first written (default: "
                    "%(default)s)")
    ap.add_argument("--every", type=int, default=5, help="write one step in this many (default: %(default)s)")
    args = ap.parse_args(argv)
    for name in ("steps", "prompt_median", "max_prompt", "output_median", "max_output", "budget", "chunk",
                 "max_running", "every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.shared_prefix < 0 or not args.rate > 0 or args.prompt_sigma < 0 or args.output_sigma < 0:
        ap.error("--warmup and --shared-prefix must be >= 0, --rate > 0 and the sigmas >= 0")

    steps = simulate(args)
    options = " ".join(f"--{name.replace('_', '-')} {getattr(args, name):g}" if isinstance(getattr(args, name), float)
                       else f"--{name.replace('_', '-')} {getattr(args, name)}" for name in PARAMETERS)
    header = (f"# made by: python3 benchmarks/make_trace.py {options}: {len(steps)} steps of a simulated "
              f"continuous-batching server (Poisson arrivals, a shared prefix of {args.shared_prefix} tokens cached "
              "once in front of log-normal prompts, log-normal output lengths, a token budget a step with chunked "
              "prefill), one step a line, each request [new tokens, keys]")
    lines = [header] + [json.dumps({"name": f"step {n}", "requests": reqs}, separators=(",", ":"))
                        for n, reqs in steps]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    requests = [r for _, reqs in steps for r in reqs]
    prefill = sum(1 for new, _ in requests if new > 1)
    print(f"wrote {args.out}: {len(steps)} steps, {len(requests)} requests ({prefill} prefill chunks), "
          f"{args.out.stat().st_size // 1024} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
