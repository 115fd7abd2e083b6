"""Image work spread over Spark tasks, and each partition's part file name: by its number, so a
task that Spark retries rewrites the same files instead of adding new ones."""

from __future__ import annotations


def assign_partitions(weights: list[int], partitions: int) -> list[int]:
    """Consecutive items to each partition, balanced by weight (records per item)."""
    total = max(1, sum(weights))
    assigned, before = [], 0
    for weight in weights:
        assigned.append(min(partitions - 1, before * partitions // total))
        before += weight
    return assigned


def part_name(partition: int, suffix: str = "parquet") -> str:
    return f"part-{partition:05d}.{suffix}"
