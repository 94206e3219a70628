"""``python -m embedfleet``: the same CLI as the ``embedfleet`` command."""

from embedfleet.services.cli.main import main

if __name__ == "__main__":
    main()
