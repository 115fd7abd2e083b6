"""The JVM options of every JVM the suite starts (``JDK_JAVA_OPTIONS``): how Java starts, never
what Spark does.

The suite is CPU-bound on two cores, and its Spark JVMs (drivers, executors, the standalone
clusters' daemons) used about 570 of its 2,000 CPU-seconds, most of it starting up:

- C1 alone (``-XX:TieredStopAtLevel=1``): the JVMs live seconds to minutes and C2 never pays back;
  a local session's JVM CPU went from 20.9 to 10.6 s.
- Spark's classes from a class-data-sharing archive (``-XX:SharedArchiveFile``): a local session
  and a small job took 7.2 to 7.4 CPU-s of JVM without it and 3.3 to 3.4 with it (3 runs each);
  four Spark-heavy test files, 153 against 137 CPU-s of the whole machine.
  The archive is made once per machine and Spark installation, by a small local job that dumps
  the classes it loaded at exit (``-XX:ArchiveClassesAtExit``), into hvdflow's cache. The
  executors of a standalone cluster accept it too: their class path is the drivers' without its
  first entry (a ``hive-jackson/*`` that matches nothing), and ``-Xlog:class+path=info`` says ok
  for it. ``-Xlog:cds*=off`` keeps the JVM from talking about the archive on stdout, which
  ``spark-class`` reads as its command.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hvdflow.infra.storage.locks import cache_root, machine_lock

C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET_CDS = "-Xlog:cds*=off"
# A small local job that loads what a driver loads to start and run a job.
_DUMP_JOB = """
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.range(1000).selectExpr("sum(id)").collect()
spark.createDataFrame([(1, "a")], "n int, s string").groupBy("s").count().collect()
jvm = SparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the gateway JVM exits at its stdin's end, writing the archive as it goes
jvm.wait(timeout=120)
"""
DUMP_TIMEOUT_S = 300.0
# Archives kept in the cache: the newest few. The key follows the jars' path (an archive made
# for one clone's venv does not fit another's class path), so every clone of a CI machine adds
# one of ~150 MB; unpruned, they filled this machine's disk. A JVM started with an archive that
# has gone since runs without one (Java 17, -Xshare:auto).
KEEP_ARCHIVES = 4


def jvm_options(make_archive: bool) -> str:
    """The suite's JDK_JAVA_OPTIONS: C1 alone, and the Spark class archive when there is one
    (made first when ``make_archive``). Best effort: without an archive, C1 alone."""
    archive = spark_class_archive(make_archive)
    options = [C1_ONLY]
    if archive is not None:
        options += [f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    return " ".join(options)


def spark_class_archive(make: bool) -> Path | None:
    """This machine's archive of the Spark driver's classes; made when missing and ``make``."""
    java = shutil.which("java")
    if java is None:
        return None
    import pyspark  # noqa: PLC0415 (only for the path and version of its jars)

    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256(f"{os.path.realpath(java)}|{jars}|{pyspark.__version__}".encode())
    archive = cache_root() / "jvm" / f"spark-{key.hexdigest()[:16]}.jsa"
    if archive.exists() or not make:
        return archive if archive.exists() else None
    try:
        with machine_lock(f"{archive}.lock", DUMP_TIMEOUT_S, "the Spark class archive"):
            if not archive.exists():
                _dump(archive)
                prune_archives(archive.parent, KEEP_ARCHIVES)
    except (OSError, subprocess.SubprocessError, TimeoutError) as e:
        print(f"tests: no Spark class archive ({e}); JVMs start without one", file=sys.stderr)
        return None
    return archive


def prune_archives(folder: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest archives in ``folder`` (and their lock files)."""
    archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in archives[keep:]:
        for path in (old, old.with_name(old.name + ".lock")):
            path.unlink(missing_ok=True)
        removed.append(old)
    return removed


def _dump(archive: Path) -> None:
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    env = {
        **os.environ,
        "JDK_JAVA_OPTIONS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {QUIET_CDS}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Spark's Python workers: this Python, not the first python3 on PATH (another version
        # in the current profile, which Spark refuses).
        "PYSPARK_PYTHON": sys.executable,
    }
    subprocess.run(
        [sys.executable, "-c", _DUMP_JOB],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=DUMP_TIMEOUT_S,
        check=True,
    )
    os.replace(partial, archive)
