"""Serving batches: one inference-server step as a case — the grammar, trace files and tree masks.

A batch is a list of requests, each with its **new** tokens (the queries: a prefill chunk, one decode token,
or a few speculative tokens) and its **keys**: every token of the request's KV cache once the new ones are
appended (so keys >= new). Inside a request the mask is causal and aligned to the lower right, as a server's
is: new token ``i`` of ``q`` sees the ``kv - q`` cached tokens and the new tokens up to itself.

The grammar is vLLM's attention-benchmark spelling, widened:

    q2k              one prefill of 2048 tokens (keys = new tokens)
    8q1kv1k          8 decodes of 1 token over 1024 keys
    2q2k_32q1kv1k    2 prefills and 32 decodes in one batch (groups joined by '_', '+' or spaces)
    128q1kv1k..32k   128 decodes, each over a number of keys drawn uniformly from 1k..32k (seeded)
    4q1kv[1k,8k]     4 decodes over 1k, 8k, 1k, 8k keys (a list is used in turn)
    2x(q2k,kv4k)     the same group, spelled with a count, 'x' and brackets

``k`` multiplies by 1024 and ``m`` by 1024², as in vLLM (``s`` is accepted for ``kv``, its older spelling).
A batch becomes an ``AttnSpec`` of one group of requests (``seqlens_q`` = new tokens, ``seqlens_k`` = keys,
causal); the features of a serving step are fields of the spec: ``page_size``, ``shared_prefix``, ``tree``
and ``kv_dtype``.

**Trace files** (``--trace FILE``) replay many batches as a sweep: JSON (a list of batches) or JSONL (one
batch a line). A batch is ``{"requests": [[new, keys], ...]}`` (or ``[{"q": new, "kv": keys}, ...]``, or
``{"batch": "2q2k_32q1kv1k"}`` in the grammar) with an optional ``"name"``. ``benchmarks/make_trace.py``
writes ``examples/serving-trace.jsonl``.

**Tree masks** (speculative decoding with a tree of draft tokens): ``tree`` lists each new token's parent
among the new tokens (-1: the request's last cached token), in topological order (a parent before its
children). New token ``i`` sees every cached token and its ancestors among the new tokens, itself included.
A chain ``-1,0,1,2`` is the causal mask.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_REQUESTS = 65536
"""Most requests in one batch (a server's step holds a few thousand at most)."""
MAX_TRACE_BYTES = 64 * 2**20
"""Largest trace file: a batch is a line of a few kilobytes (a megabyte at ``MAX_REQUESTS``), and each one is a
case of the sweep, so 64 MiB is far more steps than a sweep runs."""

_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2}
_NUM = r"\d+[km]?"
_GROUP = re.compile(
    rf"""^(?P<count>\d+)?\s*(?:x\s*)?\(?\s*q(?P<q>{_NUM})\s*,?\s*
         (?:(?:kv|s)\s*(?P<kv>{_NUM}(?:\.\.{_NUM})?|\[{_NUM}(?:\s*,\s*{_NUM})*\]))?\s*\)?$""",
    re.IGNORECASE | re.VERBOSE)


def tokens(text: str) -> int:
    """``'2k'`` -> 2048, ``'17'`` -> 17 (the grammar's numbers)."""
    text = text.strip().lower()
    unit = text[-1] if text[-1] in "km" else ""
    return int(text[:len(text) - len(unit)]) * _UNITS[unit]


@dataclass(frozen=True)
class Batch:
    """Requests of one serving step: (new tokens, keys) each, in order."""

    requests: tuple[tuple[int, int], ...]
    name: str = ""
    """What the batch is called (the grammar text, or a trace's name)."""
    traced: bool = False
    """Read from a trace: ``name`` is the step's (given, or "batch N"), which its records carry."""

    @property
    def seqlens_q(self) -> tuple[int, ...]:
        return tuple(q for q, _ in self.requests)

    @property
    def seqlens_k(self) -> tuple[int, ...]:
        return tuple(kv for _, kv in self.requests)


