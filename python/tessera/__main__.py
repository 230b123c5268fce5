"""The ``tessera`` command, installed with the package: ``tessera estimate MODEL ...`` (or
``python -m tessera ...``) runs the same command as the Rust build's binary, with the same
options, outputs and exit statuses."""

import sys

from . import _native


def main():
    """Runs the command with this process's arguments and exits with its status."""
    sys.stdout.flush()
    status = _native.command(["tessera", *sys.argv[1:]])
    sys.exit(status)


if __name__ == "__main__":
    main()
