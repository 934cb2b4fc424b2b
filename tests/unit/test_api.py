"""The Python API: the example that opens docs/api.md runs as written, and the API takes the command line's
options and refuses bad ones with the same one-line message."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_docs_example_runs(tmp_path, monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    code = code.replace("/tmp/attnbench-api-example.db", str(tmp_path / "api.db"))
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "4 cases: b1 s64 h4 d32 fp32 gate" in out and "checks pass" in out


def test_plan_validates_like_the_command_line():
    import attnbench
    plan = attnbench.plan(device="cpu", seq_lens="128", causal=True, backends="naive", softcap=[30, "none"])
    assert [s.softcap for s in plan.specs] == [30.0, 30.0, None, None]  # each softcap, fwd and fwd_bwd
    with pytest.raises(ValueError, match="bad --softcap"):
        attnbench.plan(device="cpu", seq_lens="128", softcap=-1)


def test_importing_the_package_imports_no_torch():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import attnbench, sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True, cwd=DOC.parents[1] / "src").stdout
    assert out.strip() == "False"


def test_backend_options_reach_the_run_and_leave_the_registry_alone(tmp_path):
    import attnbench
    from attnbench.backends import registry
    before = registry.registered("flex-sparse")
    plan = attnbench.plan(device="cpu", seq_lens="64", q_heads=2, head_size=16, dtype="fp32", pass_="fwd",
                          causal=False, backends="flex-sparse", backend_opt=["flex-sparse.sparsity=0.5"],
                          db=str(tmp_path / "o.db"))
    assert plan.options.backend_options == {"flex-sparse": {"sparsity": 0.5}}
    assert registry.registered("flex-sparse") is before  # the run's options are its own
    for isolate in (False, True):  # in this process and in a worker process
        records = attnbench.run(plan if not isolate else plan.__class__(**{**plan.__dict__, "isolate": True}))
        assert records[0].status == "ok", records[0].reason
        assert records[0].info["target_sparsity"] == 0.5, records[0].info  # the option, not the default


def test_an_unknown_option_is_refused_as_a_yaml_key_is():
    import attnbench
    with pytest.raises(ValueError, match=r"unknown key\(s\) in attnbench.plan's options: sofcap \(did you mean softcap"):
        attnbench.plan(device="cpu", seq_lens="64", sofcap=30)
    with pytest.raises(ValueError, match="unknown key.*: seqlens .*seq_lens"):
        attnbench.verify(device="cpu", seqlens=64)
    with pytest.raises(ValueError, match="unknown key.*: shard"):  # the command line's: run() runs the whole sweep
        attnbench.plan(device="cpu", seq_lens="64", shard="0/2")
    with pytest.raises(ValueError, match="bad --run-id"):
        attnbench.plan(device="cpu", seq_lens="64", run_id="../x")


@pytest.mark.parametrize("call, needle", [
    (lambda a: a.run(5), "takes a plan .* not a int"), (lambda a: a.run("plan"), "not a str"),
    (lambda a: a.frame([1, 2]), "records of attnbench.run or verify, not a int"),
    (lambda a: a.frame(5), "a list of records, not a int"),
])
def test_what_is_not_a_plan_or_records_is_a_type_error(call, needle):
    import attnbench
    with pytest.raises(TypeError, match=needle):
        call(attnbench)


def test_the_plans_run_id_and_output_are_honoured(tmp_path):
    import attnbench
    from attnbench.results import export
    plan = attnbench.plan(device="cpu", seq_lens="16", q_heads=1, head_size=8, dtype="fp32", pass_="fwd",
                          causal=False, backends="naive", warmup=0, repeat=1, db=str(tmp_path / "s.db"),
                          run_id="mine", output=str(tmp_path / "o.csv"))
    records = attnbench.run(plan)
    assert [r.run_id for r in records] == ["mine"]
    assert [row["run_id"] for row in export.read(tmp_path / "o.csv")] == ["mine"]


def test_a_new_store_on_a_read_only_file_system_is_one_line(tmp_path):
    from fs_helpers import in_read_only
    from reliability_helpers import TINY
    ro = tmp_path / "ro"
    ro.mkdir()
    res = in_read_only(ro, "run", *TINY, "--seq-lens", "16", "--backends", "naive", "--db", ro / "new.db")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "OSError" not in res.stderr, res.stderr
    assert lines[0].startswith("attnbench: error: ") and "new.db" in lines[0], lines[0]
    code = ("import attnbench\ntry:\n    attnbench.run(device='cpu', seq_lens='16', q_heads=1, head_size=8, "
            f"backends='naive', pass_='fwd', warmup=0, repeat=1, db={str(ro / 'new.db')!r})\n"
            "except Exception as exc:\n    print(type(exc).__name__, '|', exc)\n")
    res = in_read_only(ro, code=code)
    assert res.returncode == 0 and res.stdout.startswith("StoreError | "), res.stdout + res.stderr
    assert len(res.stdout.strip().splitlines()) == 1 and list(ro.iterdir()) == []


@pytest.mark.parametrize("suffix", ["csv", "json"])
def test_exports_take_a_path_as_text(tmp_path, suffix):
    from results_fixtures import synthetic_record

    from attnbench.results import export
    from attnbench.spec import AttnSpec
    rec = synthetic_record("r", AttnSpec(seqlens_q=(17,), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd"), "naive",
                           [1.0, 1.2])
    path = str(tmp_path / f"x.{suffix}")
    export.write([rec], path)
    assert [(row["run_id"], row["backend"], row["seq_len"]) for row in export.read(path)] == [("r", "naive", 17)]
