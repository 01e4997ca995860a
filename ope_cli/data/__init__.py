"""From a source to episodes, before any device (NumPy and pyarrow only): ``sources``
read record batches, ``columns`` resolves the column roles, ``decode`` turns Arrow
columns into NumPy, ``validate`` checks them, ``ids`` keys the episodes, ``steps`` and
``episodes`` assemble them, ``episode_stream`` is the one entry every command reads
through, ``buckets`` pads them into batches; ``convert`` writes any source as step-layout
Parquet (``ope convert``)."""
