"""Tokenizer fleet: text -> packed token IDs for the workers (HF tokenizers, CPU)."""
