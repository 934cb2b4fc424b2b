"""Context parallelism: ring, zigzag, Ulysses and USP attention on torch.distributed (see docs/distributed.md)."""
