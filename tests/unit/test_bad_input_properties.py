"""Property-based: every invalid command line or YAML config is one line on stderr, exit status 2,
naming the bad value, with no traceback and nothing written to the store.

``attnbench.cli.main`` is called in-process (fast); ``run``'s execution is replaced by a sentinel so
an input that is accepted by mistake fails the test instead of starting a benchmark.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attnbench import cli
from attnbench.cli import run as run_cmd

# Derandomized: CI sees the same examples every time; ATTNBENCH_FUZZ=N explores N fresh ones locally.
_N = int(os.environ.get("ATTNBENCH_FUZZ", "0"))
FUZZ = settings(max_examples=_N or 25, derandomize=not _N, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
WORK = Path(tempfile.mkdtemp(prefix="attnbench-fuzz-"))
DB = WORK / "never.db"
BASE = ["--device", "cpu", "--db", str(DB), "--quiet"]
BASE_CFG = ["--db", str(DB)]  # config tests: only --db (never written) overrides the file
HINTS = ("allowed", "expected", "give", "use ", "must", "known", "at most", "no such", "not a valid", "invalid",
         "requires", "got unexpected", "drop ", "missing", "is empty", "below start", "not valid yaml",
         "divisible", "multiple of", "step", "a positive")


LAST_PLAN: list = []


class Accepted(BaseException):
    """Raised instead of running a plan: the input was accepted."""


@pytest.fixture(autouse=True)
def _no_execution(monkeypatch):
    def refuse(plan, **kwargs):
        raise Accepted(plan, kwargs)
    monkeypatch.setattr(run_cmd, "execute", refuse)


def invoke(argv, capsys) -> tuple[int | None, str]:
    capsys.readouterr()
    try:
        cli.main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code
    except Accepted as exc:
        code = "accepted"
        LAST_PLAN[:] = list(exc.args)
    return code, capsys.readouterr().err


def assert_rejected(argv, capsys, *needles) -> str:
    code, err = invoke(argv, capsys)
    assert code == 2, f"{argv!r}: exit {code!r}, stderr {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{argv!r}: {err!r}"
    line = lines[0]
    assert line.startswith("attnbench") and "Traceback" not in err
    for needle in needles:
        assert " ".join(needle.split()) in line, f"{needle!r} not named in {line!r}"
    assert any(h in line.lower() for h in HINTS), f"no hint of what is allowed in {line!r}"
    assert not DB.exists(), "an invalid input wrote the store"
    return line


def shown(value: str) -> str:
    """How a message shows a bad value: its repr, unless it is a plain word."""
    return repr(value)[1:-1]


# ---- strategies of invalid values ---------------------------------------------------------------
junk = st.text(min_size=1, max_size=12).filter(lambda s: not s.startswith("-") and s.strip() and "\x00" not in s)
negative_or_zero = st.integers(max_value=0).map(str)
huge = st.integers(min_value=2**31, max_value=10**40).map(str)
not_a_number = junk.filter(lambda s: not re.fullmatch(r"\s*\d+\s*[kKmM]?\s*", s, re.ASCII) and ".." not in s
                           and "," not in s)
bad_int = st.one_of(negative_or_zero, huge, not_a_number,
                    st.floats(allow_nan=True).map(repr), st.sampled_from(["1.5", "1e3", "0x10", "1_000", "١٢", "１６"]))
bad_range = st.one_of(
    st.builds(lambda a, b: f"{a}..{b}", st.integers(2, 10**6), st.integers(1, 10**6)).filter(
        lambda s: int(s.split("..")[0]) > int(s.split("..")[1])),
    st.builds(lambda a, step: f"{a}..{a * 4}:x{step}", st.integers(1, 100), st.sampled_from(["0", "1"])),
    st.builds(lambda a: f"{a}..{a * 4}:+0", st.integers(1, 100)),
    st.builds(lambda a, op: f"{a}..{a * 4}:{op}2", st.integers(1, 100), st.sampled_from(["y", "/", "-", "^"])),
    st.sampled_from(["..", "1..", "..5", "1...5", "1..5:", "1..5:x", "k..m", "1..1m:+1", "16..16m:+3", "1..8:x2:x2"]),
)
SCALAR_FLAGS = {  # flag -> strategy of values it must reject
    "--dtype": junk.filter(lambda s: s.strip().lower() not in {
        "fp16", "bf16", "fp32", "fp64", "float16", "half", "bfloat16", "float32", "float", "float64", "double"}),
    "--pass": junk.filter(lambda s: s.strip() not in {"fwd", "bwd", "fwd_bwd"}),
    "--backends": junk.filter(lambda s: s.strip(", ") and not set(map(str.strip, s.split(","))) <= {
        "naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", ""}),
    # cuda and cuda:N are names of devices: run on a GPU host, refused on another for want of one
    "--device": junk.filter(lambda s: s.strip() not in {"cpu", "cpu:0"} and not re.fullmatch(r"cuda(:\d+)?", s.strip())),
    "--window": junk.filter(lambda s: not re.fullmatch(r"-?\d+,-?\d+", s.strip()) and s.strip() not in ("none", "")),
    "--flops-convention": junk.filter(lambda s: s not in {"exact", "dense"}),
    "--impl": junk.filter(lambda s: s.lower() not in {"pytorch", "flash2"}),
    "--profiler": junk.filter(lambda s: s != "none"),
    "--output": junk.filter(lambda s: not s.lower().endswith((".json", ".csv", ".parquet"))),
}
INT_AXES = ["--batch-size", "--q-heads", "--kv-heads", "--head-size", "--emb-dim"]


@FUZZ
@given(flag=st.sampled_from(sorted(SCALAR_FLAGS)), data=st.data())
def test_run_rejects_bad_scalar_values(capsys, flag, data):
    value = data.draw(SCALAR_FLAGS[flag])
    assume(not value.startswith("-"))
    assert_rejected(["run", *BASE, flag, value], capsys)


@FUZZ
@given(flag=st.sampled_from(INT_AXES), value=bad_int)
def test_run_rejects_bad_integer_axes(capsys, flag, value):
    line = assert_rejected(["run", *BASE, flag, value], capsys)
    assert shown(value.strip()) in line or value.strip() in line


@FUZZ
@given(value=st.one_of(bad_int, bad_range, st.sampled_from(["", " ", ",", ",,", "1,,x", "16,-4", "0,16"])))
def test_run_rejects_bad_seq_lens(capsys, value):
    assert_rejected(["run", *BASE, "--seq-lens", value], capsys)


@FUZZ
@given(flag=st.sampled_from(["--warmup", "--repeat", "--seed", "--case-timeout"]),
       value=st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=2**63, max_value=10**30).map(str),
                       st.sampled_from(["abc", "1.5x", "nan", "inf", "-inf", "", "0x", "１"])))
def test_run_rejects_bad_numbers(capsys, flag, value):
    assume(not (flag == "--case-timeout" and value.isdigit() and int(value) > 0))
    assume(not (flag in ("--warmup", "--repeat", "--seed") and value in ("１",)))
    assert_rejected(["run", *BASE, f"{flag}={value}"], capsys)


def test_huge_but_valid_values_fail_fast_instead_of_hanging(capsys):
    for argv, needle in [(["--seq-lens", "1..1m:+1"], "1..1m:+1"),
                         (["--seq-lens", "1..4k:+1", "--head-size", "1..64:+1"], "cases"),
                         (["--batch-size", "99999999999999999999"], "99999999999999999999"),
                         (["--repeat", "10000000000"], "10000000000"),
                         (["--seq-lens", "2147483647", "--batch-size", "2"], "tokens")]:
        assert_rejected(["run", *BASE, *argv], capsys, needle)


# ---- YAML configs -------------------------------------------------------------------------------
KEYS = ["device", "backends", "batch_size", "q_heads", "kv_heads", "head_size", "emb_dim", "dtype", "causal",
        "window", "pass", "seq_lens", "warmup", "repeat", "warm_l2", "flops_convention", "profiler", "impl",
        "output", "seed", "isolate", "case_timeout", "quiet"]
yaml_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                        st.text(max_size=8))
yaml_value = st.recursive(yaml_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=2)), max_leaves=5)


def write_yaml(data) -> Path:
    path = WORK / "config.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def looks_valid(key, value) -> bool:
    """Values a config may legitimately hold (the property only concerns the others)."""
    if value is None:
        return True
    if key in ("warm_l2", "isolate", "quiet"):
        return isinstance(value, bool)
    return False


@FUZZ
@given(key=st.sampled_from(KEYS), value=yaml_value)
def test_run_config_with_a_wrong_value_is_rejected(capsys, key, value):
    assume(not looks_valid(key, value))
    code, err = invoke(["run", *BASE_CFG, "--config", str(write_yaml({key: value}))], capsys)
    if code == "accepted":  # a value that is fine after all (e.g. dtype: fp16, seq_lens: 128)
        return
    assert code == 2, f"{key}: {value!r}: exit {code!r}, stderr {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not DB.exists()


@FUZZ
@given(data=st.one_of(st.lists(yaml_scalar, max_size=3), yaml_scalar.filter(lambda v: v is not None),
                      st.dictionaries(st.text(min_size=1, max_size=8).filter(
                          lambda k: k.replace("-", "_") not in KEYS + ["seq_len", "num_heads", "repeats", "passes"]),
                          yaml_scalar, min_size=1, max_size=3)))
def test_run_config_of_the_wrong_shape_is_rejected(capsys, data):
    assert_rejected(["run", *BASE, "--config", str(write_yaml(data))], capsys)


@FUZZ
@given(text=st.sampled_from(["seq_lens: [", "a: b: c", "{", "- x\n y: 1", "q_heads: *alias", "!!python/object:os.system {}",
                             "\t\tbad", "key: 'unterminated"]))
def test_run_config_that_is_not_yaml_is_rejected(capsys, text):
    path = WORK / "broken.yaml"
    path.write_text(text)
    assert_rejected(["run", *BASE, "--config", str(path)], capsys)


# ---- backends / env / unknown options -----------------------------------------------------------
@FUZZ
@given(command=st.sampled_from(["backends", "env"]), value=SCALAR_FLAGS["--device"])
def test_info_commands_reject_bad_devices(capsys, command, value):
    assert_rejected([command, "--device", value], capsys)


@FUZZ
@given(command=st.sampled_from(["run", "backends", "env"]),
       flag=st.from_regex(r"--[a-z][a-z0-9-]{0,12}", fullmatch=True), extra=st.lists(junk, max_size=2))
def test_unknown_options_are_rejected(capsys, command, flag, extra):
    import typer

    from attnbench.cli import app
    command_obj = typer.main.get_command(app).commands[command]
    known = {opt for p in command_obj.params for opt in p.opts} | {"--help", "--causal", "--no-causal",
                                                                   "--num_heads", "--seq_len", "--batch_size"}
    assume(flag not in known)
    assume(not any(k.startswith(flag) for k in known))  # click accepts no abbreviations, but be safe
    assert_rejected([command, flag, *extra], capsys, flag)


def test_resume_errors(capsys, tmp_path):
    line = assert_rejected(["run", "--resume", "nosuch", "--db", str(DB)], capsys, "nosuch")
    assert "no results database" in line
    from attnbench.results.store import ResultStore
    db = tmp_path / "r.db"
    with ResultStore(db) as store:
        store.start_run("r1", command="x", config={}, env_id=None, version="0")
    line = assert_rejected(["run", "--resume", "r2", "--db", str(db)], capsys, "r2")
    assert "r1" in line
    assert_rejected(["run", "--resume", "r1", "--db", str(db), "--seq-lens", "16"], capsys, "--seq-lens")


def test_bad_paths_are_rejected_before_running(capsys, tmp_path):
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello")
    line = assert_rejected(["run", "--device", "cpu", "--db", str(not_db)], capsys, "not a SQLite database")
    assert not_db.read_text() == "hello"
    assert_rejected(["run", *BASE, "--output", str(tmp_path / "missing" / "out.json")], capsys, "existing folder")
    binary = tmp_path / "cfg.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert_rejected(["run", *BASE, "--config", str(binary)], capsys, "UTF-8")
    empty = WORK / "empty.yaml"
    empty.write_text("dtype: []\n")
    assert_rejected(["run", *BASE, "--config", str(empty)], capsys, "--dtype []")
    assert line


def test_yaml_inner_lists_are_grouped_batches(capsys):
    cfg = WORK / "groups.yaml"
    cfg.write_text("seq_lens: [[16, 16], 32]\nbatch_size: [1, 2]\npass: fwd\ncausal: false\n")
    code, err = invoke(["run", *BASE, "--config", str(cfg)], capsys)
    assert code == "accepted", err
    plan = LAST_PLAN[0]
    assert sorted({(s.batch, s.seqlens_q) for s in plan.specs}) == [(1, (16, 16)), (1, (32,)), (2, (16, 16)),
                                                                      (2, (32,))]


# ---- bounds checked before any work; every config key honoured or refused ------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--run-id", "../../escape"], "--run-id"), (["--run-id", "latest"], "reserved"),
    (["--run-id", "x" * 10_000], "1 to 64"), (["--run-id", "a\nb"], "letters, digits"),
    (["--run-id", "tab\there"], "letters, digits"), (["--run-id", "-x"], "start"),
    (["--window", "1000000000000000000000000000000,0"], "--window"), (["--window", "-5,0"], "--window"),
    (["--case-timeout", "1e12"], "--case-timeout"), (["--cooldown", "1e30"], "--cooldown"),
    (["--min-time-ms", "1e30"], "--min-time-ms"), (["--backends", "naive,,naive"], "empty name"),
    (["--dtype", "x" * 10_000], "dtype"),
])
def test_out_of_bounds_values_are_refused_before_running(capsys, argv, needle):
    line = assert_rejected(["run", *BASE, *argv], capsys, needle)
    assert len(line) < 700  # the echo of a huge input is cut


def test_trace_must_be_a_folder(capsys, tmp_path):
    afile = tmp_path / "passwd"
    afile.write_text("x")
    assert_rejected(["run", *BASE, "--trace", str(afile)], capsys, "it is a file")
    code, err = invoke(["run", *BASE, "--trace", str(tmp_path / "new" / "traces")], capsys)
    assert code == "accepted", err


def test_config_run_id_and_shard_are_honoured(capsys):
    cfg = WORK / "ids.yaml"
    cfg.write_text("run_id: from-yaml\nshard: 1/2\nseq_lens: [16, 32, 48, 64]\npass: fwd\ncausal: false\n"
                   "backends: naive\n")
    code, err = invoke(["run", *BASE, "--config", str(cfg)], capsys)
    assert code == "accepted", err
    plan, kwargs = LAST_PLAN
    assert kwargs["run_id"] == "from-yaml" and plan.db.name == "never.rank1.db"
    one = {s.seqlens_q for s in plan.specs}
    cfg.write_text(cfg.read_text().replace("shard: 1/2", "shard: 0/2"))
    code, err = invoke(["run", *BASE, "--config", str(cfg)], capsys)
    zero = {s.seqlens_q for s in LAST_PLAN[0].specs}
    assert one and zero and not one & zero and one | zero == {(16,), (32,), (48,), (64,)}  # two halves
    code, err = invoke(["run", *BASE, "--config", str(cfg), "--run-id", "from-flag"], capsys)
    assert code == "accepted" and LAST_PLAN[1]["run_id"] == "from-flag"  # the flag wins


@pytest.mark.parametrize("text, accepted", [("check: false", True), ("check: true", True), ("check: no", True),
                                            ('check: "no"', False), ("check: 0", False), ("table: 'yes'", False)])
def test_config_flags_are_true_or_false(capsys, text, accepted):
    cfg = WORK / "flags.yaml"
    cfg.write_text(text + "\nseq_lens: 16\npass: fwd\ncausal: false\nbackends: naive\n")
    code, err = invoke(["run", *BASE, "--config", str(cfg)], capsys)
    if not accepted:
        assert_rejected(["run", *BASE, "--config", str(cfg)], capsys, "expected true or false")
        return
    assert code == "accepted", err
    assert (LAST_PLAN[1]["checker"] is None) == (text in ("check: false", "check: no"))


def test_a_config_key_given_twice_is_refused(capsys):
    cfg = WORK / "twice.yaml"
    cfg.write_text("seq_lens: 64\nseq-lens: 128\n")
    assert_rejected(["run", *BASE, "--config", str(cfg)], capsys, "seq_lens", "seq-lens", "give it once")
    cfg.write_text("seq_len: 64\nseq_lens: 128\n")
    assert_rejected(["run", *BASE, "--config", str(cfg)], capsys, "give it once")


def test_yaml_aliases_are_bounded(capsys):
    lines, prev = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]"], "a"
    for name in "bcdefghijk":  # 9^11 values once expanded, from a 400-byte file
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
        prev = name
    cfg = WORK / "bomb.yaml"
    cfg.write_text("\n".join(lines) + f"\nseq_lens: *{prev}\n")
    line = assert_rejected(["run", *BASE, "--config", str(cfg)], capsys, "more than 100,000 values")
    assert len(line) < 300


@pytest.mark.parametrize("argv, needle", [
    (["e2e", "--model", "llama-tiny", "--layers", "40"], "llama-tiny has 2 layers"),
    (["e2e", "--model", "llama-tiny", "--layers", "1000000"], "--layers"),
    (["e2e", "--model", "llama-tiny", "--steps", "99999999999999999999"], "--steps"),
    (["dist", "--timeout", "0"], "--timeout"), (["dist", "--timeout", "1e12"], "--timeout"),
])
def test_other_commands_check_bounds_first(capsys, argv, needle):
    assert_rejected([*argv, "--device", "cpu", "--db", str(DB)], capsys, needle)


@pytest.mark.parametrize("name, value, needle", [("ATTNBENCH_LOG", "bogus", "ATTNBENCH_LOG"),
                                                 ("ATTNBENCH_DEBUG", "maybe", "ATTNBENCH_DEBUG")])
def test_bad_environment_is_one_line(capsys, monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    assert_rejected(["run", *BASE], capsys, needle)


def test_environment_values_mean_what_users_mean():
    assert cli.log_level(None) == cli.log_level("") == cli.log_level("  ") == "WARNING"
    assert cli.log_level("debug") == "DEBUG"
    assert not any(cli.debug_flag(v) for v in (None, "", "0", "false", "No", "off"))
    assert all(cli.debug_flag(v) for v in ("1", "true", "YES", "on"))


def test_debug_0_keeps_tracebacks_off(capsys, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_DEBUG", "0")

    def boom(plan, **kwargs):
        raise RuntimeError("unexpected")
    monkeypatch.setattr(run_cmd, "execute", boom)
    code, err = invoke(["run", *BASE, "--seq-lens", "16", "--backends", "naive"], capsys)
    assert code == 1 and err.count("\n") == 1 and "RuntimeError: unexpected" in err


# ---- backend options: typed and ranged when parsed -----------------------------------------------------
def _yaml_collection(text: str) -> bool:
    """Does YAML read ``text`` as a list or a mapping (refused as "give one value", not by type)?"""
    try:
        return isinstance(yaml.safe_load(text), (list, dict))
    except (yaml.YAMLError, RecursionError):
        return False


BOOL_OPTIONS = ["flex.compile", "flex.cpu", "flashinfer-decode.use_tensor_cores", "sta-triton.text_first",
                "sage.smooth_k"]
RANGED_OPTIONS = {"flex-sparse.sparsity": "[0, 0.95]", "flex-sparse.block": "16..1073741824",
                  "flex-sparse.seed": "0..9223372036854775807", "flashinfer-paged.page_size": "1..65536",
                  "fa3-paged.page_size": "1..65536", "fa2-paged.page_size": "256..65536",
                  "sparge.topk": "[0, 1]", "sparge-cdf.cdfthreshd": "[0, 1]"}


@FUZZ
@given(option=st.sampled_from(BOOL_OPTIONS), value=st.one_of(
    st.sampled_from(["maybe", "1", "0", "2", "-1", "1.5", "nan", ".inf", "null", "''", "on!", "True!"]),
    st.integers().map(str), junk.filter(lambda s: s.strip().lower() not in {
        "true", "false", "yes", "no", "on", "off", "y", "n"} and "=" not in s and not _yaml_collection(s))))
def test_a_boolean_backend_option_takes_true_or_false_only(capsys, option, value):
    assert_rejected(["run", *BASE, "--backend-opt", f"{option}={value}"], capsys, option, "expected true or false")


@FUZZ
@given(option=st.sampled_from(sorted(RANGED_OPTIONS)), value=st.one_of(
    st.integers(max_value=-1), st.integers(min_value=2**63), st.sampled_from([".nan", ".inf", "-.inf", "1e400", "abc",
                                                                             "true", "1e30"])))
def test_a_numeric_backend_option_outside_its_range_names_the_range(capsys, option, value):
    assert_rejected(["run", *BASE, "--backend-opt", f"{option}={value}"], capsys, option, RANGED_OPTIONS[option])


@pytest.mark.parametrize("item, needle", [
    ("flashinfer-paged.page_size=0", "1..65536"), ("flashinfer-paged.page_size=16.0", "an integer"),
    ("fa2-paged.page_size=300", "multiple of 256"), ("fa3-kvcache.page_size=64", "allowed: none"),
    ("flex.colour=red", "allowed: compile"), ("flex-sparse.pattern=[1, 2]", "give one value"),
    ("flex-sparse.sparsity=" + "[" * 5000, "flex-sparse.sparsity"),
    # options with a closed set of values name them
    ("sage.pv_accum_dtype=bogus", "allowed: fp32, fp16, fp16+fp32"), ("sage.qk_quant_gran=bogus", "allowed: per_warp"),
    ("sage2-fp8.qk_quant_gran=true", "allowed: per_warp, per_thread"),
    ("flex.compile_backend=bogus", "inductor"), ("flex.mode=bogus", "allowed: default"),
    ("flex.mode=max_autotune", "max-autotune"),
    ("sta-triton.tile=abc", "three positive integers"), ("sta-triton.tile=0x1", "three positive integers"),
    ("sta-triton.tile=1x1", "three positive integers"), ("sta-triton.tile=6x0x8", "three positive integers"),
])
def test_backend_options_are_refused_with_what_they_accept(capsys, item, needle):
    assert_rejected(["run", *BASE, "--backend-opt", item], capsys, needle)


def test_valid_backend_options_keep_their_types(monkeypatch):
    from attnbench.backends import options, registry
    monkeypatch.setattr(registry, "_extra", {})
    got = options.resolve(["flex.compile=false", "flex.mode=max-autotune", "flashinfer-paged.page_size=64", "flex-sparse.sparsity=0",
                         "flashinfer.backend=fa2", "sparge.topk=0.5", "sage2-fp8.pv_accum_dtype=fp32+fp32",
                         "sta-triton.tile=6x8x8"])
    assert got == {"flex": {"compile": False, "mode": "max-autotune"}, "flashinfer-paged": {"page_size": 64}, "flex-sparse": {"sparsity": 0},
                   "flashinfer": {"backend": "fa2"}, "sparge": {"topk": 0.5},
                   "sage2-fp8": {"pv_accum_dtype": "fp32+fp32"}, "sta-triton": {"tile": "6x8x8"}}
    assert registry.get("flex", got["flex"]).compile is False
    assert registry.get("flashinfer-paged", got["flashinfer-paged"]).page_size == 64
    assert registry.get("flex").compile is True and registry.registered("flex") is None  # the registry as it was


def test_one_commands_backend_options_do_not_carry_into_the_next(monkeypatch):
    # a script that makes several plans in one process (benchmarks/serving.py's sets) got the sum of their options:
    # a decode set after a tensor-core set ran on tensor cores, recorded under the plain name
    from attnbench.backends import options, registry
    plugin = registry.get("naive").__class__
    monkeypatch.setattr(registry, "_extra", {"mine": plugin})
    first = options.resolve(["flashinfer-decode.use_tensor_cores=true", "flashinfer-paged.page_size=64"])
    assert registry.get("flashinfer-decode", first.get("flashinfer-decode")).use_tensor_cores is True
    second = options.resolve(["flashinfer-paged.backend=fa2"])
    assert registry.get("flashinfer-decode", second.get("flashinfer-decode")).use_tensor_cores is False
    assert registry.get("flashinfer-decode").use_tensor_cores is False  # nothing was registered
    paged = registry.get("flashinfer-paged", second["flashinfer-paged"])
    assert (paged.backend, paged.page_size) == ("fa2", 16)  # the second plan's options, none of the first's
    with pytest.raises(ValueError, match="page_size"):
        options.resolve(["flashinfer-paged.page_size=0"])
    assert registry.get("flashinfer-paged").backend == "auto" and registry.registered("mine") is plugin


# ---- inputs bounded before they are used ---------------------------------------------------------------
def test_config_files_are_bounded_by_size_and_depth(capsys):
    big = WORK / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\nseq_lens: 16\n")
    assert_rejected(["run", *BASE, "--config", str(big)], capsys, "1 MiB at most")
    deep = WORK / "deep.yaml"
    deep.write_text("seq_lens: " + "[" * 20000 + "]" * 20000 + "\n")
    assert_rejected(["run", *BASE, "--config", str(deep)], capsys, "nested too deeply")


def test_dist_timeline_and_counts_are_bounded_before_any_process_group(capsys):
    for argv, needle in ((["--timeline", "1000000"], "0..1000"), (["--timeline", "-1"], "0..1000"),
                         (["--repeat", "99999999"], "1..100000"), (["--warmup", "-2"], "--warmup")):
        assert_rejected(["dist", "--device", "cpu", "--db", str(DB), *argv], capsys, needle)


def test_e2e_refuses_a_model_that_cannot_fit_with_the_estimate(capsys, monkeypatch):
    from attnbench import memory
    monkeypatch.setattr(memory, "available_bytes", lambda device: 300 << 10)  # 300 KiB
    line = assert_rejected(["e2e", "--model", "llama-tiny", "--device", "cpu", "--db", str(DB), "--backends", "naive"],
                           capsys, "needs about", "300.0 KiB available on cpu", "weights", "(estimated; not run)")
    assert "use --layers" in line
    line = assert_rejected(["e2e", "--model", "llama3-8b", "--device", "cpu", "--db", str(DB), "--mode", "train",
                            "--layers", "1"], capsys, "needs about")
    assert "gradients" in line


def test_e2e_that_runs_out_of_memory_building_leaves_no_run_behind(capsys, monkeypatch, tmp_path):
    import torch

    from attnbench.models import bench

    def oom(cfg):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(bench, "build_workload", oom)
    db = tmp_path / "e.db"
    code, err = invoke(["e2e", "--model", "llama-tiny", "--device", "cpu", "--db", str(db)], capsys)
    assert code == 2 and "out of memory while building it" in err and err.count("\n") == 1, err
    assert not db.exists()


def test_calibrate_sizes_are_bounded_by_memory(capsys, monkeypatch):
    from attnbench import memory
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 30)
    assert_rejected(["calibrate", "--device", "cpu", "--db", str(DB), "--size", "30000"], capsys, "--size 30000",
                    "1.0 GiB available")
    assert_rejected(["calibrate", "--device", "cpu", "--db", str(DB), "--size", "99999999"], capsys, "1..1048576")


@pytest.mark.parametrize("argv, needles", [
    (["--op", "sparse-mla", "--kv-seq-lens", "128,64", "--topk", "32"], ("--kv-seq-lens '128,64'", "a case each")),
    (["--op", "indexer", "--kv-seq-lens", "1024,2048"], ("--kv-seq-lens '1024,2048'",)),
    (["--op", "indexer", "--seq-lens", "128,64"], ("(128,64)",)),
    (["--op", ""], ("bad --op ''",)), (["--op", "sparse-mla", "--indices", ""], ("--indices ''",)),
    (["--op", "gdn", "--chunk", ""], ("--chunk ''",)), (["--op", "gdn", "--head-size-v", ""], ("--head-size-v ''",)),
    (["--fresh-inputs", "--no-check"], ("--fresh-inputs", "--no-check")),
])
def test_what_would_be_dropped_ignored_or_read_as_the_default_is_refused(capsys, argv, needles):
    assert_rejected(["run", *BASE, *argv], capsys, *needles)


def test_key_lengths_of_sparse_mla_are_a_case_each(capsys):
    code, err = invoke(["run", *BASE, "--op", "sparse-mla", "--seq-lens", "32", "--kv-seq-lens", "128", "64",
                        "--topk", "32"], capsys)
    assert code == "accepted", err
    assert sorted(s.s_kv for s in LAST_PLAN[0].specs) == [64, 128]
