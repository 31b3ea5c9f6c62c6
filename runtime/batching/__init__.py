"""Requests to engine steps: the step batcher, its scheduler, KV pages, prefix and answer
caches, sampling, prompt encoding, and lanes that overlap steps."""
