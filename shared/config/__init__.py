"""Configuration: every option of every command declared once, a module per part of the stack (sections/),
the commands and the sets of them options are declared for (commands.py), one option's machinery (option.py),
and the registry that looks options up and makes from them the parsers, the config fields, a child process's
arguments and the table of docs/options.md (registry.py; ``python -m embedfleet.shared.config.registry`` prints the table).
The settings built from parsed options that several roles share live with what they configure: the NATS
connection in shared/nats/config.py, bulk work's in shared/jobs/settings.py."""
