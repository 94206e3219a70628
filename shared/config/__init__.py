"""Configuration: every option of every command declared once (options.py), one option's machinery
(option.py), and the settings built from parsed options that several roles share (fabric.py)."""
