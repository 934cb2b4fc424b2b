"""Shared CLI pieces: argv normalisation, one-line errors, spec options, config files."""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from attnbench import features
from attnbench.features.base import BOOLEAN_WORDS, FeatureError, finite_number, shown
from attnbench.report.safe_text import SafeConsole as Console  # shows what files hold, never obeys it
from attnbench.sweep import (
    CPU_DEFAULT,
    GPU_DEFAULT,
    Sweep,
    comma_items,
    pair_seq_lens,
    parse_int,
    parse_int_list,
    parse_seq_lens,
)


def pipe_width() -> int:
    """Columns of output that goes to a pipe or a file, which people read in a terminal later: $COLUMNS,
    else 100."""
    try:
        return max(60, int(os.environ.get("COLUMNS", "100")))
    except ValueError:
        return 100


def _console(stderr: bool = False) -> Console:
    # A pipe or a file (CI logs, `| tee`) is laid out for $COLUMNS (100 by default), not rich's 80, as a
    # terminal is: tables fit, text wraps at spaces. Lines that must stay whole (a command, a markdown table
    # in a write-up's format, a log line) are printed with soft_wrap=True.
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=pipe_width())


console = _console()
err_console = _console(stderr=True)


def view_console() -> Console:
    """The console for summaries: the terminal, or one $COLUMNS (default 100) wide for a pipe or a file."""
    if console.is_terminal:
        return console
    return Console(width=summary_width(), force_terminal=False, soft_wrap=False)


def summary_width() -> int:
    """Columns the run summary is laid out for: the terminal's, or ``pipe_width`` for a pipe or a file."""
    return console.width if console.is_terminal else pipe_width()


_INVOCATION: list[str] = []


def invocation() -> list[str]:
    """The arguments of this command as main() parsed them (normalised), for a command that starts itself again."""
    return list(_INVOCATION)


def remember_invocation(argv: list[str]) -> None:
    _INVOCATION[:] = argv


def stored_command(name: str) -> str:
    """The command line a run of command ``name`` stores: ``attnbench NAME ...`` as it was typed, or, for a run
    started from Python (``attnbench.api``), ``attnbench NAME (from Python)``: views tell a verify from a timed
    run by the word after ``attnbench``."""
    for argv in (sys.argv[1:], invocation()):  # a console script's arguments, or those main() was given
        if argv[:1] == [name]:
            return shlex.join(["attnbench", *argv])
    return f"attnbench {name} (from Python)"


class UserError(ValueError):
    """Bad input from the user: reported as one line on stderr, exit status 2."""


# Options that take several values after one flag (``--seq-lens 128 256``); rewritten to repeats.
MULTI_VALUE = {"--seq-lens", "--kv-seq-lens", "--batch-size", "--q-heads", "--kv-heads", "--head-size", "--emb-dim",
               "--dtype", "--pass", "--backends", "--run", "--status", "--batch", "--page-size",
               "--shared-prefix", "--tree", "--kv-dtype",
               *(o.flags[0] for o in features.options() if o.multi)}
CAUSAL_VALUES = set(BOOLEAN_WORDS)
TRISTATE = {"--causal": "--no-causal", **{o.flags[0]: o.flags[1] for o in features.options() if o.tristate}}
"""Flags that also take 'both' (and true/false): ``--causal``, ``--causal both``, ``--no-causal``."""
ALIASES = {"--batch_size": "--batch-size", "--num_heads": "--q-heads", "--num-heads": "--q-heads",
           "--head_size": "--head-size", "--emb_dim": "--emb-dim", "--seq-len": "--seq-lens", "--seq_len": "--seq-lens",
           "--seq_lens": "--seq-lens", "--kv-seq-len": "--kv-seq-lens", "--repeats": "--repeat", "--backend": "--backends"}
"""Other spellings the write-ups' scripts use, accepted and rewritten before parsing (help shows one name)."""
ALIASED_COMMANDS = ("run", "verify", "dist")


