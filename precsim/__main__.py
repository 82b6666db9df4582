"""``python -m precsim``: runs the command line of :mod:`precsim.cli`."""

from precsim.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
