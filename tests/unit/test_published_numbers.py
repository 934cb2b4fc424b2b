"""benchmarks/published_numbers.py: how the page turns stored records into published / ours cells."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnbench.results.record import Record
from attnbench.results.store import ResultStore

spec = importlib.util.spec_from_file_location("published", Path(__file__).parents[2] / "benchmarks" / "published_numbers.py")
published = importlib.util.module_from_spec(spec)
sys.modules["published"] = published  # dataclasses look their module up
spec.loader.exec_module(published)


def figure(key):
    return next(f for f in published.FIGURES if f.key == key)


def test_every_figure_has_one_published_value_per_shape_and_its_own_shapes():
    for fig in published.FIGURES:
        assert len(fig.columns()) == len(fig.shapes), fig.key
        for _, values in fig.series.values():
            assert len(values) == len(fig.shapes), fig.key
    assert figure("sage-fwd-d128").columns()[0] == "S=1024"          # batch 4 throughout
    assert figure("fa3-fwd-d64").columns()[0] == "S=512"             # B·S = 16k throughout
    assert figure("flashinfer-prefill-causal-d128").columns()[3] == "B=8 S=8192"


def store_with(tmp_path, records):
    store = ResultStore(tmp_path / "p.db")
    for run_id in dict.fromkeys(r.run_id for r in records):
        store.start_run(run_id, command="test", config={}, env_id=None, version="0")
        for r in records:
            if r.run_id == run_id:
                store.write(r)
        store.finish_run(run_id)
    store.close()
    return tmp_path / "p.db"


def test_kernel_alone_rows_use_the_longest_kernel_and_groups_their_own_run(tmp_path):
    fig = figure("sage-fwd-d128")
    case = published.specs(fig)[0]                                  # B4 S1k H32 d128: 17.2 GFLOP
    flops = published.paper_flops(case)
    whole_ms, kernel_ms = flops / 500e12 * 1e3, flops / 800e12 * 1e3
    records = [Record(run_id="r", backend="sage2-fp8-sm90", spec=case, median_ms=whole_ms),
               Record(run_id="r+profiler", backend="sage2-fp8-sm90", spec=case, median_ms=whole_ms,
                      timing_mode="profiler",
                      info={"kernel_ms": {"quant_int8_kernel": whole_ms - kernel_ms, "qk_int8_sv_f8_attn": kernel_ms}}),
               Record(run_id=published.group_run_id("r", "flashinfer.backend=fa3"), backend="flashinfer", spec=published.specs(
                   figure("flashinfer-prefill-causal-d128"))[0], status="error", reason="boom")]
    out = tmp_path / "page.md"
    published.cmd_page(SimpleNamespace(db=str(store_with(tmp_path, records)), run_id=["r"], output=str(out), how="x"))
    page = out.read_text()
    assert "| SageAttn2-8b | `sage2-fp8-sm90` | **676 / 500 (0.74)** |" in page
    assert "| SageAttn2-8b | `sage2-fp8-sm90` (attention kernel alone) | **676 / 800 (1.18)** |" in page
    assert "`qk_int8_sv_f8_attn` (of 2 kernels a call" in page
    assert "| FlashInfer FA3 (contiguous) | `flashinfer` (flashinfer.backend=fa3) | 392 / error |" in page
    assert "FlashAttention-3 paper" not in page.split("## Not compared")[0]   # figures with no records left out


@pytest.mark.parametrize("rec_info, expected", [({}, (None, "no kernel times")), (None, (None, "not run"))])
def test_kernel_alone_without_kernel_times_says_so(rec_info, expected):
    o = published.Ours("sage2-fp8-sm90", kernel_only=True)
    case = published.specs(figure("sage-fwd-d128"))[0]
    rec = None if rec_info is None else Record(run_id="r", backend=o.backend, spec=case, median_ms=1.0, info=rec_info)
    assert published.ours_tflops(o, case, rec) == expected
