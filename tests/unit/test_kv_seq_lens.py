"""--kv-seq-lens: key lengths of their own, paired with --seq-lens; lower-right causal everywhere."""

import json

import pytest
from reliability_helpers import attnbench

from attnbench.sweep import Sweep, pair_seq_lens, parse_seq_lens

TINY = ["--device", "cpu", "--q-heads", "2", "--head-size", "16", "--dtype", "fp32", "--warmup", "0", "--repeat", "1"]


def test_pairing_is_in_order_and_a_single_case_goes_with_all():
    q, k = pair_seq_lens(parse_seq_lens(["1"]), parse_seq_lens(["1k..4k:x2"]))
    assert q == [(1,), (1,), (1,)] and k == [(1024,), (2048,), (4096,)]
    q, k = pair_seq_lens(parse_seq_lens(["77", "100"]), parse_seq_lens(["300"]))
    assert k == [(300,), (300,)]
    q, k = pair_seq_lens(parse_seq_lens(["16,33", "8"]), parse_seq_lens(["40,50", "9"]))
    specs = Sweep(batch_sizes=(1,), seq_lens=tuple(q), kv_seq_lens=tuple(k), q_heads=(2,), head_sizes=(16,),
                  dtypes=("fp32",), causal=(True,), passes=("fwd",)).specs()
    assert [(s.seqlens_q, s.seqlens_k) for s in specs] == [((16, 33), (40, 50)), ((8,), (9,))]
    assert specs[0].label().startswith("b1 varlen[16,33]/[40,50]")
    with pytest.raises(ValueError, match="gives 2 cases and --seq-lens 3"):
        pair_seq_lens(parse_seq_lens(["1", "2", "3"]), parse_seq_lens(["4", "5"]))


@pytest.mark.parametrize("args, message", [
    (["--seq-lens", "16,33", "--kv-seq-lens", "40"], "has 1 sequence(s) but --seq-lens 16,33 has 2"),
    (["--seq-lens", "64", "--kv-seq-lens", "64,,64"], "bad --kv-seq-lens value '64,,64': empty item"),
    (["--seq-lens", "1", "2", "3", "--kv-seq-lens", "4", "5"], "--kv-seq-lens gives 2 cases and --seq-lens 3"),
])
def test_bad_key_lengths_are_one_line_errors(tmp_path, args, message):
    res = attnbench("run", *TINY, "--backends", "naive", *args, "--db", str(tmp_path / "r.db"))
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.db").exists()


def test_queries_shorter_than_keys_are_checked_with_lower_right_causal_masks(tmp_path):
    """The lower-right backends pass; a kernel whose causal mask is aligned to the upper left fails."""
    res = attnbench("verify", *TINY, "--backends", "naive,sdpa-math,sdpa-flash,test-upper-left",
                    "--seq-lens", "1", "77", "--kv-seq-lens", "300", "--causal", "--db", str(tmp_path / "v.db"),
                    "--json")
    assert res.returncode == 1
    rows = json.loads(res.stdout)
    assert {r["case"] for r in rows} == {"b1 s1/300 h2 d16 fp32 causal", "b1 s77/300 h2 d16 fp32 causal"}
    status = {(r["backend"], r["case"].split()[1]): r["status"] for r in rows}
    for name in ("naive", "sdpa-math", "sdpa-flash"):
        assert status[(name, "s1/300")] == status[(name, "s77/300")] == "ok", status
    assert status[("test-upper-left", "s1/300")] == status[("test-upper-left", "s77/300")] == "mismatch"
