"""`python -m attest ...` (and the `attest` command a wheel installs): the attest command
line, the same parser and subcommands as the executable (tools/attest/cli_main.h), owning the
process as the executable does (it ends by a stop signal after killing its children)."""

import sys

from . import _core


def main():
    sys.stdout.flush()
    sys.exit(_core.cli(sys.argv[1:], True))


if __name__ == "__main__":
    main()
