"""The `ssmcheck` command's entry: first start the compiling helpers a GPU sweep (scan, drift) will want
(core.prestart), so that they import torch and triton beside the command, which does so as it imports the CLI."""

import sys

from ssmcheck.core import prestart


def main() -> None:
    prestart.for_command(sys.argv[1:])
    from ssmcheck.cli import main as cli  # noqa: PLC0415 (after the helpers have started: it imports torch)

    cli()
