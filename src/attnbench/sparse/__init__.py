"""DeepSeek sparse attention (V3.2 "DSA", V4): MLA over the cache rows a lightning indexer selects per query.

``reference.py`` the exact index-selected MLA (forward, backward) returning ``Outputs``; ``baseline.py`` the same
in plain PyTorch math in the input dtype; ``fp8.py`` V3.2's 656-byte FP8 cache rows; ``indexer.py`` the indexer's
logits, its top-k and the check of a kernel's selection; ``indices.py`` seeded inputs and index lists (random,
prefix, sliding window, indexer); ``counts.py`` FLOPs and bytes of the selected tokens; ``flashmla.py`` calls of
FlashMLA's sparse prefill and sparse FP8 decode. ``docs/sparse.md`` says how they fit together.
"""
