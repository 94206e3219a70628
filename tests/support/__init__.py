"""What the tests share: the processes of a fleet (procs.py), waiting (waiting.py), the tiny models and
model folders built for them, reference vectors, corpora, and each role's site as its image holds it."""
