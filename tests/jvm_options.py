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
  the classes it loaded at exit (``-XX:ArchiveClassesAtExit``), into hvdflow's cache. A JVM
  takes an archive whose class path names other files than its own for a mismatch, unless the
  files are the same ones (Java compares their inodes): every clone's environment hardlinks its
  Spark jars from one template (scripts/setup.sh), so the archive is keyed by the jars' inodes
  and dumped from a folder of hardlinks to them kept beside it in the cache. A clean clone then
  finds the archive a clone before it made, instead of dumping one of its own (about 21 s before
  each profile's tests, twice a CI run). The
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
# Archives kept in the cache: the newest few. The key follows the jars' inodes: a clone whose
# jars are copies, not links, adds one of ~150 MB; unpruned, they filled this machine's disk
# once. A JVM started with an archive that has gone since runs without one (Java 17,
# -Xshare:auto).
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

    spark_home = Path(pyspark.__file__).parent
    identity = jars_identity(spark_home / "jars")
    key = hashlib.sha256(f"{os.path.realpath(java)}|{identity}|{pyspark.__version__}".encode())
    archive = cache_root() / "jvm" / f"spark-{key.hexdigest()[:16]}.jsa"
    if archive.exists() or not make:
        return archive if archive.exists() else None
    try:
        with machine_lock(f"{archive}.lock", DUMP_TIMEOUT_S, "the Spark class archive"):
            if not archive.exists():
                _dump(archive, _linked_spark_home(spark_home, archive.with_suffix("")))
                prune_archives(archive.parent, KEEP_ARCHIVES)
    except (OSError, subprocess.SubprocessError, TimeoutError) as e:
        print(f"tests: no Spark class archive ({e}); JVMs start without one", file=sys.stderr)
        return None
    return archive


def jars_identity(jars: Path) -> str:
    """The jars as files, not paths: each one's name, inode, size and time. The same in every
    clone whose jars are hardlinks of one template's; another in a clone that copied them."""
    entries = []
    for entry in sorted(os.scandir(jars), key=lambda e: e.name):
        if not entry.is_file():  # a folder (connect-repl) is each clone's own
            continue
        st = entry.stat()
        entries.append(f"{entry.name}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _linked_spark_home(spark_home: Path, dest: Path) -> Path:
    """A Spark home in the cache whose jars are hardlinks of ``spark_home``'s: the archive's
    class path then names files that outlive the clone (a Spark home of its own where the cache
    is on another file system, as before)."""
    if dest.is_dir():
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for part in ("bin", "jars"):
            shutil.copytree(spark_home / part, partial / part, copy_function=os.link)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        return spark_home
    os.replace(partial, dest)
    return dest


def prune_archives(folder: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest archives in ``folder`` (their lock files and linked
    Spark homes too)."""
    archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in archives[keep:]:
        for path in (old, old.with_name(old.name + ".lock")):
            path.unlink(missing_ok=True)
        shutil.rmtree(old.with_suffix(""), ignore_errors=True)
        removed.append(old)
    return removed


def _dump(archive: Path, spark_home: Path) -> None:
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    env = {
        **os.environ,
        "JDK_JAVA_OPTIONS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {QUIET_CDS}",
        "SPARK_HOME": str(spark_home),
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
