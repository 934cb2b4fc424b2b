"""Copy stdin to stdout, and to FILE with each line prefixed by the seconds since START (epoch s)."""
import sys
import time

start, path = float(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for line in sys.stdin:
        sys.stdout.write(line)
        f.write(f"{time.time() - start:8.2f} {line}")
        f.flush()
