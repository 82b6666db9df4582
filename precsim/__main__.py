"""``python -m precsim``: runs the command line of :mod:`precsim.cli`."""

from precsim.cli import entry

if __name__ == "__main__":
    entry()
