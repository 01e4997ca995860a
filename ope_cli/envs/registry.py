"""The environments of ``ope generate``, by name."""

from __future__ import annotations

from ope_cli.envs import bandit, chain, control, gaussian
from ope_cli.envs.base import Environment

ENVIRONMENTS: dict[str, Environment] = {
    module.ENVIRONMENT.name: module.ENVIRONMENT for module in (bandit, chain, control, gaussian)
}
