"""From padded batches to estimates: ``estimators`` (the plug-ins and their batch
reduction), ``run_plan`` (option checks and the interval plan, before any data is read),
``kernel`` and ``kernel_cache`` (the jitted, vmapped, sharded kernels and how they
compile), ``bootstrap_counts``, ``stats`` (mergeable accumulators), ``intervals``,
``distributed`` (multi-process runs), ``inputs`` (what an evaluation reads and fits
first) and ``pipeline`` (the one loop: stream and evaluate)."""
