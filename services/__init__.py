"""embedfleet services: gateway, tokenizer, gpu_worker, scorer (each a process of its own)."""
