"""whale-lab: jointly optimise an LLM agent's weights and its harness (WHALE)."""

__version__ = "0.1.0"