def parse_batch(text: str, seed: int = 0) -> Batch:
    """A batch from the grammar (module doc); ValueError naming the part that cannot be read."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty batch: give groups like 2q2k_32q1kv1k")
    if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
        raise ValueError(f"unbalanced brackets in batch {text!r}")
    rng = random.Random(seed)
    requests: list[tuple[int, int]] = []
    for part in _split(text):
        m = _GROUP.match(part)
        if m is None:
            raise ValueError(f"cannot read {part!r} in batch {text!r}: expected [count]q<new>[kv<keys>], e.g. "
                             "8q1kv1k, 128q1kv1k..32k, 4q1kv[1k,8k] or 2x(q2k,kv4k)")
        count = int(m["count"]) if m["count"] else 1
        new = tokens(m["q"])
        if count < 1 or new < 1:
            raise ValueError(f"{part!r} in batch {text!r}: counts and lengths must be positive")
        if len(requests) + count > MAX_REQUESTS:
            raise ValueError(f"batch {text!r} has more than {MAX_REQUESTS} requests")
        keys = _keys(m["kv"], count, new, rng, part)
        requests += [(new, kv) for kv in keys]
    if not requests:
        raise ValueError(f"empty batch {text!r}: give groups like 2q2k_32q1kv1k")
    return Batch(tuple(requests), name=text.strip())


def _split(text: str) -> list[str]:
    """Groups of a batch: split on '_', '+' and spaces outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if depth == 0 and ch in "_+ \t":
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _keys(spec: str | None, count: int, new: int, rng: random.Random, part: str) -> list[int]:
    if spec is None:
        keys = [new] * count
    elif spec.startswith("["):
        values = [tokens(x) for x in spec[1:-1].split(",")]
        keys = [values[i % len(values)] for i in range(count)]
    elif ".." in spec:
        lo, hi = (tokens(x) for x in spec.split(".."))
        if lo > hi:
            raise ValueError(f"{part!r}: the range {spec} runs backwards")
        keys = [rng.randint(lo, hi) for _ in range(count)]
    else:
        keys = [tokens(spec)] * count
    short = [kv for kv in keys if kv < new]
    if short:
        raise ValueError(f"{part!r}: {short[0]} keys for {new} new tokens; keys count the new tokens too "
                         "(the cache after appending them), so they are at least as many")
    return keys


def describe(seqlens_q, seqlens_k) -> str:
    """Compact text of a batch's requests: runs of equal new tokens, their keys as one value or a range."""
    groups: list[list] = []
    for q, kv in zip(seqlens_q, seqlens_k, strict=True):
        if groups and groups[-1][0] == q:
            groups[-1][1].append(kv)
        else:
            groups.append([q, [kv]])
    parts = []
    for q, keys in groups:
        kv = f"{_short(min(keys))}..{_short(max(keys))}" if min(keys) != max(keys) else _short(keys[0])
        count = f"{len(keys)}" if len(keys) > 1 else ""
        parts.append(f"{count}q{_short(q)}" + ("" if kv == _short(q) and len(set(keys)) == 1 else f"kv{kv}"))
    return "_".join(parts)


MAX_DESCRIBED = 48
"""A batch's ``describe`` longer than this (many lengths, few repeats: packed documents) is ``counted``."""


def short_description(seqlens_q, seqlens_k, words: bool = True) -> str:
    """``describe``, or counts when the lengths have too few repeats to fold (67 documents of 67 lengths):
    "67 seqs of 524288 tokens, longest 35284" (with the keys' total when they differ); with ``words=False``
    a form without spaces for one-word labels, "67:q486..35k" (",kv..." when the keys differ)."""
    text = describe(seqlens_q, seqlens_k)
    if len(text) <= MAX_DESCRIBED:
        return text
    same = tuple(seqlens_k) == tuple(seqlens_q)
    if not words:
        return f"{len(seqlens_q)}:q{span(seqlens_q)}" + ("" if same else f",kv{span(seqlens_k)}")
    keys = "" if same else f", {sum(seqlens_k)} keys"
    return f"{len(seqlens_q)} seqs of {sum(seqlens_q)} tokens{keys}, longest {max(seqlens_q)}"


def group_label(seqlens) -> str:
    """A group of sequences as the summary's rows name it: equal lengths as a count ("8q128", the grammar of
    ``describe``), mixed lengths as a list ("77,300,1")."""
    if len(seqlens) > 1 and len(set(seqlens)) == 1:
        return describe(seqlens, seqlens)
    return ",".join(map(str, seqlens))


