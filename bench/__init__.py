"""hvdflow: bench."""
