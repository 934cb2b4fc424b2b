"""P5: the same model calling the same kernel natively vs through attnbench's swap (target <= 2%).

Native: the model's attention calls F.scaled_dot_product_attention directly under
``sdpa_kernel(<kernel>)`` (how a user would pin the kernel). Swapped: the same model and inputs inside
``AttnSwap(<backend>)``, untimed hooks (timed=False) and timed (events around each call) both reported.
Steps alternate native/swapped to cancel drift; medians over ``--repeat`` steps.

GPU:  PYTHONPATH=src python3 benchmarks/e2e_native.py --model cogvideox-2b --layers 8 --backend sdpa-flash
CPU smoke: PYTHONPATH=src python3 benchmarks/e2e_native.py --model llama-tiny --device cpu --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from attnbench.models.bench import E2EConfig, build_workload
from attnbench.models.functional import SDPA_KERNELS
from attnbench.models.swap import AttnSwap


def _time(step, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cogvideox-2b")
    ap.add_argument("--backend", default="sdpa-flash", choices=sorted(SDPA_KERNELS))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kernel = getattr(SDPBackend, SDPA_KERNELS[args.backend])
    device = torch.device(args.device)
    work = build_workload(E2EConfig(model=args.model, backends=(args.backend,), device=args.device,
                                    layers=args.layers))
    with sdpa_kernel([kernel]):
        native = work.step  # no swap active: the model calls F.scaled_dot_product_attention itself

        def swapped(timed: bool):
            with AttnSwap(args.backend, timed=timed, nvtx=False) as swap:
                out = work.step()
                if timed:
                    swap.attention_ms()
            return out
        for fn in (native, lambda: swapped(False), lambda: swapped(True)):  # warm-up (autotune, allocator)
            fn()
        times = {"native": [], "swap": [], "swap_timed": []}
        for _ in range(args.repeat):
            times["native"].append(_time(native, device))
            times["swap"].append(_time(lambda: swapped(False), device))
            times["swap_timed"].append(_time(lambda: swapped(True), device))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": args.model, "layers": args.layers, "backend": args.backend, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "median_ms": med, "overhead_pct": {k: 100 * (med[k] / med["native"] - 1) for k in ("swap", "swap_timed")},
              "target_pct": 2.0}
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(result | {"samples_ms": times}, fh, indent=2)


if __name__ == "__main__":
    main()
