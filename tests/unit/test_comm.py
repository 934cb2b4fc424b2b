"""Transfers through host memory (gloo): a staged receive lands in its CUDA buffer only after the wait."""

from __future__ import annotations

import torch

from attnbench.distributed.comm import _CopyBack


class _Req:
    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


def test_staged_transfer_copies_back_only_after_waiting():
    log = []
    target, host = torch.zeros(3), torch.tensor([1.0, 2.0, 3.0])
    work = _CopyBack([_Req(log), _Req(log)], [(target, host)], keep=[host])
    assert target.sum() == 0  # nothing lands before the wait
    work.wait()
    assert log == ["wait", "wait"] and torch.equal(target, host)
    host.fill_(9.0)
    work.wait()  # a second wait neither waits again nor copies again
    assert log == ["wait", "wait"] and torch.equal(target, torch.tensor([1.0, 2.0, 3.0]))
