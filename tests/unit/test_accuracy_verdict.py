"""Error metrics and the verdict on synthetic errors."""

import math

import pytest
import torch

from attnbench.accuracy.compare import compare, tensor_metrics
from attnbench.accuracy.tolerance import Tolerance, floor, judge, unit_roundoff


def test_metrics_of_a_known_error():
    y = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.float64)
    x = y + torch.tensor([[0.1, 0.0], [0.0, -0.3]], dtype=torch.float64)
    m = tensor_metrics(x.float(), y)
    assert m["max_abs"] == pytest.approx(0.3, rel=1e-6)
    assert m["mean_abs"] == pytest.approx(0.1, rel=1e-6)
    assert m["rel_l1"] == pytest.approx(0.4 / 10, rel=1e-6)
    assert m["rel_l2"] == pytest.approx(math.sqrt(0.1) / math.sqrt(30), rel=1e-6)
    assert m["rmse"] == pytest.approx(math.sqrt(0.1 / 4), rel=1e-6)
    cos = float((x * y).sum() / (x.norm() * y.norm()))
    assert m["cosine"] == pytest.approx(cos, rel=1e-6)
    assert m["nonfinite"] == 0 and m["numel"] == 4 and m["ref_max_abs"] == 4.0 and m["ref_mean_abs"] == 2.5


def test_chunked_metrics_equal_one_shot_on_strided_views():
    y = torch.randn(3, 50, 7, 5, dtype=torch.float64).transpose(1, 2)  # non-contiguous, like bhsd views
    x = (y + 1e-3 * torch.randn_like(y)).to(torch.bfloat16)
    whole = tensor_metrics(x, y, chunk=10 ** 9)
    pieces = tensor_metrics(x, y, chunk=37)
    for key in ("max_abs", "mean_abs", "rel_l2", "cosine", "rel_l1", "rmse"):
        assert pieces[key] == pytest.approx(whole[key], rel=1e-9), key


def test_nan_is_counted_and_poisons_the_numbers():
    y = torch.randn(4, 6, dtype=torch.float64)
    x = y.clone()
    x[1, 2] = float("nan")
    x[3, 0] = float("inf")
    m = tensor_metrics(x, y)
    assert m["nonfinite"] == 2 and math.isnan(m["max_abs"])


def test_lse_rows_without_keys_accept_either_infinity_only():
    y = torch.tensor([-math.inf, 1.0, 2.0], dtype=torch.float64)
    ok = tensor_metrics(torch.tensor([math.inf, 1.0, 2.5]), y)  # flash-attn writes +inf there
    assert ok["nonfinite"] == 0 and "inf_mismatch" not in ok and ok["max_abs"] == pytest.approx(0.5)
    bad = tensor_metrics(torch.tensor([0.0, 1.0, 2.0]), y)
    assert bad["inf_mismatch"] == 1


def test_shape_mismatch_is_an_error_entry_and_absent_tensors_are_skipped():
    ref = {"out": torch.zeros(2, 3, dtype=torch.float64), "dq": torch.zeros(2, dtype=torch.float64)}
    res = compare({"out": torch.zeros(3, 2)}, ref)
    assert set(res) == {"out"} and "does not match" in res["out"]["error"]


def metrics(max_abs, mean_abs=None, rel_l2=None, ref_max=2.0, ref_mean=0.5, cosine=1.0, rel_l1=0.0):
    return {"max_abs": max_abs, "mean_abs": mean_abs if mean_abs is not None else max_abs / 10,
            "rel_l2": rel_l2 if rel_l2 is not None else max_abs / 5, "cosine": cosine, "rel_l1": rel_l1,
            "rmse": 0.0, "nonfinite": 0, "ref_max_abs": ref_max, "ref_mean_abs": ref_mean}


