"""embedfleet: serving for text-embedding and reranking models over NATS.

One import name for the project's two packages, which keep their folders at the repository's top level:
``embedfleet.shared`` (the library every service imports: wire protocol, subjects, config, NATS) is
``shared/``, and ``embedfleet.services`` (gateway, tokenizer, gpu_worker, scorer and the commands) is
``services/``. setup.py maps the names to the folders (setuptools' package-dir), for a wheel and an editable
install alike; ``import shared`` names no module of the project.
"""
