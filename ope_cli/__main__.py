"""``python -m ope_cli``: the ``ope`` command."""

from ope_cli.cli import main

main()
