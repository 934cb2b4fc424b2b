"""The copy-engine all-to-all's host side, on the CPU: the driver's copy descriptor and the views it refuses."""

from __future__ import annotations

import ctypes

import pytest
import torch

from attnbench.distributed import copy_engine


def test_the_copy_descriptor_has_cuda_h_layout():
    # CUDA_MEMCPY2D on a 64-bit host: 16 fields, each memory type an int padded to 8 bytes, 128 bytes in all; a
    # field out of place would hand the driver a wrong pitch or pointer.
    offsets = {name: getattr(copy_engine._Copy2D, name).offset for name, _ in copy_engine._Copy2D._fields_}
    assert ctypes.sizeof(copy_engine._Copy2D) == 128
    assert offsets["srcDevice"] == 32 and offsets["srcPitch"] == 48
    assert offsets["dstDevice"] == 88 and offsets["dstPitch"] == 104 and offsets["Height"] == 120


def test_pitch_is_the_row_stride_of_dense_rows():
    x = torch.zeros(8, 6, 16, dtype=torch.bfloat16)
    assert copy_engine._pitch(x[:, 2:4]) == 6 * 16 * 2  # a head slice: rows 192 bytes apart, 64 wide
    assert copy_engine._pitch(x[3].reshape(1, 6, 16)) == 192
    with pytest.raises(ValueError, match="dense rows"):
        copy_engine._pitch(x[:, :, :8])  # each row is 6 runs of 8: not one block
    with pytest.raises(ValueError, match="2-D copy of"):  # shapes or dtypes that differ, before any driver call
        copy_engine.copy_rows(torch.zeros(8, 2, 16), x[:, :2], None)