def normalize_argv(argv: list[str]) -> list[str]:
    """Rewrite multi-value options into repeated options, and the TRISTATE flags into ``--causal both|true|false``."""
    out: list[str] = []
    aliases = ALIASES if argv and argv[0] in ALIASED_COMMANDS else {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        flag, eq, value = tok.partition("=")
        if flag in aliases:
            flag = aliases[flag]
            tok = flag + eq + value
        if tok == "--":
            out.extend(argv[i:])
            break
        negated = {no: yes for yes, no in TRISTATE.items()}
        if (flag in TRISTATE or flag in negated) and not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if flag in TRISTATE and nxt is not None and nxt.lower() in CAUSAL_VALUES:
                out += [flag, nxt.lower()]
                i += 2
                continue
            positive = flag if flag in TRISTATE else negated[flag]
            out += [positive, "true" if flag in TRISTATE else "false"]
        elif flag in TRISTATE and eq:
            out += [flag, value.lower()]
        elif flag in MULTI_VALUE:
            if eq:
                out += [flag, value]
            j = i + 1
            while j < len(argv) and (not argv[j].startswith("-") or NEGATIVE.match(argv[j])):
                out += [flag, argv[j]]
                j += 1
            if not eq and j == i + 1:
                out.append(flag)  # let the parser complain about the missing value
            i = j
            continue
        else:
            out.append(tok)
        i += 1
    return out


NEGATIVE = re.compile(r"^-\d")
"""A value that starts with a minus (a tree's ``-1,0,0,1``), not a flag."""
MAX_MESSAGE = 600
"""Longest error line (characters): an echoed input can be huge (a YAML alias bomb, a 10,000-character id)."""


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr (cut to MAX_MESSAGE characters) and exit."""
    message = " ".join(str(message).split())
    if len(message) > MAX_MESSAGE:  # keep the start (what is wrong) and the end (what to do instead)
        half = MAX_MESSAGE // 2 - 20
        message = f"{message[:half]} … ({len(message) - 2 * half} characters cut) … {message[-half:]}"
    try:
        err_console.print(f"attnbench: error: {message}", markup=False, highlight=False, soft_wrap=True)
    except OSError:  # stderr gone (a closed terminal after SIGHUP)
        pass
    raise SystemExit(code)


def env_int(name: str, default: int, *, low: int = 0) -> int:
    """RANK, WORLD_SIZE or LOCAL_RANK from the environment (torchrun's); UserError when it is not an integer."""
    from attnbench.shard import env_int as read
    try:
        return read(name, default, low=low)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def resolve_device(device: str | None) -> str:
    """Validate ``--device`` (cpu, cuda, cuda:N); default cuda when available."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"bad --device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"bad --device {device!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA/ROCm device is available to torch {torch.__version__}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"--device {device}: only {torch.cuda.device_count()} device(s) present")
    return str(dev)


def load_config(path: Path | None) -> dict:
    """YAML mapping of option names (as in the CLI, dashes or underscores) to values."""
    if path is None:
        return {}
    import yaml

    from attnbench.results import files
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(files.read_text(path, files.MAX_CONFIG_BYTES, "--config"))
    except yaml.YAMLError as exc:
        raise UserError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except files.FileRefused as exc:
        raise UserError(str(exc)) from None
    except RecursionError:  # deeply nested flow collections ([[[[...]]]]) overflow the parser's stack
        raise UserError(f"--config {path}: nested too deeply to be a file of options; expected a mapping of option "
                        "names to values") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of option names to values")
    if _too_big(data, MAX_CONFIG_VALUES):
        raise UserError(f"--config {path}: expands to more than {MAX_CONFIG_VALUES:,} values (nested YAML aliases?); "
                        "give the values without nesting aliases")
    out: dict = {}
    spelled: dict = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        name = CONFIG_ALIASES.get(name, name)
        if name in out:
            raise UserError(f"--config {path}: {shown(str(spelled[name]))} and {shown(str(key))} set the same option; "
                            "give it once")
        out[name], spelled[name] = value, key
    return out


MAX_CONFIG_VALUES = 100_000
"""Most values a config file may hold once its YAML aliases are expanded (a few nested anchors make billions)."""


def _too_big(data, limit: int) -> bool:
    """Does ``data`` hold more than ``limit`` values, counting shared (aliased) ones each time they appear?"""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


# YAML keys that read naturally but differ from the parameter names.
CONFIG_ALIASES = {"causal": "causal_mode", "pass": "pass_", "passes": "pass_", "repeats": "repeat",
                  "seq_len": "seq_lens", "kv_seq_len": "kv_seq_lens", "num_heads": "q_heads", "backend": "backends"}


def check_known(names, allowed: set[str], where: str) -> None:
    """UserError naming each of ``names`` (option names) that is not ``allowed``, with the nearest allowed one: a
    misspelt option would otherwise be dropped without a word."""
    import difflib
    unknown = sorted(set(names) - allowed)
    if unknown:
        near = [m for name in unknown for m in difflib.get_close_matches(name, allowed, n=1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown key(s) in {where}: {', '.join(unknown)}{hint}; allowed: {', '.join(sorted(allowed))}")


def merge_options(ctx: typer.Context, config: dict, allowed: set[str]) -> dict:
    """Config values, overridden by options given explicitly on the command line."""
    check_known(config, allowed, "config")
    merged = dict(config)
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        explicit = source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
        if explicit or name not in merged:
            # an option not given is unset (None), whatever empty default the parser filled in
            merged[name] = value if explicit or not isinstance(value, (list, tuple)) or value else None
    return merged


def _as_list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in (item if isinstance(item, (list, tuple)) else [item])] or None
    return [value]


def parse_causal(value, flag: str = "--causal") -> tuple[bool, ...] | None:
    """A tri-state flag's value (``--causal``): both, true or false; None if unset."""
    from attnbench.features.base import tristate
    try:
        return tristate(value, flag)
    except FeatureError as exc:
        raise UserError(str(exc)) from None


def parse_windows(value) -> tuple[tuple[int, int] | None, ...] | None:
    """``--window`` values (repeatable; YAML: one value or a list): each LEFT,RIGHT or none; None if unset."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        value = [value]  # YAML's window: [256, 0] is one window
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        return None
    return tuple(dict.fromkeys(parse_window(v) for v in values))


def parse_scale(value) -> float | None:
    """``--softmax-scale``: a finite number > 0; None if unset."""
    if value is None:
        return None
    scale = finite_number(value)
    if not (math.isfinite(scale) and scale > 0):
        raise UserError(f"bad --softmax-scale {shown(value)}: give a finite number > 0, e.g. 0.0833 for 1/sqrt(144)")
    return scale


def parse_decay_bound(value) -> float | None:
    """``--decay-bound``: a finite negative number (the lowest log-decay); None if unset."""
    if value is None:
        return None
    bound = finite_number(value)
    if not (math.isfinite(bound) and -1e3 <= bound < 0):
        raise UserError(f"bad --decay-bound {shown(value)}: give the lowest log-decay, a negative number such as -5")
    return bound


def parse_window(value) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    parts = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        left, right = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise UserError(f"bad --window {shown(value)}: give LEFT,RIGHT like 256,0 (-1 = unbounded)") from None
    if not all(-1 <= side <= MAX_WINDOW for side in (left, right)):
        raise UserError(f"bad --window {shown(value)}: each side must be -1 (unbounded) or 0..{MAX_WINDOW}")
    return left, right


MAX_WINDOW = 2**31 - 1
"""Kernels take window sides as 32-bit ints."""


def axis_values(opts: dict, name: str, *, groups: bool = False) -> list | None:
    """The values of a sweep axis (None if unset): a scalar or a list of scalars; with ``groups``
    an inner list is one grouped batch (``[[128, 128], 256]``). UserError for empty or nested values."""
    value = opts.get(name)
    if value is None:
        return None
    out = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if groups and isinstance(item, (list, tuple)) and item and all(_is_scalar(x) for x in item):
            out.append(",".join(str(x) for x in item))
        elif _is_scalar(item):
            out.append(item)
        else:
            raise UserError(f"bad {flag_name(name)} {value!r}: expected a value or a list of values")
    if not out:
        raise UserError(f"bad {flag_name(name)} {value!r}: empty; give at least one value")
    return out


def _is_scalar(value) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def build_sweep(opts: dict, device: str) -> Sweep:
    """Turn merged option values into a Sweep; missing axes come from the device's default sweep."""
    base = GPU_DEFAULT if device.startswith("cuda") else CPU_DEFAULT
    try:
        serving = serving_axes(opts)
        batches = serving.pop("batches")
        if batches is not None:
            base = SERVING_DEFAULT
        seq = axis_values(opts, "seq_lens", groups=True)
        kv_seq = axis_values(opts, "kv_seq_lens", groups=True)
        emb = axis_values(opts, "emb_dim")
        heads = axis_values(opts, "q_heads")
        kv = axis_values(opts, "kv_heads")
        batch = axis_values(opts, "batch_size")
        head_size = axis_values(opts, "head_size")
        dtypes = axis_values(opts, "dtype")
        passes = axis_values(opts, "pass_")
        layout = option_text(opts, "layout")
        axes = features.settings(opts)
        q_heads = tuple(parse_int_list(heads, "q-heads")) if heads else base.q_heads
        seq_lens = parse_seq_lens([str(s) for s in seq]) if seq else list(base.seq_lens)
        kv_seq_lens = None
        if kv_seq:
            keys = parse_seq_lens([str(s) for s in kv_seq], "--kv-seq-lens")
            seq_lens, kv_seq_lens = pair_seq_lens(seq_lens, keys)
        if batches is not None:
            given = [flag for flag, value in (("--seq-lens", seq), ("--kv-seq-lens", kv_seq), ("--batch-size", batch))
                     if value]
            if given:
                raise UserError(f"--batch / --batch-trace give each request's lengths: drop {', '.join(given)}")
        mla = option_bool(opts, "mla")
        head_v = option_text(opts, "head_size_v")
        if mla:  # DeepSeek-V3's absorbed decode unless told otherwise: rows of 512 + 64, one KV head, forward
            head_size = head_size or ["576"]
            head_v = head_v or "512"
            kv = kv or ["1"]
            passes = passes or ["fwd"]
        if any(v not in (None, 0) for key in INFERENCE_AXES for v in serving.get(key, ())):
            passes = passes or ["fwd"]  # a page size, a prefix, a tree or an fp8 cache: forward only, so the default
        return Sweep(
            batches=batches, **serving, mla=mla,
            head_size_v=parse_int(head_v, "--head-size-v") if head_v else None,
            batch_sizes=tuple(parse_int_list(batch, "batch size")) if batch else base.batch_sizes,
            seq_lens=tuple(seq_lens), kv_seq_lens=tuple(kv_seq_lens) if kv_seq_lens else None,
            q_heads=q_heads,
            kv_heads=tuple(parse_int_list(kv, "kv-heads")) if kv else None,
            head_sizes=tuple(parse_int_list(head_size, "head size")) if head_size else base.head_sizes,
            emb_dims=tuple(parse_int_list(emb, "emb_dim")) if emb else None,
            dtypes=tuple(str(d) for d in dtypes) if dtypes else base.dtypes,
            causal=parse_causal(opts.get("causal_mode")) or base.causal,
            passes=tuple(str(p) for p in passes) if passes else base.passes,
            windows=parse_windows(opts.get("window")) or base.windows,
            layout=layout or base.layout,
            scale=parse_scale(opts.get("softmax_scale")),
            features={**base.features, **axes},
        )
    except UserError:
        raise
    except ValueError as exc:  # FeatureError included
        raise UserError(str(exc)) from None


OPS = {"attention": "attention", "gdn": "recurrence", "kda": "recurrence", "mamba2": "recurrence",
       "linear": "recurrence", "sparse-mla": "sparse-mla", "indexer": "indexer"}
"""--op values -> the operator of their cases (``attnbench.operators``)."""


def operator_choice(opts: dict) -> str:
    """--op (default attention), checked."""
    value = option_text(opts, "op")
    value = "attention" if value is None else value  # --op '' is a bad value, not the default
    if value not in OPS:
        raise UserError(f"bad --op {shown(value)}; allowed: {', '.join(OPS)}")
    wrong = [flag for flag, name, owners in OPERATOR_FLAGS
             if OPS[value] not in owners and opts.get(name) not in (None, False, [], ())]
    if wrong:  # an option no case of this --op reads would be silently ignored
        raise UserError(f"{', '.join(wrong)} belong{'s' * (len(wrong) == 1)} to another --op than {value}")
    return value


OPERATOR_FLAGS = (("--v-heads", "v_heads", ("recurrence",)), ("--chunk", "chunk", ("recurrence",)),
                  ("--qk-prenormed", "qk_prenormed", ("recurrence",)),
                  ("--decay-bound", "decay_bound", ("recurrence",)),
                  ("--decode", "decode", ("recurrence", "sparse-mla")),
                  ("--kv-seq-lens", "kv_seq_lens", ("attention", "sparse-mla", "indexer")),
                  ("--topk", "topk", ("sparse-mla", "indexer")),
                  ("--indices", "indices", ("sparse-mla",)), ("--sink", "sink", ("sparse-mla",)),
                  ("--topk-lengths", "topk_lengths", ("sparse-mla",)), ("--extra-cache", "extra_cache", ("sparse-mla",)),
                  ("--empty-slots", "empty_slots", ("sparse-mla",)),
                  ("--repeated-slots", "repeated_slots", ("sparse-mla",)),
                  ("--initial-state", "initial_state", ("recurrence",)))
"""The options of other operators than attention (and the key lengths, which attention takes too), and the
operators that take each."""
ATTENTION_ONLY = ("kv_heads", "emb_dim", "causal_mode", "window", "softmax_scale", "layout", "batch", "batch_trace",
                  "page_size", "shared_prefix", "tree", "kv_dtype", "mla", "input_scale", "outliers")
"""Options that shape attention cases alone: refused with another --op (they would be silently ignored)."""


def operator_specs(opts: dict, op: str, device: str = "cpu") -> list:
    """The cases of a run of another operator than attention (``--op gdn``, ``--op sparse-mla``): the shared axes
    parsed here, the product taken by the operator (``sweep``)."""
    from attnbench import operators
    given = [flag_name(name) for name in (*ATTENTION_ONLY, *(o.param for o in features.options()))
             if opts.get(name) not in (None, False, [], ())]
    if given:
        raise UserError(f"{', '.join(given)} shape{'s' * (len(given) == 1)} attention cases; --op {op} takes "
                        "--batch-size, --seq-lens, --q-heads, --head-size, --head-size-v, --dtype, --pass"
                        + "".join(f", {flag}" for flag, _, owners in OPERATOR_FLAGS if OPS[op] in owners))
    operator_choice({**opts, "op": op})  # the other operators' options, refused
    try:
        seq = axis_values(opts, "seq_lens", groups=True)
        kv_seq = axis_values(opts, "kv_seq_lens", groups=True)
        head_v = option_text(opts, "head_size_v")
        ints = {name: tuple(parse_int_list(values, flag_name(name))) if (values := axis_values(opts, name)) else None
                for name in ("batch_size", "q_heads", "v_heads", "head_size", "topk")}
        axes = {"batch_sizes": ints["batch_size"], "q_heads": ints["q_heads"], "v_heads": ints["v_heads"],
                "head_sizes": ints["head_size"], "head_sizes_v": (parse_int(head_v, "--head-size-v"),)
                if head_v is not None else None, "topks": ints["topk"],
                "seq_lens": [tuple(x) for x in parse_seq_lens([str(v) for v in seq])] if seq else None,
                "kv_seq_lens": one_length_each(kv_seq, "--kv-seq-lens", op) if kv_seq else None,
                "dtypes": [str(d) for d in axis_values(opts, "dtype") or []] or None,
                "passes": [str(p) for p in axis_values(opts, "pass_") or []] or None}
        chunk = option_text(opts, "chunk")
        extra = option_text(opts, "extra_cache")
        if extra is not None:
            parts = extra.lower().split("x")
            if len(parts) != 2:
                raise UserError(f"bad --extra-cache {shown(extra)}: give ROWSxTOPK, e.g. 16384x512")
            extra = (parse_int(parts[0], "--extra-cache rows"), parse_int(parts[1], "--extra-cache top-k"))
        options = {"kind": op, "decode": option_bool(opts, "decode"), "indices": option_text(opts, "indices"),
                   "chunk": parse_int(chunk, "--chunk") if chunk is not None else None,
                   "sink": option_bool(opts, "sink"),
                   "topk_length": option_bool(opts, "topk_lengths"), "extra": extra,
                   "qk_prenormed": option_bool(opts, "qk_prenormed"),
                   "invalid": parse_rate(option_text(opts, "empty_slots"), "--empty-slots"),
                   "repeats": parse_rate(option_text(opts, "repeated_slots"), "--repeated-slots"),
                   "initial_state": opts.get("initial_state"),
                   "decay_bound": parse_decay_bound(option_text(opts, "decay_bound")),
                   "small": not device.startswith("cuda")}  # a CPU's default case is a small one
        return operators.get(OPS[op]).sweep(axes, options)
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from None


def parse_rate(text: str | None, flag: str) -> float | None:
    """A fraction of slots in [0, 1) (``0.02``, ``1/64``), or None when not given."""
    if text is None:
        return None
    try:
        num, _, den = str(text).strip().partition("/")
        value = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        value = math.nan
    if not 0 <= value < 1:
        raise UserError(f"bad {flag} {shown(text)}: give a fraction of the slots in [0, 1), e.g. 0.02 or 1/64")
    return value


def one_length_each(values: list, flag: str, op: str) -> list[int]:
    """``--kv-seq-lens`` of an operator whose case has one key length: a length per case; a group (``128,64``,
    attention's batch of sequences) is refused, where taking its first length would drop the others."""
    cases = parse_seq_lens([str(v) for v in values], flag)
    group = next((c for c in cases if len(c) > 1), None)
    if group is not None:
        text = ",".join(map(str, group))
        raise UserError(f"bad {flag} {shown(text)}: --op {op} takes one length per case, not a group; give "
                        f"{flag} {' '.join(map(str, group))} for a case each")
    return [c[0] for c in cases]


Op = Annotated[str | None, typer.Option(
    "--op", metavar="OP", rich_help_panel="Operator",
    help="What is measured: attention (default); a recurrence layer: gdn (Gated DeltaNet), kda, mamba2, linear; "
         "sparse-mla (DeepSeek's top-k sparse attention over MLA rows) or indexer (its lightning indexer).")]
VHeads = Annotated[list[str] | None, typer.Option(
    "--v-heads", metavar="N", rich_help_panel="Operator",
    help="Recurrences: value heads (and state heads), a multiple of --q-heads (Qwen3-Next: 32 over 16).")]
Decode = Annotated[bool | None, typer.Option(
    "--decode", rich_help_panel="Operator",
    help="Recurrences: one new token per sequence from a state handed in; sparse MLA: FlashMLA's FP8 decode "
         "(656-byte rows, paged).")]
QkPrenormed = Annotated[bool | None, typer.Option(
    "--qk-prenormed", rich_help_panel="Operator",
    help="Recurrences (gdn, kda): q and k arrive L2-normalised, the op does not normalise them (default: it does, "
         "fla's use_qk_l2norm_in_kernel, as the models call it).")]
DecayBound = Annotated[str | None, typer.Option(
    "--decay-bound", metavar="LB", rich_help_panel="Operator",
    help="kda: the bounded decay LB·sigmoid(exp(A_log)·(a + dt_bias)), log-decays in [LB, 0) (fla's safe_gate "
         "lower_bound; cuDNN's KDA was verified with -5); default: Kimi Linear's unbounded decay.")]
Chunk = Annotated[str | None, typer.Option(
    "--chunk", metavar="C", rich_help_panel="Operator", help="Recurrences: tokens per chunk (default 64).")]
TopK = Annotated[list[str] | None, typer.Option(
    "--topk", metavar="K", rich_help_panel="Operator",
    help="Sparse MLA: slots per query; the indexer: keys it keeps per query (DeepSeek-V3.2: 2048).")]
Sink = Annotated[bool | None, typer.Option(
    "--sink", rich_help_panel="Operator", help="Sparse MLA: a per-head attention-sink logit (DeepSeek-V4).")]
TopkLengths = Annotated[bool | None, typer.Option(
    "--topk-lengths", rich_help_panel="Operator",
    help="Sparse MLA: only a drawn number of each query's first slots count (FlashMLA's topk_length; one number per "
         "request in decode).")]
ExtraCache = Annotated[str | None, typer.Option(
    "--extra-cache", metavar="ROWSxTOPK", rich_help_panel="Operator",
    help="Sparse MLA: DeepSeek-V4's second, compressed cache per request, ROWS rows with TOPK slots per query.")]
EmptySlots = Annotated[str | None, typer.Option(
    "--empty-slots", metavar="RATE", rich_help_panel="Operator",
    help="Sparse MLA: the fraction of filled slots made empty anywhere in an index list, -1 or past the cache "
         "(decode: -1) (default 1/64; 0: only the -1 of queries that see fewer keys than top-k).")]
RepeatedSlots = Annotated[str | None, typer.Option(
    "--repeated-slots", metavar="RATE", rich_help_panel="Operator",
    help="Sparse MLA: the fraction of slots that repeat another slot's row of the same query, counted twice "
         "(default 0).")]
InitialState = Annotated[bool | None, typer.Option(
    "--initial-state/--no-initial-state", rich_help_panel="Operator",
    help="Recurrences: start each sequence from a state handed in (default on: a prefill that continues a "
         "cached prefix, and the path a kernel that ignores the state gets wrong).")]
Indices = Annotated[str | None, typer.Option(
    "--indices", metavar="HOW", rich_help_panel="Operator",
    help="Sparse MLA: how each query's slots are chosen: indexer (the lightning indexer's top-k over seeded "
         "inputs; default), random, prefix or window.")]


SERVING_DEFAULT = Sweep(q_heads=(32,), kv_heads=None, head_sizes=(128,), dtypes=("bf16",), causal=(True,),
                        passes=("fwd",))
"""The axes a serving batch takes when not given: causal, forward, bf16, 32 heads of 128 (a Llama-style 8B)."""


INFERENCE_AXES = ("page_sizes", "shared_prefixes", "trees", "kv_dtypes")
"""The serving axes that make a case forward only (``AttnSpec.serving_features``): asked for, the pass defaults to
fwd."""


def serving_axes(opts: dict) -> dict:
    """--batch, --batch-trace, --page-size, --shared-prefix, --tree, --kv-dtype -> Sweep fields (the batches
    None when neither batch option is given)."""
    from attnbench import serving
    from attnbench.spec import normalize_dtype
    seed = opts.get("seed") or 0
    texts, trace = axis_values(opts, "batch"), option_text(opts, "batch_trace")
    batches = None
    if texts or trace:
        try:
            batches = [serving.parse_batch(str(t), seed=seed) for t in texts or ()]
            if trace:
                batches += serving.read_trace(trace)
        except ValueError as exc:
            raise UserError(f"bad --batch: {exc}" if texts and not trace else str(exc)) from None
    out: dict = {"batches": tuple(batches) if batches is not None else None}
    pages = axis_values(opts, "page_size")
    if pages:
        out["page_sizes"] = tuple(dict.fromkeys(
            None if str(p).lower() == "none" else n for p in pages
            for n in ([None] if str(p).lower() == "none" else parse_int_list(str(p), "--page-size"))))
    prefixes = axis_values(opts, "shared_prefix")
    if prefixes:
        out["shared_prefixes"] = tuple(dict.fromkeys(
            0 if part.strip() == "0" else parse_int(part, "--shared-prefix")
            for p in prefixes for part in comma_items(str(p), "--shared-prefix")))
    trees = axis_values(opts, "tree", groups=True)
    if trees:
        try:
            out["trees"] = tuple(dict.fromkeys(None if str(t).lower() == "none" else serving.parse_tree(str(t))
                                               for t in trees))
        except ValueError as exc:
            raise UserError(f"bad --tree: {exc}") from None
    kv = axis_values(opts, "kv_dtype")
    if kv:
        values = []
        for name in kv:
            key = str(name).lower()
            if key in ("same", "none"):
                values.append(None)
                continue
            try:
                key = normalize_dtype(key)
            except ValueError:
                key = None
            if key not in ("fp8", "fp8-head"):
                raise UserError(f"bad --kv-dtype {shown(str(name))}: fp8, fp8-head or same")
            values.append(key)
        out["kv_dtypes"] = tuple(dict.fromkeys(values))
    return out


def positive_int(value, name: str) -> int:
    try:
        n = parse_int(str(value), name)
    except ValueError:
        raise UserError(f"bad {name} {value!r}: expected a positive integer") from None
    return n


MAX_REPEAT = 100_000
"""Largest --warmup / --repeat: more would look like a hang."""
MAX_SEED = 2**63 - 1
"""Seeds are stored as SQLite INTEGERs."""


def check_db_path(path: Path) -> Path:
    """--db must be a file or a path where one can be created. What the file holds is the store's to check
    (ResultStore refuses anything but an attnbench store, before writing; planning opens it)."""
    if path.is_dir():
        raise UserError(f"bad --db {str(path)!r}: it is a directory; give a file path like results.db")
    if path.exists() and not path.is_file():
        raise UserError(f"bad --db {str(path)!r}: not a regular file; give a file path like results.db")
    return path


MAX_WAIT_S = 7 * 86400.0
"""Longest wait a user may set (--case-timeout, dist --timeout): a week; more overflows the timers underneath."""


def check_output_path(path: Path, flag: str = "--output", stores: tuple[Path, ...] = ()) -> Path:
    """--output's folder must exist, and the file may not be a database or the store the command writes
    (``files.check_output``): checked before running, not after."""
    from attnbench.results import files
    if path.is_dir() or not path.parent.is_dir():
        raise UserError(f"bad {flag} {str(path)!r}: expected a file in an existing folder")
    try:
        return files.check_output(path, flag, stores=stores)
    except files.FileRefused as exc:
        raise UserError(str(exc)) from None


def write_output(records: list, output: Path, db: Path, run_id: str) -> None:
    """``--output`` of a command whose records are already stored: an output that cannot be written (a full
    disk) is one line that also says the records are safe in the store and how to export them once it can be
    written (the line alone read as if the run were lost)."""
    from attnbench.results import export, files
    try:
        export.write(records, output)
    except files.FileRefused as exc:
        n = len(records)
        raise files.FileRefused(f"{exc}; the {n} record{'s' * (n != 1)} of run {run_id} are stored in {db}: "
                                f"{shlex.join(['attnbench', 'export', '--run', run_id, '--db', str(db), '-o', str(output)])} "
                                "writes them") from None


def flag_name(name: str) -> str:
    """Parameter name -> the flag a user types (``pass_`` -> ``--pass``, ``causal_mode`` -> ``--causal``)."""
    return "--causal" if name == "causal_mode" else "--" + name.rstrip("_").replace("_", "-")


def option_text(opts: dict, name: str) -> str | None:
    """One scalar option value as text (None if unset); UserError for a list or a mapping."""
    value = opts.get(name)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise UserError(f"bad {flag_name(name)} {value!r}: expected one value, not a {type(value).__name__}")


def option_int(opts: dict, name: str, lo: int, hi: int, *, default: int) -> int:
    """An integer option in lo..hi (YAML may give a string like '16k'); UserError otherwise."""
    value = opts.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UserError(f"bad {flag_name(name)} {value!r}: expected an integer in {lo}..{hi}")
    if isinstance(value, str):
        try:
            value = 0 if value.strip() == "0" else parse_int(value, flag_name(name))
        except ValueError:
            raise UserError(f"bad {flag_name(name)} {value!r}: expected an integer in {lo}..{hi}") from None
    if not lo <= value <= hi:
        raise UserError(f"bad {flag_name(name)} {value!r}: expected an integer in {lo}..{hi}")
    return value


def option_bool(opts: dict, name: str, default: bool = False) -> bool:
    """A flag's value (``default`` if unset); UserError unless it is true or false (a YAML "no" in quotes is
    a string, not false: refused rather than read as true)."""
    value = opts.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UserError(f"bad {flag_name(name)} {shown(value)}: expected true or false")
    return value


# ---- reusable option declarations (one place for names, aliases and help) -----------------------
Device = Annotated[str | None, typer.Option("--device", metavar="DEVICE", help="cpu, cuda or cuda:N (default: cuda if available).",
                                            rich_help_panel="Backends")]
Backends = Annotated[list[str] | None, typer.Option(
    "--backends", metavar="NAME,...", rich_help_panel="Backends", help="Backends to run, comma separated or repeated (default: all available).")]
SkipMissing = Annotated[bool, typer.Option(
    "--skip-missing", rich_help_panel="Backends",
    help="Record named backends that cannot run here as unsupported, with the reason, instead of refusing the run "
         "(for scripts that name every kernel they know).")]
BatchSize = Annotated[list[str] | None, typer.Option("--batch-size", metavar="N", help="Batch size(s).", rich_help_panel="Shape")]
QHeads = Annotated[list[str] | None, typer.Option("--q-heads", metavar="N", help="Query heads (also --num_heads).", rich_help_panel="Shape")]
KvHeads = Annotated[list[str] | None, typer.Option("--kv-heads", metavar="N", help="Key/value heads (GQA/MQA); default = q-heads.", rich_help_panel="Shape")]
HeadSize = Annotated[list[str] | None, typer.Option("--head-size", metavar="D", help="Head size(s).", rich_help_panel="Shape")]
HeadSizeV = Annotated[str | None, typer.Option(
    "--head-size-v", metavar="DV", rich_help_panel="Shape",
    help="Value head size, when it differs from the head size (DeepSeek-V3's prefill: --head-size 192 --head-size-v 128).")]
Mla = Annotated[bool | None, typer.Option(
    "--mla", rich_help_panel="Shape",
    help="MLA decode with absorbed weights (DeepSeek-V3): rows of 576 (latent 512 + rope 64), one KV head, the value "
         "the latent part; head sizes and KV heads default to those.")]
EmbDim = Annotated[list[str] | None, typer.Option(
    "--emb-dim", metavar="N", help="Embedding dim(s); head size = emb-dim / q-heads (benchmark_attn.py's --emb_dim).",
    rich_help_panel="Shape")]
Dtype = Annotated[list[str] | None, typer.Option(
    "--dtype", metavar="DTYPE", rich_help_panel="Shape",
    help="fp16, bf16, fp32 (or fp64); fp8 / fp8-head: e4m3 inputs with one descale per tensor / per KV head.")]
CausalMode = Annotated[str | None, typer.Option(
    "--causal", "--no-causal", metavar="[both]", show_default=False, rich_help_panel="Shape",
    help="--causal, --no-causal or --causal both (default: both).")]
Window = Annotated[list[str] | None, typer.Option(
    "--window", metavar="LEFT,RIGHT", rich_help_panel="Shape",
    help="Sliding window LEFT,RIGHT (-1 = unbounded), or none; repeat it for several (a model's local and full layers).")]
SoftmaxScale = Annotated[str | None, typer.Option(
    "--softmax-scale", metavar="X", rich_help_panel="Shape", help="Softmax scale (default: 1/sqrt(head size)).")]
Preset = Annotated[str | None, typer.Option(
    "--preset", metavar="MODEL", rich_help_panel="Model variants",
    help="A model's attention layers (heads, head size, variants, windows); see attnbench presets.")]
BatchSpec = Annotated[list[str] | None, typer.Option(
    "--batch", metavar="REQUESTS", rich_help_panel="Serving batches",
    help="One inference step's requests, each value a case: 2q2k_32q1kv1k (2 prefills of 2k, 32 decodes over 1k "
         "keys), 128q1kv1k..32k (keys drawn with --seed), 4q1kv[1k,8k]. Keys count the new tokens.")]
BatchTrace = Annotated[Path | None, typer.Option(
    "--batch-trace", metavar="FILE", rich_help_panel="Serving batches",
    help=escape("Replay the batches of a JSON/JSONL trace (each line: {\"requests\": [[new, keys], ...]}) as a "
                "sweep."))]  # help is rich markup: [new, keys] would be read as a tag and dropped
PageSize = Annotated[list[str] | None, typer.Option(
    "--page-size", metavar="N", rich_help_panel="Serving batches",
    help="Tokens a KV cache page holds (an axis: 1 16 64; none = no pages); cases with one run on paged kernels.")]
SharedPrefix = Annotated[list[str] | None, typer.Option(
    "--shared-prefix", metavar="N", rich_help_panel="Serving batches",
    help="The first N keys of every request are one shared prefix, stored once (an axis; 0 = none).")]
Tree = Annotated[list[str] | None, typer.Option(
    "--tree", metavar="PARENTS", rich_help_panel="Serving batches",
    help="Speculative tree: each new token's parent among the new tokens, -1 = the cache, e.g. -1,0,0,1 (or none).")]
KvDtype = Annotated[list[str] | None, typer.Option(
    "--kv-dtype", metavar="DTYPE", rich_help_panel="Serving batches",
    help="KV cache element type: fp8 / fp8-head (e4m3, a descale per tensor / per KV head) or same (= --dtype).")]
Passes = Annotated[list[str] | None, typer.Option("--pass", metavar="PASS", help="fwd, bwd, fwd_bwd (repeatable).", rich_help_panel="Shape")]
SeqLens = Annotated[list[str] | None, typer.Option(
    "--seq-lens", metavar="LENS", rich_help_panel="Shape",
    help="Each value one case; 128,128 = one grouped batch; 512..16k:x2 = a range.")]
KvSeqLens = Annotated[list[str] | None, typer.Option(
    "--kv-seq-lens", metavar="LENS", rich_help_panel="Shape",
    help="Key lengths, paired in order with --seq-lens (or one for all); default: the query lengths.")]
Warmup = Annotated[int | None, typer.Option("--warmup", metavar="N", help="Untimed calls before timing (default: 10 on GPU, 2 on CPU).",
                                                rich_help_panel="Timing")]
Repeat = Annotated[int | None, typer.Option("--repeat", metavar="N", help="Timed calls per case, at least (default: 30 on GPU, 10 on CPU).",
                                                rich_help_panel="Timing")]
Config = Annotated[Path | None, typer.Option("--config", help="YAML file with the same options; flags override.", rich_help_panel="Run control")]
Db = Annotated[Path | None, typer.Option("--db", help="SQLite results file (default: attnbench-results/attnbench.db).", rich_help_panel="Output")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random inputs.", rich_help_panel="Inputs and accuracy")]
InputScale = Annotated[str | None, typer.Option(
    "--input-scale", metavar="X", rich_help_panel="Inputs and accuracy", help="Multiply q and k by X (logits by X²): large magnitudes, for overflow bugs.")]
Outliers = Annotated[str | None, typer.Option(
    "--outliers", metavar="FRACTION", rich_help_panel="Inputs and accuracy", help="Set this fraction of q, k, v elements to ±16 std (e.g. 0.001).")]


def feature_options(command):
    """Give ``command`` (run, verify, e2e) every feature's options (``Feature.options``), declared once there:
    typer reads them from the signature; the command reads their values from ``ctx.params``, or from its
    ``feature_opts`` parameter (name -> value) when it has one."""
    import functools
    import inspect

    params = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "feature_opts"]
    wants = "feature_opts" in inspect.signature(command).parameters
    extra = [inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_option_type(o))
             for o in features.options()]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        given = {o.param: kwargs.pop(o.param, None) for o in features.options()}
        if wants:  # a command that reads the values itself (e2e) gets them by parameter name
            kwargs["feature_opts"] = given
        return command(*args, **kwargs)

    wrapper.__signature__ = inspect.Signature(params + extra)
    return wrapper


def _option_type(option):
    """The typer annotation of a feature's option."""
    kind = Path if option.path else (list[str] if option.multi else str)
    return Annotated[kind | None, typer.Option(*option.flags, metavar=option.metavar, show_default=False,
                                               rich_help_panel="Model variants", help=option.help)]


def input_dist(opts: dict):
    """--input-scale / --outliers -> InputDist (UserError naming the bad value)."""
    from attnbench.inputs import InputDist
    values = {}
    for name, flag in (("input_scale", "--input-scale"), ("outliers", "--outliers")):
        raw = opts.get(name)
        if raw is None:
            continue
        try:
            values[name] = float(raw)
        except (TypeError, ValueError):
            raise UserError(f"bad {flag} {raw!r}: expected a number") from None
    try:
        return InputDist(scale=values.get("input_scale", 1.0), outliers=values.get("outliers", 0.0))
    except ValueError as exc:
        raise UserError(str(exc).replace("input scale", "--input-scale").replace("outlier fraction", "--outliers")) from None
