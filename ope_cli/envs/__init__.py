"""``ope generate``'s environments, whose evaluation policies' values are known exactly.

``base`` (the Environment record and shared helpers), one module per environment
(``bandit``, ``chain``, ``control``, ``gaussian``), ``registry`` (them by name),
``rollout`` (the vmapped, scanned JAX rollout engine) and ``writer`` (logs, policies).
``ope_cli.envs.generate.generate`` puts them together.
"""
