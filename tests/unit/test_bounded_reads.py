"""Files the CLI reads (a batch trace, an --alibi-slopes file, a --config) are regular files of a bounded size,
read no further than the limit and parsed without overflowing a stack: anything else is one line and exit
status 2, at once, with nothing written."""

import os
import resource
import subprocess
import sys
import time

import pytest
from reliability_helpers import env
from results_fixtures import cli

from attnbench import serving
from attnbench.results import files

RUN = ["run", "--device", "cpu", "--backends", "naive", "--q-heads", "1", "--head-size", "8", "--dtype", "fp32",
       "--warmup", "0", "--repeat", "1", "--quiet"]
MEMORY = 4 * 2**30
"""Address space a refusing command may take (torch's import takes under 1 GiB): reading /dev/zero would not fit."""


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def attnbench_bounded(*args, timeout=120):
    """`attnbench ARGS` in a process that may not take more than MEMORY, nor more than ``timeout`` seconds."""
    start = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "attnbench", *map(str, args)], capture_output=True, text=True,
                             env=env(), timeout=timeout, preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        pytest.fail(f"attnbench {' '.join(map(str, args))} still ran after {timeout} s")
    return res, time.monotonic() - start


def _refused(res, *needles):
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("attnbench: error:"), res.stderr[-2000:]
    for needle in needles:
        assert needle in res.stderr, res.stderr


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("source", ["/dev/zero", "/dev/urandom", "fifo"])
def test_a_trace_that_is_not_a_file_is_refused_without_reading_it(tmp_path, fifo, source):
    path = fifo if source == "fifo" else source
    db = tmp_path / "r.db"
    res, _ = attnbench_bounded(*RUN, "--db", db, "--batch-trace", path)
    _refused(res, "not a regular file")
    config = tmp_path / "c.yaml"
    config.write_text(f"batch_trace: {path}\n")
    res, _ = attnbench_bounded(*RUN, "--db", db, "--config", config)
    _refused(res, "not a regular file")
    res, _ = attnbench_bounded(*RUN, "--seq-lens", "17", "--db", db, "--alibi-slopes", path)
    _refused(res, "--alibi-slopes")
    assert not db.exists()


def test_a_trace_far_larger_than_any_is_refused_by_its_size(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:  # 160 MiB that take no disk (a sparse file)
        fh.truncate(160 * 2**20)
    res = cli(*RUN, "--db", tmp_path / "r.db", "--batch-trace", path)
    _refused(res, "160.0 MiB", "64 MiB at most")
    assert not (tmp_path / "r.db").exists()


def test_a_file_that_grows_while_read_is_read_no_further_than_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text('{"requests": [[1, 2]]}\n')
    real = os.fstat

    def growing(fd):  # the file passed the size check, then grew to a gigabyte before it was read
        with open(path, "ab") as fh:
            fh.truncate(2**30)
        return real(fd)
    monkeypatch.setattr(files.os, "fstat", growing)
    asked = []
    real_read = os.read
    monkeypatch.setattr(files.os, "read", lambda fd, n: asked.append(n) or real_read(fd, n))
    with pytest.raises(files.FileRefused, match="more than such a file ever needs"):
        files.read_text(path, 2**20, "trace")
    assert sum(asked) <= 2**20 + 1


@pytest.mark.parametrize("text", ["[" * 100_000, '{"requests": ' + "[" * 100_000 + "\n"], ids=["json", "jsonl"])
def test_a_deeply_nested_trace_is_one_line(tmp_path, text):
    path = tmp_path / "deep.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match="nested too deeply"):
        serving.read_trace(path)
    res = cli(*RUN, "--db", tmp_path / "r.db", "--batch-trace", path)
    _refused(res, "nested too deeply")
    assert "RecursionError" not in res.stderr


def test_read_text_refuses_what_is_not_a_bounded_regular_file(tmp_path, fifo):
    start = time.monotonic()
    for path, needle in ((fifo, "a pipe"), ("/dev/zero", "a device"), (tmp_path, "a folder"),
                         (tmp_path / "none", "cannot read it")):
        with pytest.raises(files.FileRefused, match=needle):
            files.read_text(path, 2**20, "trace")
    assert time.monotonic() - start < 10  # a pipe without a writer is not waited for
    path = tmp_path / "crlf.yaml"
    path.write_bytes(b"a: 1\r\nb: 2\r\n")
    assert files.read_text(path, 2**20, "--config") == "a: 1\nb: 2\n"  # as open() in text mode reads it
