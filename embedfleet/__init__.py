"""embedfleet: serving for text-embedding and reranking models over NATS.

One import namespace for the project's two packages, which keep their folders at the repository's top
level: ``embedfleet.shared`` (the library every service imports: wire protocol, subjects, config, NATS
lifecycle) is ``shared/``, and ``embedfleet.services`` (gateway, tokenizer, gpu_worker, scorer and the
CLI) is ``services/``; this folder links to both. A built wheel holds them as real folders under
``embedfleet/``; nothing installs a top-level ``shared`` or ``services``.
"""
