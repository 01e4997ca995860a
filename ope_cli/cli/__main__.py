"""``python -m ope_cli.cli``: the same as the ``ope`` command (the supervisor's worker)."""

from ope_cli.cli import main

main()
