"""The ``embedfleet`` command: its parser and dispatch (main.py), one module per command that is no
service of its own (check.py); `up`'s launcher is services/up/, reindex and the job commands services/jobs/.
``python -m embedfleet.services.cli ROLE ...`` is how `up` starts its children."""
