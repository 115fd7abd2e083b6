"""What a failed Spark job's error says, in one line a user can act on.

Spark wraps a task's Python error in py4j's Java traceback; the line that names what went wrong
is deep inside. Pure functions of the error's text.
"""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """The part of a (usually py4j-wrapped) Spark error that says what went wrong."""
    text = str(error).strip()
    if "cancelled" in text.lower():
        return "it was cancelled"
    lines = text.splitlines()
    # A Python error inside a task: its last traceback line names it. Spark 3 writes
    # "PythonException: Traceback ..."; Spark 4 (classic and Connect) "PythonException:
    # [PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback ...", after
    # a barrier stage's own first line, which says only that a task failed.
    for i, line in enumerate(lines):
        if "PythonException:" in line and "Traceback" in line:
            for follow in lines[i + 1 :]:
                if follow and not follow[0].isspace() and ":" in follow:
                    return follow.strip()[:500] + hint(follow)
    useful = [ln for ln in lines if ln.strip() and "An error occurred while calling" not in ln]
    return useful[0].strip()[:500] if useful else type(error).__name__


def hint(error_line: str) -> str:
    if error_line.startswith("ModuleNotFoundError"):
        return (
            " (executors must run a Python with hvdflow and horovod installed: set "
            "PYSPARK_PYTHON, or create the session with hvdflow.infra.spark.get_spark)"
        )
    return ""
