"""The executors' JVM options hvdflow adds on a standalone master: their temporary folder.

A standalone worker starts each executor in a work folder of its own (work/app-id/executor-id),
kept with the executor's logs. The JVM's temporary files (the native libraries that lz4-java,
snappy-java and zstd-jni unpack, deleted only when the JVM exits cleanly) go there too, not into
the host's /tmp, where every executor killed with its task would leave its copies for good. YARN
does the same for its containers (``-Djava.io.tmpdir=$PWD/tmp``); Kubernetes' pods take theirs
with them. Pure: no pyspark import, so the services' CLI can use it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hvdflow.infra import constants as c

EXECUTOR_TMPDIR_OPTION = "-Djava.io.tmpdir=."


def spark_defaults(conf_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """The settings of ``spark-defaults.conf`` in ``conf_dir`` (default ``$SPARK_CONF_DIR``, else
    ``$SPARK_HOME/conf``), as spark-submit reads them: a key, then whitespace, ``=`` or ``:``,
    then its value."""
    conf_dir = (
        conf_dir
        or os.environ.get("SPARK_CONF_DIR")
        or os.path.join(os.environ.get("SPARK_HOME", ""), "conf")
    )
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in (raw.strip() for raw in lines):
        setting = re.match(r"([^\s=:]+)(?:\s*[=:]\s*|\s+)(.*)", line)
        if setting and not line.startswith(("#", "!")):
            found[setting[1]] = setting[2].strip()
    return found


def executor_java_options(
    master: str,
    extra: Mapping[str, str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """On a standalone master (``spark://``), the executors' JVM options with their temporary
    folder in their own work folder: added to what ``extra`` or spark-defaults.conf
    (``defaults``: its settings, when not the caller's own ``spark_defaults()``) give them, and
    nothing where those name a temporary folder already (or the master is another)."""
    if not master.startswith("spark://"):
        return {}
    key = c.SPARK_EXECUTOR_EXTRA_JAVA_OPTIONS
    given = (extra or {}).get(key) or (spark_defaults() if defaults is None else defaults).get(
        key, ""
    )
    if "-Djava.io.tmpdir=" in given:
        return {}
    return {key: f"{given} {EXECUTOR_TMPDIR_OPTION}".strip()}