def span(lengths) -> str:
    """The range of ``lengths``, short: "486..35284", "4k" when they are all one."""
    low, high = min(lengths), max(lengths)
    return _short(low) if low == high else f"{_short(low)}..{_short(high)}"


def _short(n: int) -> str:
    for unit, size in (("m", 1024 ** 2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


# ---- trace files ----------------------------------------------------------------------------------
def read_trace(path: str | Path) -> list[Batch]:
    """The batches of a JSON or JSONL trace file (module doc); ValueError naming the file and line. The file is
    read only when it is a regular file of at most ``MAX_TRACE_BYTES``."""
    from attnbench.results import files
    path = Path(path)
    text = files.read_text(path, MAX_TRACE_BYTES, "trace")
    try:
        return _parse_trace(path, text)
    except RecursionError:  # [[[[...]]]]: the JSON parser's stack
        raise ValueError(f"trace {path}: nested too deeply to be a trace; a batch is {{\"requests\": "
                         "[[new, keys], ...]}") from None


def _parse_trace(path: Path, text: str) -> list[Batch]:
    stripped = text.lstrip()
    if stripped.startswith("["):  # one JSON list of batches
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
        numbered = [(f"{path}: batch {i + 1}", item) for i, item in enumerate(items)]
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                numbered.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
    if not numbered:
        raise ValueError(f"trace {path} has no batches")
    return [_trace_batch(where, item, i) for i, (where, item) in enumerate(numbered)]


def _trace_batch(where: str, item, index: int) -> Batch:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a batch is an object with \"requests\" (or \"batch\"), got {type(item).__name__}")
    name = str(item.get("name") or f"batch {index + 1}")
    if "batch" in item:
        try:
            return Batch(parse_batch(item["batch"], seed=index).requests, name=name, traced=True)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    requests = item.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ValueError(f"{where}: \"requests\" must be a non-empty list of [new, keys] pairs")
    out = []
    for r in requests:
        pair = (r.get("q"), r.get("kv")) if isinstance(r, dict) else (tuple(r) if isinstance(r, list) else None)
        if (pair is None or len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                      for x in pair) or pair[1] < pair[0]):
            raise ValueError(f"{where}: bad request {r!r}: expected [new, keys] (or {{\"q\": new, \"kv\": keys}}), "
                             "positive integers with keys >= new")
        out.append((pair[0], pair[1]))
    if len(out) > MAX_REQUESTS:
        raise ValueError(f"{where}: more than {MAX_REQUESTS} requests")
    return Batch(tuple(out), name=name, traced=True)


# ---- tree masks -----------------------------------------------------------------------------------
def parse_tree(text: str) -> tuple[int, ...]:
    """``'-1,0,0,1'`` -> the parents of the draft tokens; ValueError if it is not a tree in topological order."""
    try:
        text = str(text).replace(" ", "")
        parents = tuple(int(x) for x in text.split(",")) if text else ()
    except ValueError:
        raise ValueError(f"tree {text!r}: give each new token's parent as integers, e.g. -1,0,0,1") from None
    check_tree(parents)
    return parents


def check_tree(parents) -> None:
    if not parents:
        raise ValueError("a tree needs at least one token")
    for i, p in enumerate(parents):
        if isinstance(p, bool) or not isinstance(p, int) or not -1 <= p < i:
            raise ValueError(f"tree {list(parents)}: token {i}'s parent {p!r} must be -1 or an earlier token "
                             f"(0..{i - 1})")


def tree_keep(parents, device=None) -> torch.Tensor:
    """(n, n) bool: new token i sees new token j iff j is i or one of its ancestors."""
    import torch

    n = len(parents)
    keep = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        keep[i, i] = True
        if p >= 0:
            keep[i] |= keep[p]
    return keep.to(device) if device is not None else keep


def is_chain(parents) -> bool:
    """True when the tree is a chain (-1, 0, 1, ...): the ordinary causal mask."""
    return all(p == i - 1 for i, p in enumerate(parents))


def tree_label(parents) -> str:
    return f"tree{len(parents)}" + ("" if is_chain(parents) else f"w{max(_widths(parents))}")


def _widths(parents) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return [depth.count(d) for d in set(depth)]
