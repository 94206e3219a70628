"""embedfleet services: gateway, tokenizer, gpu_worker, scorer (each a process of its own)."""

if __name__ != "embedfleet.services":  # the folder on sys.path (the repository's root), not the package
    raise ImportError(f"{__name__}: the project's modules are imported as embedfleet.services.*, never as services.*")