def test_pass_within_twice_the_baseline_fail_beyond():
    base = {"out": metrics(0.01), "dk": metrics(0.02)}
    good = judge({"out": metrics(0.029), "dk": metrics(0.03)}, base, "bf16", exact=True)
    assert good["verdict"] == "pass" and "reason" not in good
    floor = 2 * unit_roundoff("bf16") * 2.0
    assert good["limits"]["out"]["max_abs"] == pytest.approx(3 * 0.01 + floor)  # k_max for the largest element
    assert good["limits"]["out"]["rel_l2"] == pytest.approx(2 * 0.002 + 2 * unit_roundoff("bf16"))
    bad = judge({"out": metrics(0.019), "dk": metrics(0.2)}, base, "bf16", exact=True)
    assert bad["verdict"] == "fail" and bad["reason"].startswith("dk max_abs") and "out" not in bad["reason"]


def test_unit_roundoffs_are_half_an_epsilon():
    assert [unit_roundoff(d) for d in ("bf16", "fp16", "fp32", "fp64")] == [2 ** -8, 2 ** -11, 2 ** -24, 2 ** -53]
    assert unit_roundoff("float32") == unit_roundoff("fp32")


def test_floor_lets_output_rounding_pass_when_the_baseline_is_exact():
    u = unit_roundoff("fp32")
    base = {"out": metrics(0.0, 0.0, 0.0)}
    assert judge({"out": metrics(u * 2.0, u * 0.5, u)}, base, "fp32", exact=True)["verdict"] == "pass"
    assert judge({"out": metrics(1e-3, 1e-4, 1e-3)}, base, "fp32", exact=True)["verdict"] == "fail"


def test_each_metric_is_judged_on_its_own():
    base = {"out": metrics(0.01, 0.001, 0.002)}
    # max error fine, but the mean error is 10x the baseline's (a systematic bias)
    res = judge({"out": metrics(0.01, 0.01, 0.002)}, base, "bf16", exact=True)
    assert res["verdict"] == "fail" and "mean_abs" in res["reason"]


def test_nan_missing_and_shape_errors_fail_outright():
    base = {"out": metrics(0.01)}
    nan = dict(metrics(0.0), nonfinite=3)
    assert "NaN" in judge({"out": nan}, base, "bf16", exact=True)["reason"]
    assert judge({"out": nan}, None, "bf16", exact=False)["verdict"] == "fail"  # approximate too
    missing = judge({"out": metrics(0.01)}, base, "bf16", exact=True, missing=("dk",))
    assert missing["verdict"] == "fail" and "dk: not returned" in missing["reason"]
    shape = judge({"out": {"error": "shape (2,) does not match"}}, base, "bf16", exact=True)
    assert shape["verdict"] == "fail"


def test_tensor_without_baseline_is_reported_not_judged():
    res = judge({"out": metrics(0.01), "dq": metrics(5.0)}, {"out": metrics(0.01)}, "bf16", exact=True)
    assert res["verdict"] == "pass" and "dq" not in res["limits"]


def test_the_lse_is_held_to_its_own_fp32_round_off_not_to_the_baseline():
    lse = dict(metrics(2e-6, 1e-6, 2e-7, ref_max=9.0, ref_mean=8.0), dtype="float32")
    loose_base = {"out": metrics(0.01), "lse": metrics(0.05)}  # a bf16 logsumexp's error: not used
    assert judge({"lse": lse}, loose_base, "bf16", exact=True, reduction=1000)["verdict"] == "pass"
    shifted = dict(lse, max_abs=0.01, mean_abs=0.01, rel_l2=0.0012)  # softmax scale 1% off: LSE + ~0.01
    res = judge({"lse": shifted}, loose_base, "bf16", exact=True, reduction=1000)
    assert res["verdict"] == "fail" and "lse max_abs" in res["reason"] and "fp32 floor" in res["reason"]
    # an LSE returned in bf16 is judged in fp32 all the same: a backward pass that reads it would be as far off
    assert judge({"lse": dict(shifted, dtype="bfloat16")}, None, "bf16", exact=True)["verdict"] == "fail"


