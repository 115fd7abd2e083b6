"""hvdflow: tasks."""
