"""Checkpoints of a training run in the object store (or a folder), so a retry loses no epoch.

Layout under the run's checkpoint URL (``s3://bucket/prefix/checkpoints/<mlflow run id>`` in the
pipeline, or a local folder)::

    epoch-0003/ckpt.index, epoch-0003/ckpt.data-00000-of-00001   TensorFlow's checkpoint files
    latest.json                                                   which epoch folder counts

Only ``latest.json`` makes a checkpoint exist, written after every file of its folder: an upload
cut off half way is only a folder nothing points to. A checkpoint holds the model's and the
optimizer's variables and, in ``latest.json``, the finished epochs' metrics and times, so a
resumed run's history covers every epoch exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from hvdflow.infra.errors import disk_full_as
from hvdflow.infra.storage.uris import parse_uri

logger = logging.getLogger(__name__)

LATEST = "latest.json"
_PREFIX = "ckpt"
_EPOCH_FOLDER = re.compile(r"^epoch-(\d+)$")


@dataclass(frozen=True)
class CheckpointState:
    """What ``latest.json`` says: ``epoch`` epochs finished, their metrics and times."""

    epoch: int
    folder: str
    history: dict[str, list[float]] = field(default_factory=dict)
    epoch_times: list[float] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "folder": self.folder,
                "history": self.history,
                "epoch_times": self.epoch_times,
                "written_at": time.time(),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CheckpointState:
        raw = json.loads(data)
        return cls(
            epoch=int(raw["epoch"]),
            folder=str(raw["folder"]),
            history={k: [float(v) for v in vs] for k, vs in raw.get("history", {}).items()},
            epoch_times=[float(t) for t in raw.get("epoch_times", [])],
        )


def epoch_folder(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def _disk_full_said(state: CheckpointState, where: str, what: str):
    """A full disk under ``where`` as a (transient) DiskFullError naming the checkpoint."""
    return disk_full_as(
        f"checkpoint {state.folder} could not be written: no space left on device in "
        f"{where} ({what}). The last complete checkpoint still counts: nothing points at "
        "this one. Free space there, or point TMPDIR (where ranks write a checkpoint "
        "before uploading it) at a larger disk"
    )


def _restore_disk_full_said(state: CheckpointState, url: str, where: str):
    """A full disk while ``state``'s files download to ``where`` as a DiskFullError."""
    return disk_full_as(
        f"checkpoint {state.folder} could not be restored: no space left on device in "
        f"{os.path.dirname(where)} (ranks download a checkpoint there before loading it). The "
        f"checkpoint is intact in {url}. Free space there, or point TMPDIR at a larger disk"
    )


def folders_to_remove(folders: list[str], keep: int, current: str) -> list[str]:
    """Epoch folders beyond the newest ``keep`` (never ``current``), and stray names never."""
    numbered = sorted(
        (int(m.group(1)), name) for name in folders if (m := _EPOCH_FOLDER.match(name))
    )
    kept = {name for _, name in numbered[-keep:]} | {current}
    return [name for _, name in numbered if name not in kept]