def test_systematic_measures_are_judged_in_magnitude():
    u = unit_roundoff("bf16")
    base = {"dk": dict(metrics(0.05, 0.004, 0.005), scale=-2e-4, bias=1e-4, block_scale=5e-4, block_bias=3e-4)}
    good = dict(metrics(0.05, 0.004, 0.005), scale=1e-4, bias=-1e-4, block_scale=-6e-4, block_bias=2e-4)
    res = judge({"dk": good}, base, "bf16", exact=True)
    assert res["verdict"] == "pass"
    assert res["limits"]["dk"]["block_scale"] == pytest.approx(2 * 5e-4 + u)
    one_percent = dict(good, scale=-0.01, block_scale=-0.0101)  # dK 1% too small: rel-L2 alone lets it pass
    res = judge({"dk": one_percent}, base, "bf16", exact=True)
    assert res["verdict"] == "fail" and "dk scale -0.01 >" in res["reason"] and "rel_l2" not in res["reason"]


def test_approximate_backends_use_cosine_and_rel_l1():
    good = judge({"out": metrics(0.5, cosine=0.99, rel_l1=0.05)}, None, "bf16", exact=False)
    assert good["verdict"] == "approx-pass"
    low_cos = judge({"out": metrics(0.5, cosine=0.97, rel_l1=0.05)}, None, "bf16", exact=False)
    assert low_cos["verdict"] == "approx-fail" and "cosine" in low_cos["reason"]
    high_l1 = judge({"out": metrics(0.5, cosine=0.99, rel_l1=0.08)}, None, "bf16", exact=False)
    assert high_l1["verdict"] == "approx-fail" and "rel_l1" in high_l1["reason"]
    strict = Tolerance(approx_min_cosine=0.995)
    assert judge({"out": metrics(0.5, cosine=0.99, rel_l1=0.05)}, None, "bf16", exact=False,
                 tol=strict)["verdict"] == "approx-fail"


def test_tolerance_validates():
    with pytest.raises(ValueError, match="k, k_max >= 1"):
        Tolerance(k=0.5)


def test_fp32_floor_allows_reordered_fp32_sums_but_not_bugs():
    # Seen on an H200: sdpa-efficient fp32 dq max error 2.9e-6 at S=577 vs math 9.2e-7; summation
    # order alone can take it past 3 x math (4e-6 here), which the sqrt(n) accumulation term allows.
    base = {"dq": {"max_abs": 9.15e-7, "mean_abs": 1e-7, "rel_l2": 2e-7}}
    got = {"dq": {"max_abs": 4e-6, "mean_abs": 2e-7, "rel_l2": 4e-7, "ref_max_abs": 5.8, "ref_mean_abs": 0.8}}
    assert judge(got, base, "fp32", exact=True, reduction=577)["verdict"] == "pass"
    assert judge(got, base, "fp32", exact=True, reduction=1)["verdict"] == "fail"
    wrong = {"dq": dict(got["dq"], max_abs=1e-3)}  # a real bug is orders of magnitude off
    assert judge(wrong, base, "fp32", exact=True, reduction=577)["verdict"] == "fail"
    # 16-bit dtypes: their own round-off dominates, the accumulation term changes nothing
    assert floor("max_abs", {"ref_max_abs": 1.0}, "bf16", Tolerance(), 16384) == floor(
        "max_abs", {"ref_max_abs": 1.0}, "bf16", Tolerance(), 1)


def test_the_docs_state_the_constants_the_code_uses():
    from pathlib import Path
    text = Path(__file__).resolve().parents[2].joinpath("docs", "fidelity.md").read_text()
    section = text[text.index("## The accuracy verdict"):]
    tol = Tolerance()
    for name in ("k", "k_max", "floor_ulps", "sys_floor_ulps", "z"):
        assert f"**{name} = {getattr(tol, name):g}**" in section, name
    exps = {"bf16": 8, "fp16": 11, "fp32": 24, "fp64": 53}
    assert "**" + ", ".join(f"{d} 2^-{e}" for d, e in exps.items()) + "**" in section.replace("\n", " ")
    assert all(unit_roundoff(d) == 2.0 ** -e for d, e in exps.items())
    from attnbench.accuracy import tolerance
    for d, e in exps.items():  # and the module docstring
        assert f"2^-{e} {d}" in tolerance.__doc__
