"""``python -m dlscale``: the ``dlscale`` command (the same entry point as the console script)."""

from dlscale.cli.app import main

if __name__ == "__main__":
    main()
