"""Where a run's first seconds go: each step of `attnbench run`'s start, timed in a fresh process."""
import sys
import time

t0 = time.perf_counter()
marks = []


def mark(name):
    marks.append((name, time.perf_counter()))


import torch  # noqa: E402

mark("import torch")
torch.cuda.init()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
mark("CUDA context")
import attnbench.cli  # noqa: E402,F401

mark("import attnbench.cli")
from attnbench.backends import registry  # noqa: E402

names = registry.names() if hasattr(registry, "names") else []
for name in names:
    b = registry.get(name)
    s = time.perf_counter()
    why = b.unavailable_reason()
    dt = time.perf_counter() - s
    if dt > 0.05:
        marks.append((f"  available? {name} ({'no' if why else 'yes'})", time.perf_counter()))
mark("every backend's availability")
from attnbench.results import env as envmod  # noqa: E402

envmod.collect("cuda")
mark("environment recorded")
from attnbench import plausibility  # noqa: E402

plausibility.ceilings("cuda")
mark("plausibility ceilings")
last = t0
for name, t in marks:
    print(f"{t - last:7.2f} s  {name}")
    last = t
print(f"{last - t0:7.2f} s  in all; bytecode writable: {not sys.dont_write_bytecode}; torch at {torch.__file__}")
