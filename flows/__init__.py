"""hvdflow: flows."""
