"""``python -m embedfleet.services.cli``: the ``embedfleet`` command, as `up` starts its children."""

from embedfleet.services.cli.main import main

if __name__ == "__main__":
    main()
