"""Worker side of the gloo tests: one launch of N processes runs a list of cases, rank 0 reports.

Kept out of the test modules so that spawned children import only this small file.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

# (name, method, kernel, dtype, causal, heads_q, heads_kv, seq_len, extra)
Case = tuple


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cases: list, queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from attnbench.distributed import bench
    from attnbench.distributed import layout as lay
    from attnbench.inputs import make_inputs
    from attnbench.spec import AttnSpec

    results = {}
    try:
        ctx = bench.init_distributed("cpu", timeout_s=60)
        for name, method, kernel, dtype, causal, hq, hkv, seq, extra in cases:
            lengths = extra.get("docs", (seq,))  # several: packed documents of these lengths
            spec = AttnSpec(batch=extra.get("batch", 1), seqlens_q=lengths, heads_q=hq, heads_kv=hkv,
                            head_dim=extra.get("head_dim", 16), dtype=dtype, causal=causal, pass_="fwd_bwd")
            dense = bench.dense_inputs_spec(spec)
            try:  # "ignore_docs": a method blind to the documents, checked against the documents' result
                m = bench.build_method(method, kernel, dense if extra.get("ignore_docs") else spec, ctx,
                                       ulysses_degree=extra.get("ulysses_degree"), comm=extra.get("comm", "p2p"),
                                       ulysses_chunks=extra.get("ulysses_chunks", 1))
            except ValueError as exc:
                results[name] = {"error": str(exc)}
                continue
            idx = lay.positions(sum(lengths), m.layout, ctx.rank, ctx.world, m.ulysses_degree)
            mine = bench.check_rank(m, bench.kernel_for(kernel, spec, ctx.device), spec, make_inputs(dense), idx)
            gathered = [None] * world
            dist.all_gather_object(gathered, mine)
            results[name] = {"per_rank": gathered, "layout": m.layout}
        dist.destroy_process_group()
    except Exception:  # report, so that the test fails with the traceback instead of a timeout
        results["__error__"] = traceback.format_exc()
    if rank == 0 or "__error__" in results:
        queue.put((rank, results))


def run_cases(world: int, cases: list, timeout: float = 240.0) -> dict:
    """Run ``cases`` on ``world`` gloo processes; rank 0's results by case name."""
    # forkserver: one clean server process imports torch once and forks the workers (importing torch
    # in every spawned worker costs seconds each on small CI machines; plain fork is unsafe after
    # the test process has used OpenMP threads).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "attnbench.distributed.bench", "cp_workers"])
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, cases, queue), daemon=True) for r in range(world)]
    with _checkout_on_path():  # the server process starts with the first worker and imports this checkout
        for p in procs:
            p.start()
    try:
        rank, results = _wait_for_result(queue, procs, timeout)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if "__error__" in results:
        raise AssertionError(f"rank {rank} failed:\n{results['__error__']}")
    return results


class _checkout_on_path:
    def __enter__(self):
        here = Path(__file__).resolve()
        self.old = os.environ.get("PYTHONPATH")
        parts = [str(here.parents[2] / "src"), str(here.parent)] + ([self.old] if self.old else [])
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.old


def _wait_for_result(queue, procs, timeout: float):
    """Rank 0's report; fail fast when every worker is gone without one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs):
                codes = [p.exitcode for p in procs]
                raise AssertionError(f"workers exited without a result (exit codes {codes})") from None
    raise AssertionError(f"no result from the workers within {timeout:.0f} s")
