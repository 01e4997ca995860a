"""ope: offline policy evaluation of RL policies over logged episodes."""

__version__ = "0.1.0"
