"""This user's signing secret and the keys derived from it.

32 random bytes in a file (mode 0600) next to the trust database, created on first
use (once, even when processes race). Nothing else is secret: everything
`signing` computes is keyed by it. This module imports no other nbrewind package
except ``nbrewind.errors``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import StoreError

__all__ = ["Keys", "secret_path", "trust_db_path", "user_keys"]


def trust_db_path() -> Path:
    """The trust database: ``NBREWIND_TRUST_DB``, else under the Jupyter data dir."""
    explicit = os.environ.get("NBREWIND_TRUST_DB")
    if explicit:
        return Path(explicit).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "nbrewind" / "trust.db"


def secret_path() -> Path:
    """This user's signing secret: beside the trust database, named after it
    (``trust.db`` -> ``trust.secret``), so ``NBREWIND_TRUST_DB`` moves both."""
    db = trust_db_path()
    return db.with_name(db.stem + ".secret")


@dataclass(frozen=True)
class Keys:
    """Keys derived from the secret, one per purpose."""

    rows: bytes
    stores: bytes
    refs: bytes
    key_id: str
    """Names this user's head in a catalog's ``meta`` (a hash, revealing nothing)."""


_keys: dict[str, Keys] = {}
_keys_lock = threading.Lock()


def user_keys() -> Keys:
    """The keys of the secret at ``secret_path()``, created on first use."""
    path = secret_path()
    cache_key = str(path)
    keys = _keys.get(cache_key)
    if keys is None:
        with _keys_lock:
            keys = _keys.get(cache_key)
            if keys is None:
                secret = _read_or_create_secret(path)
                keys = _keys[cache_key] = Keys(
                    rows=hmac.digest(secret, b"nbrewind catalog rows v1", "sha256"),
                    stores=hmac.digest(secret, b"nbrewind store signatures v1", "sha256"),
                    refs=hmac.digest(secret, b"nbrewind refs v1", "sha256"),
                    key_id=hashlib.sha256(b"nbrewind key id v1" + secret).hexdigest()[:16],
                )
    return keys


def _read_or_create_secret(path: Path) -> bytes:
    for _ in range(50):
        try:
            text = path.read_text("ascii").strip()
        except FileNotFoundError:
            try:
                _create_secret(path)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the NBRewind signing secret {path} ({exc}); set NBREWIND_TRUST_DB "
                    f"to a file in a folder you can write"
                ) from exc
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(
                f"cannot read the NBRewind signing secret {path} ({exc}); make it readable by you "
                f"(on a cluster: on every node), or set NBREWIND_TRUST_DB to a folder you own"
            ) from exc
        if len(text) == 64:
            try:
                return bytes.fromhex(text)
            except ValueError:
                pass
        if not text:
            time.sleep(0.01)  # another process is creating it right now
            continue
        break
    raise StoreError(
        f"the NBRewind signing secret {path} is damaged; delete it (every store then needs "
        f"`jupyter nbrewind trust` once)"
    )


def _create_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a secret another process just made
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: create it in place (readers wait for it)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, tmp.read_bytes())
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        tmp.unlink()
