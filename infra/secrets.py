"""Secrets stay out of every record: references resolved where used, URLs shown without them.

A parameter that must carry a secret (a weights URL with a password or a signed query, a value in
``horovod.extra_env``) can name where the secret lives instead of holding it:

- ``env:NAME``: the environment variable ``NAME`` of the process that uses it (the driver);
- ``secret:block-name``: the Prefect Secret block ``block-name``
  (``prefect.blocks.system.Secret(value=...).save("block-name")``).

Records then hold the reference; ``resolve`` turns it into the value only where it is used. A
literal that plainly is a secret (``literal_secret``) is refused where a flow's parameters are
checked, since Prefect keeps flow-run parameters as given. ``redact_url`` is how a URL is shown.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote, urlsplit, urlunsplit

from hvdflow.infra import constants as c
from hvdflow.infra._env import temporary_env

ENV_PREFIX = "env:"
SECRET_PREFIX = "secret:"
# What replaces a URL's query string (a presigned URL's signature and token live there).
REDACTED = "<redacted>"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefect's rule for block document names.
_BLOCK_NAME = re.compile(r"[a-z0-9-]+")


# A URL that carries a secret: a password before the host, or a query parameter that signs or
# authorizes the request (presigned URLs, Azure SAS, ?token=). Also used in Prefect's parameter
# schema, so no inline flags (JSON Schema's regular expressions are ECMA 262's).
SECRET_URL_PATTERN = (
    r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@"
    r"|[?&]([A-Za-z-]*[Ss]ignature|[Ss]ig|[A-Za-z_-]*[Tt]oken|[Aa]pi_?[Kk]ey|[Kk]ey|[Ss]ecret"
    r"|[Pp]assword|[Cc]redential|[A-Za-z-]*[Aa]uth[A-Za-z_]*)="
)
# An environment variable whose name says it holds a secret (AWS_SECRET_ACCESS_KEY, HF_TOKEN,
# DB_PASSWORD, ...): its value must come by reference.
SECRET_NAME_PATTERN = (
    r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH|SIGNATURE)"
    r"|([Kk]ey|[Ss]ecret|[Tt]oken|[Pp]assword|[Cc]redential|[Aa]uth)"
)
_SECRET_URL = re.compile(SECRET_URL_PATTERN)
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
# What a refused literal is told to become.
BY_REFERENCE = (
    "pass it by reference: 'env:NAME' (the variable NAME where the flow runs) or "
    "'secret:block-name' (a Prefect Secret block); Prefect keeps flow-run parameters as given"
)


def literal_secret(value: str, name: str | None = None) -> str | None:
    """Why ``value`` (optionally of variable ``name``) is a secret that must not be a flow
    parameter, or None."""
    if is_reference(value) or not value:
        return None
    if name is not None and _SECRET_NAME.search(name):
        return "is a literal for a variable named like a secret"
    found = _SECRET_URL.search(value)
    if found is None:
        return None
    return "holds a password" if found.group(0).endswith("@") else "holds a signed query"


def is_reference(value: str) -> bool:
    """Whether ``value`` names where a secret is (``env:NAME``, ``secret:block-name``)."""
    return value.startswith((ENV_PREFIX, SECRET_PREFIX))


# Each kind of reference: its prefix, what may follow it, and how to say so.
_REFERENCE_SYNTAX = (
    (
        ENV_PREFIX,
        _ENV_NAME,
        "an environment variable name follows 'env:' (letters, digits and '_', not starting "
        "with a digit), e.g. 'env:WEIGHTS_URL'",
    ),
    (
        SECRET_PREFIX,
        _BLOCK_NAME,
        "a Prefect Secret block name follows 'secret:' (lower-case letters, digits and '-'), "
        "e.g. 'secret:weights-url'",
    ),
)


def check_reference(value: str, what: str) -> str:
    """``value`` if it is a literal or a well-formed reference; else ValueError naming ``what``."""
    for prefix, pattern, syntax in _REFERENCE_SYNTAX:
        if value.startswith(prefix) and not pattern.fullmatch(value[len(prefix) :]):
            raise ValueError(f"{what} {value!r}: {syntax}")
    return value


def resolve(value: str, what: str = "value") -> str:
    """The value ``value`` refers to, or ``value`` itself when it is a literal. Never puts the
    secret in an error; ``what`` names the parameter in messages."""
    check_reference(value, what)
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        resolved = os.environ.get(name)
        if resolved is None:
            raise RuntimeError(
                f"{what} {value!r} refers to the environment variable {name}, which is not set "
                "on the driver: export it where the flow runs, or pass another reference"
            )
        return resolved
    if value.startswith(SECRET_PREFIX):
        return _secret_block(value[len(SECRET_PREFIX) :], value, what)
    return value


def _secret_block(name: str, value: str, what: str) -> str:
    from prefect.blocks.system import Secret

    try:
        block = Secret.load(name, _sync=True)
    except Exception as e:  # a missing block, an unreachable API: both say the same to fix
        raise RuntimeError(
            f"{what} {value!r}: the Prefect Secret block {name!r} could not be loaded "
            f"({type(e).__name__}): create it with "
            f"`Secret(value=...).save({name!r})` on the Prefect server this flow uses"
        ) from None
    secret = block.value.get_secret_value()
    if not isinstance(secret, str):
        raise RuntimeError(
            f"{what} {value!r}: the Prefect Secret block {name!r} holds a "
            f"{type(secret).__name__}; expected a string"
        )
    return secret


def redact_url(url: str) -> str:
    """``url`` without user:password, its query string replaced and its fragment dropped; a value
    that is not a URL with a host (a path, ``env:NAME``) as it is."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    try:
        port = parts.port
    except ValueError:  # not a number: show no port rather than fail while reporting
        port = None
    if port:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, REDACTED if parts.query else "", ""))


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without user:password, and the user name and password it carried (decoded)."""
    parts = urlsplit(url)
    if not parts.netloc or "@" not in parts.netloc:
        return url, None, None
    host = parts.netloc.rsplit("@", 1)[1]
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return bare, user, password


@contextmanager
def tracking_login(uri: str) -> Iterator[str]:
    """``uri`` without the user:password it may carry, which MLflow's client gets another way.

    MLflow prints the tracking URI ("View run at", errors), so a password in it would reach the
    logs. While open, the login is in MLFLOW_TRACKING_USERNAME/PASSWORD (those already set win)
    and MLFLOW_TRACKING_URI holds the bare URI; ranks inherit both.
    """
    bare, user, password = split_userinfo(uri)
    if user is None and password is None:
        yield uri
        return
    env = {c.MLFLOW_TRACKING_URI: bare}
    if not (
        os.environ.get(c.MLFLOW_TRACKING_USERNAME) or os.environ.get(c.MLFLOW_TRACKING_PASSWORD)
    ):
        env[c.MLFLOW_TRACKING_USERNAME] = user or ""
        env[c.MLFLOW_TRACKING_PASSWORD] = password or ""
    with temporary_env(env):
        yield bare
