"""The keys that seal the fleet's secrets, and sealing (DESIGN §16).

A secret's value is stored sealed: AES-256-GCM (``cryptography``'s AESGCM),
a fresh 96-bit nonce per seal, and the secret's name and version as the
associated data, so a box copied under another name or version does not
open. The key is never stored anywhere: it is derived (HKDF-SHA256) from a
secret every node already holds as a file of its own:

=============================  ============================================
source                         used when
=============================  ============================================
``secrets.key_file``           given: a file made by ``crewletctl
                               fleet-secret`` (the same format), the same on
                               every node — a fleet on a broker run by
                               someone else (``stream.type: nats``)
``stream.fleet_credentials``   the fleet's secret: every member and leaf of
                               a fleet holds it already
the run dir's ``vault.key``    neither: a single node's own key, made at its
                               first start (0600, :func:`ensure_own`)
=============================  ============================================

Each line of the file is a key: the first seals, every one opens (a fleet
secret in the middle of a rotation holds two). crewletd also opens with the
run dir's own key when it has one, so a single node that became a fleet can
re-seal what it stored under its own key (:func:`crewlet.vault.store.reseal`).

A key is known by its id (:attr:`Keys.sealing_id`): a digest of the derived
key, which says which key sealed a value and nothing about the key.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets as _random

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from crewlet import credentials, log

OWN_KEY_FILE = "vault.key"  # in the run dir: a single node's own
NONCE_BYTES = 12            # AES-GCM's 96-bit nonce, random per seal
KEY_ID_DIGITS = 12          # hex digits of a key's id
# HKDF's salt and info: a key derived for the vault is no other key (the
# fleet secret is also a broker password; this is not).
_SALT = b"crewlet vault"
_INFO = b"crewlet secrets v1"


class Unsealable(ValueError):
    """A sealed value this process cannot open: sealed with a key it does
    not hold, or not a box at all (damaged, moved to another name)."""


def _derive(line: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_INFO).derive(line.encode())


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"crewlet vault key id\0" + key).hexdigest()[:KEY_ID_DIGITS]


def _aad(name: str, version: int) -> bytes:
    return f"crewlet-secret\0{name}\0{version}".encode()


class Keys:
    """The vault keys one process holds. Invariant: ``_keys`` maps each
    key's id to its AESGCM, in the order given; ``sealing_id`` is the first's."""

    def __init__(self, lines: list[str]):
        if not lines:
            raise ValueError("no vault key")
        self._keys: dict[str, AESGCM] = {}
        for line in lines:
            key = _derive(line)
            self._keys.setdefault(key_id(key), AESGCM(key))
        self.sealing_id = next(iter(self._keys))

    @classmethod
    def of(cls, config, *, own_too: bool = False) -> "Keys":
        """The keys of the node configured by *config* (a NodeConfig): its
        ``secrets.key_file``, else its fleet secret, else its own in the run
        dir. *own_too*: the run dir's own key as well, after the others
        (crewletd's, to re-seal). OSError/ValueError if a file is missing
        or not a key file (the message names it)."""
        if config.secrets.key_file:
            lines = credentials.read_fleet_secrets(config.secrets.key_file)
        elif config.stream.fleet_credentials:
            lines = credentials.read_fleet_secrets(config.stream.fleet_credentials)
        else:
            lines = []
        own = own_path(config.run_dir)
        if (not lines or own_too) and os.path.exists(own):
            lines = [*lines, *credentials.read_fleet_secrets(own)]
        if not lines:
            raise FileNotFoundError(f"{own} does not exist: crewletd makes it at start")
        return cls(lines)

    def holds(self, kid: str) -> bool:
        return kid in self._keys

    def seal(self, name: str, version: int, value: str) -> dict[str, str]:
        """*value* of secret *name* at *version*, sealed: ``{key, nonce, box}``."""
        nonce = _random.token_bytes(NONCE_BYTES)
        box = self._keys[self.sealing_id].encrypt(nonce, value.encode(), _aad(name, version))
        return {"key": self.sealing_id, "nonce": _b64(nonce), "box": _b64(box)}

    def open(self, name: str, version: int, sealed: dict) -> str:
        """The value in *sealed* (as :meth:`seal` made it for *name* at
        *version*); :class:`Unsealable` if this process cannot open it."""
        kid = sealed.get("key")
        aes = self._keys.get(kid) if isinstance(kid, str) else None
        if aes is None:
            raise Unsealable(f"sealed with key {kid}, which this node does not hold "
                             f"(it holds {', '.join(self._keys)})")
        try:
            value = aes.decrypt(_unb64(sealed["nonce"]), _unb64(sealed["box"]), _aad(name, version))
            return value.decode()
        except (InvalidTag, KeyError, TypeError, ValueError):
            raise Unsealable(f"does not open with key {kid}: damaged, or not sealed for this "
                             f"name and version") from None


def vault_keys(config, role: str) -> Keys | None:
    """The keys of the node configured by *config* for role *role*; None,
    said in the log, when it has none it can read: secrets are then not
    read here (a provider naming one says so at its request), and the role
    runs on."""
    try:
        return Keys.of(config)
    except (OSError, ValueError) as exc:
        log.event("vault_keyless", "error", role=role, error=str(exc),
                  detail="the fleet's secrets cannot be opened on this node")
        return None


def own_path(run_dir: str) -> str:
    return os.path.join(run_dir, OWN_KEY_FILE)


def ensure_own(config) -> None:
    """Make the run dir's own key (0600) when the node has no other
    (crewletd, at start, before its children). Kept for ever once made."""
    if config.secrets.key_file or config.stream.fleet_credentials:
        return
    path = own_path(config.run_dir)
    if not os.path.exists(path):
        credentials.write_fleet_secrets(path, [credentials.new_fleet_secret()])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)
