"""Refuse to send model parameters in the clear on a cluster that asked for encryption.

Gloo's and TensorFlow's collectives carry gradients (and the training data they are computed
from) unencrypted. A cluster with ``spark.ssl.enabled`` said its traffic must not be, so the
runners refuse, as Databricks' HorovodRunner and spark-tensorflow-distributor do, unless the
cluster's owner set the override conf to ``true``.
"""

from __future__ import annotations

import logging

from hvdflow.infra.launcher.errors import EncryptionRequired

logger = logging.getLogger(__name__)

SSL_ENABLED = "spark.ssl.enabled"


def conf_boolean(conf, key: str, default: str = "false") -> bool:
    """A boolean Spark conf, read as Scala does: ``true`` or ``false`` in any case."""
    value = str(conf.get(key, default)).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"the Spark conf {key}={value!r}: expected true or false")
    return value == "true"


def refuse_unencrypted(conf, who: str, override_key: str) -> None:
    """Raise EncryptionRequired where ``conf`` enables SSL and ``override_key`` is not true."""
    if not conf_boolean(conf, SSL_ENABLED):
        return
    if conf_boolean(conf, override_key):
        logger.warning(
            "%s: this cluster has TLS encryption enabled (%s=true) but %s does not encrypt "
            "its traffic; %s=true overrides that: model parameters and possibly training data "
            "cross the network unencrypted",
            who,
            SSL_ENABLED,
            who,
            override_key,
        )
        return
    raise EncryptionRequired(
        f"this cluster has TLS encryption enabled ({SSL_ENABLED}=true), but {who} does not "
        "encrypt the model parameters and training data its workers exchange. To run anyway, "
        f"set {override_key}=true in the Spark configuration (they will cross the network "
        "unencrypted)"
    )
