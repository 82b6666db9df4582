"""``python -m precsim``: runs the command line of :mod:`precsim.cli`."""

try:
    from precsim.cli import entry
except KeyboardInterrupt:  # Ctrl-C while Python loads the command line: one line, no traceback
    import sys

    print("precsim: interrupted (SIGINT) before a run started; nothing to resume",
          file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    entry()
