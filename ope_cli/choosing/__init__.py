"""From the estimates to a choice among policies (plain NumPy): ``paired`` (the paired sums
of several policies on the same episodes), ``comparison`` (--baseline: paired differences
and their intervals, the run's selection block) and ``selection`` (--truth and the
selection metrics, could-be-best sets)."""
