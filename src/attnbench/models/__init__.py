"""End-to-end models with swappable attention: a Llama-style LLM, diffusers DiTs, and the swap itself."""
