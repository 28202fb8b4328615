"""Tenant keys of `prefillonly serve --tenant-keys FILE` (plain Python): which tenant an
API key belongs to.

Each tenant's requests run in a prefix-cache namespace of its own (scoring/cache_salts.py), so
no tenant reuses, or sees the cached tokens or the latency of, another's cached prefixes.
The key check itself is sglang_runtime/http_server/tenant_requests.py (SGLang's rules, several
keys).

The file: JSON, {"tenant": "key"} or {"tenant": ["key", ...]}, or lines "tenant key"
(blank lines and lines starting with # skipped). A tenant may have several keys (a key
being replaced and its successor share the tenant's cache); a key belongs to one tenant.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MIN_KEY_CHARS = 8  # a shorter key is a typo or a placeholder, not a secret


class TenantKeysError(ValueError):
    pass


@dataclass(frozen=True)
class TenantKeys:
    """Key -> tenant. Keys are held as SHA-256 digests: the lookup compares digests of
    the presented key (no early exit on a shared prefix of the secret)."""

    by_digest: dict[bytes, str]

    def tenant_of(self, key: str | None) -> str | None:
        if not key:
            return None
        return self.by_digest.get(_digest(key))

    @property
    def tenants(self) -> list[str]:
        return sorted(set(self.by_digest.values()))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_tenant_keys(text: str) -> TenantKeys:
    """The keys in `text` (the file's format above); TenantKeysError naming the problem."""
    return TenantKeys({_digest(key): tenant for tenant, key in tenant_key_pairs(text)})


def tenant_key_pairs(text: str) -> list[tuple[str, str]]:
    """(tenant, key) for every key in `text`, checked (what `prefillonly replicas` hands
    the gateway); TenantKeysError naming the problem, never the key."""
    pairs = _json_pairs(text) if text.lstrip().startswith("{") else _line_pairs(text)
    by_digest: dict[bytes, str] = {}
    checked: list[tuple[str, str]] = []
    for tenant, key in pairs:
        if not isinstance(tenant, str) or not tenant.strip() or tenant != tenant.strip():
            raise TenantKeysError(f"a tenant name must be a non-empty word, got {tenant!r}")
        if not isinstance(key, str) or len(key) < MIN_KEY_CHARS or key != key.strip():
            raise TenantKeysError(
                f"tenant {tenant!r}: a key must be a string of at least {MIN_KEY_CHARS} "
                "characters without surrounding spaces"
            )
        owner = by_digest.get(_digest(key))
        if owner is None:
            by_digest[_digest(key)] = tenant
            checked.append((tenant, key))
        elif owner != tenant:
            raise TenantKeysError(f"one key is given to two tenants: {owner!r} and {tenant!r}")
    if not checked:
        raise TenantKeysError("no tenant keys in the file")
    return checked


def load_tenant_key_pairs(path: str | Path) -> list[tuple[str, str]]:
    """tenant_key_pairs of the file at ``path``; TenantKeysError naming the file."""
    return _loaded(path, tenant_key_pairs)


def load_tenant_keys(path: str | Path) -> TenantKeys:
    return _loaded(path, parse_tenant_keys)


def _loaded(path: str | Path, parse):
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TenantKeysError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return parse(text)
    except TenantKeysError as e:
        raise TenantKeysError(f"{path}: {e}") from None


def _json_pairs(text: str) -> list[tuple[object, object]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TenantKeysError(f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TenantKeysError('JSON: expected {"tenant": "key" or ["key", ...]}')
    pairs = []
    for tenant, keys in data.items():
        for key in keys if isinstance(keys, list) else [keys]:
            pairs.append((tenant, key))
    return pairs


def _line_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            # The line is not quoted: it may hold a key.
            raise TenantKeysError(f'line {number}: expected "tenant key", two words')
        pairs.append((parts[0], parts[1]))
    return pairs