class _Folder:
    """Files under a local folder: written to a temporary name, then renamed into place."""

    def __init__(self, root: str):
        self.root = root

    def put_file(self, path: str, name: str) -> None:
        target = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target + ".part")
        os.replace(target + ".part", target)

    def put_bytes(self, data: bytes, name: str) -> None:
        target = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target + ".part", "wb") as f:
            f.write(data)
        os.replace(target + ".part", target)

    def get_bytes(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.root, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def get_file(self, name: str, path: str) -> None:
        shutil.copyfile(os.path.join(self.root, name), path)

    def list(self, folder: str) -> list[str]:
        where = os.path.join(self.root, folder)
        return sorted(os.listdir(where)) if os.path.isdir(where) else []

    def subfolders(self) -> list[str]:
        if not os.path.isdir(self.root):
            return []
        return [n for n in os.listdir(self.root) if os.path.isdir(os.path.join(self.root, n))]

    def remove(self, folder: str) -> None:
        shutil.rmtree(os.path.join(self.root, folder), ignore_errors=True)


class _Bucket:
    """Objects under an ``s3://`` prefix. A PUT is atomic: an object is whole or absent."""

    def __init__(self, url: str):
        from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)

        self.bucket, self.prefix = parse_uri(url.rstrip("/"))
        self.store = ObjectStore(ObjectStoreConfig.from_env(bucket=self.bucket))

    def _uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}/{name}"

    def put_file(self, path: str, name: str) -> None:
        self.store.upload_file(path, self._uri(name))

    def put_bytes(self, data: bytes, name: str) -> None:
        self.store.put_bytes(data, self._uri(name))

    def get_bytes(self, name: str) -> bytes | None:
        from hvdflow.infra.storage.object_store import ObjectStoreError  # noqa: PLC0415 (lazy: it loads boto3)

        try:
            return self.store.get_bytes(self._uri(name))
        except ObjectStoreError as e:
            if e.missing:
                return None
            raise

    def get_file(self, name: str, path: str) -> None:
        self.store.download_file(self._uri(name), path)

    def _keys(self, under: str = "") -> list[str]:
        start = f"{self.prefix}/{under}"
        return [key[len(self.prefix) + 1 :] for key in self.store.list_keys(start)]

    def list(self, folder: str) -> list[str]:
        return sorted(key.split("/", 1)[1] for key in self._keys(folder + "/"))

    def subfolders(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self._keys() if "/" in key})

    def remove(self, folder: str) -> None:
        for key in self._keys(folder + "/"):
            self.store.delete(self._uri(key))


class CheckpointStore:
    """The checkpoints of one training run at ``url`` (``s3://...`` or a folder), the newest
    ``keep`` of them kept."""

    def __init__(self, url: str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep={keep!r}: expected at least 1 checkpoint to keep")
        self.url = url.rstrip("/")
        self.keep = keep
        self._files = _Bucket(url) if url.startswith("s3://") else _Folder(url)
        self._restored: str | None = None  # the files of the restored checkpoint, on disk

    def latest(self) -> CheckpointState | None:
        """The newest complete checkpoint, or None when the run has none yet."""
        data = self._files.get_bytes(LATEST)
        return CheckpointState.from_json(data) if data is not None else None

    def save(self, checkpoint, state: CheckpointState) -> None:
        """Write ``checkpoint`` (a ``tf.train.Checkpoint``) as ``state.folder``, then point
        ``latest.json`` at it, then drop the folders beyond the newest ``keep``."""
        with tempfile.TemporaryDirectory(prefix="hvdflow-ckpt-") as workdir:
            with _disk_full_said(state, workdir, "written here before it is uploaded"):
                checkpoint.write(os.path.join(workdir, _PREFIX))
            with _disk_full_said(state, self.url, "its folder"):
                for name in sorted(os.listdir(workdir)):
                    self._files.put_file(os.path.join(workdir, name), f"{state.folder}/{name}")
                self._files.put_bytes(state.to_json(), LATEST)
        for folder in folders_to_remove(self._files.subfolders(), self.keep, state.folder):
            self._files.remove(folder)

    def restore(self, checkpoint, state: CheckpointState) -> None:
        """Load ``state``'s files into ``checkpoint``. Variables created later (an optimizer's
        moments, at the first step) read the files, which stay on disk until ``close``."""
        self.close()
        self._restored = tempfile.mkdtemp(prefix="hvdflow-ckpt-")
        try:
            with _restore_disk_full_said(state, self.url, self._restored):
                for name in self._files.list(state.folder):
                    target = os.path.join(self._restored, name)
                    self._files.get_file(f"{state.folder}/{name}", target)
        except BaseException:
            self.close()  # a partial download helps no one and holds the space that ran out
            raise
        checkpoint.read(os.path.join(self._restored, _PREFIX)).expect_partial()

    def close(self) -> None:
        """Remove the files ``restore`` downloaded (call once training has taken its first step)."""
        if self._restored:
            shutil.rmtree(self._restored, ignore_errors=True)
            self._restored = None
