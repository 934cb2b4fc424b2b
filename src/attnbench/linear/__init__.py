"""Linear attention and recurrent layers (Gated DeltaNet, KDA, Mamba2/SSD, gated linear attention): the problem
(``spec``), its seeded inputs (``inputs``), the exact recurrence (``reference``), the PyTorch forms a user would
write (``torch_forms``), the FLOP and byte conventions (``metrics``) and fla's kernels (``fla``)."""
