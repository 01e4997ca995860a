"""``ope convert SRC OUT.parquet``: any source ``ope`` reads, as step-layout Parquet."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ope_cli.cli.console import table_console
from ope_cli.cli.groups import TABLE_OR_JSON_QUIET
from ope_cli.cli.options import (
    LOGGED_COLUMNS,
    Data,
    InspectFormat,
    Overwrite,
    ReadRows,
    column_group,
    option_groups,
)
from ope_cli.config import BatchingConfig, ColumnMapping
from ope_cli.report.formatting import document_header


@option_groups(output=TABLE_OR_JSON_QUIET, columns=column_group(*LOGGED_COLUMNS))
def convert(
    data: Data,
    out: Annotated[
        str,
        typer.Argument(
            metavar="OUT.parquet", help="The Parquet file to write (a local path or a URI)."
        ),
    ],
    *,
    overwrite: Overwrite = False,
    output: InspectFormat,  # --format
    read_rows: ReadRows = BatchingConfig.read_rows,
    columns: ColumnMapping,  # the "Columns" panel
) -> None:
    """Write DATA (Parquet, Arrow, a Minari dataset, a D4RL-style HDF5 file, object storage)
    as one step-layout Parquet file with the standard column names and ope metadata,
    streamed batch by batch. Prints what was written.

    Examples:

      ope convert minari:my-team/pick-place-v0 pick.parquet

      ope convert hopper-medium-v2.hdf5 hopper.parquet
    """
    from ope_cli.data.convert import ConvertConfig
    from ope_cli.data.convert import convert as write_parquet

    result = write_parquet(
        ConvertConfig(
            data=data,
            out=out,
            columns=columns,
            read_rows=read_rows,
            overwrite=overwrite,
        )
    )
    if output is InspectFormat.json:
        document = {**document_header("convert"), **result.to_dict()}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = table_console(width=120)
    console.print(f"{result.source} ({result.format}, {result.source_layout} layout)", markup=False)
    console.print(f"-> {result.out}: {result.steps:,} steps, step layout", markup=False)
    for name, source in result.columns.items():
        console.print(f"   {name:<24} <- {source}", markup=False)
    for source, why in result.dropped.items():
        console.print(f"   not written: {source} ({why})", markup=False)
