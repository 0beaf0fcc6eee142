"""A fast AWS Signature Version 4 signer for DynamoDB JSON-protocol requests.

botocore's ``SigV4Auth`` is general: on every request it re-parses the URL, rebuilds a header map,
sorts it, and derives the signing key with four fresh HMACs. For the lock engine every request has the
same shape (``POST /``, four or five fixed headers, a JSON body), so almost all of that work is constant
and is done here once: in ``__init__``, when the secret or the UTC day changes, or when the second ticks.
What is left per request is one SHA-256 of the body, one of the canonical request, and one HMAC.

The output must be byte-identical to what botocore signs for the same request at the same time (see
``tests/stores/test_sigv4.py``, which compares against both ``SigV4Auth.add_auth`` and a real botocore
DynamoDB client). The botocore behaviour mirrored here, as of botocore 1.44:

* SignedHeaders is every header present at signing time, lowercased and sorted, minus a blacklist
  (``user-agent``, ``expect``, ``x-amzn-trace-id``, ...). botocore's client adds ``User-Agent`` (not
  signed), and ``amz-sdk-invocation-id``, ``amz-sdk-request`` and ``Content-Length`` only *after*
  signing, so the signed set for DynamoDB is exactly ``content-type;host;x-amz-date;x-amz-target``, plus
  ``x-amz-security-token`` (sorted between date and target) when a session token is used.
* ``host`` is not a request header in botocore; it is derived from the URL for signing only (lowercased,
  default port 80/443 dropped). Here the caller passes the value and we also return it as the header, so
  what is signed is what is sent.
* The payload hash is always the SHA-256 of the body: botocore only substitutes ``UNSIGNED-PAYLOAD`` /
  adds ``X-Amz-Content-SHA256`` when ``payload_signing_enabled`` is false in the request context, which
  only S3 sets. No ``X-Amz-Content-SHA256`` header is added for DynamoDB.
* Header values are "trimall"-ed in the canonical request (``" ".join(value.split())``) but sent raw.
* The path is dot-segment-normalised with repeated slashes collapsed, then percent-encoded again with
  ``quote(path, safe="/~")`` (so an already-encoded ``%20`` becomes ``%2520``: non-S3 SigV4 double-encodes).
* The query string is empty (we never send one).
* A falsy token (``None`` or ``""``) means no ``X-Amz-Security-Token`` at all, as in botocore.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional
from urllib.parse import quote

from .._digest import constructor

if TYPE_CHECKING:  # hashlib._Hash exists only in the type stubs; these names are for annotations only
    from hashlib import _Hash

    # (secret_key, datestamp, credential scope, inner HMAC state, outer HMAC state); see SigV4Signer.
    _KeyEntry = tuple[str, str, str, _Hash, _Hash]

__all__ = ["SigV4Signer"]

_ALGORITHM = "AWS4-HMAC-SHA256"
CONTENT_TYPE = "application/x-amz-json-1.0"
_AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
# Sorted, lowercased names of the headers botocore signs for our request shape (see module docstring).
_SIGNED_HEADERS = "content-type;host;x-amz-date;x-amz-target"
_SIGNED_HEADERS_TOKEN = "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
# Bound for the small memo dicts below; they are keyed by values that rarely change (hosts, targets, tokens,
# paths), so the bound only exists to stop a caller with ever-changing values from leaking memory.
_MEMO_LIMIT = 256

#: SHA-256 without loading OpenSSL in the renewal process, which signs a renewal every lease/3 (see
#: ``_digest``).
_sha256 = constructor("sha256")
# HMAC (RFC 2104) pads: the key is XOR-ed with these before the inner and outer hashes.
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def _hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """One-off HMAC-SHA256, for the four steps of key derivation (not the hot path)."""
    inner, outer = _hmac_pads(key)
    inner.update(msg)
    outer.update(inner.digest())
    return outer.digest()


def _hmac_pads(key: bytes) -> tuple[_Hash, _Hash]:
    """The HMAC-SHA256 inner and outer hash states after absorbing the padded key.

    They depend on the key only, so for the signing key they are computed once per derivation and cached;
    each signature then costs two ``copy()`` + ``update()`` instead of ``hmac.new``/``hmac.digest``, which
    re-create and re-key an OpenSSL HMAC context every call (measured ~0.5 µs vs ~1.5 µs per HMAC).
    """
    if len(key) > 64:  # SHA-256 block size; longer keys are hashed first (never the case for SigV4 keys)
        key = _sha256(key).digest()
    key = key.ljust(64, b"\0")
    return _sha256(key.translate(_IPAD)), _sha256(key.translate(_OPAD))


def _trimall(value: str) -> str:
    """SigV4 header-value canonicalisation as botocore does it: strip, and collapse whitespace runs."""
    return " ".join(value.split())


def _canonical_path(path: str) -> str:
    """botocore's ``SigV4Auth._normalize_url_path``: RFC 3986 dot-segment removal, with empty segments
    (repeated slashes) dropped too, then percent-encoding with only ``/`` and ``~`` left unescaped."""
    if not path:
        return "/"
    segments: list[str] = []
    for segment in path.split("/"):
        if segment and segment != ".":
            if segment == "..":
                if segments:
                    segments.pop()
            else:
                segments.append(segment)
    first = "/" if path[0] == "/" else ""
    last = "/" if path[-1] == "/" and segments else ""
    return quote(first + "/".join(segments) + last, safe="/~")


def _remember(memo: dict[str, str], value: str, canonical: str) -> str:
    """Store ``canonical`` for ``value``, emptying the memo first if it is full (single dict operations
    only, so concurrent callers at worst recompute an entry)."""
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[value] = canonical
    return canonical


class SigV4Signer:
    """Signs DynamoDB JSON-protocol ``POST`` requests with SigV4, byte-identical to botocore.

    One signer serves one region and service; credentials and time are passed to every :meth:`sign` call
    (credentials rotate, and the engine owns the clock). The derived signing key is cached and re-derived
    only when the secret key or the UTC date changes; the region cannot change on an instance, which is
    why it is not part of the cache key.

    Thread safety: there is no lock. Each cache is one immutable tuple held in one attribute, read once
    per call and replaced by a single assignment, so a thread always sees a consistent (inputs, outputs)
    pair; two threads racing on a miss both derive the same value and the last write wins, which is
    harmless. The memo dicts are only read and written with single dict operations.
    """

    __slots__ = (
        "_region",
        "_service",
        "key_derivations",
        "_scope_suffix",
        "_key_cache",
        "_time_cache",
        "_header_memo",
        "_path_memo",
    )

    def __init__(self, region: str, service: str = "dynamodb") -> None:
        # Read-only (properties below): the scope suffix and the cached key are derived from them.
        self._region = region
        self._service = service
        #: Number of signing-key derivations so far. For tests and diagnostics only (a cache-hit check);
        #: the increment is not atomic across threads, so under concurrency it is approximate.
        self.key_derivations = 0
        # Everything in the credential scope after the YYYYMMDD date.
        self._scope_suffix = f"/{region}/{service}/aws4_request"
        # (secret_key, datestamp, scope, inner_pad_state, outer_pad_state): the signing key's HMAC pads.
        # The empty datestamp never matches a real one (always YYYYMMDD), so the first call derives.
        self._key_cache: _KeyEntry = ("", "", "", _sha256(), _sha256())
        # (whole epoch second, X-Amz-Date string): strftime is ~0.6 µs, and calls cluster within a second.
        self._time_cache: tuple[Optional[int], str] = (None, "")
        # Canonical forms of header values (host, target, token) and of paths, which repeat across calls.
        # Keyed by the caller's own string, whose hash CPython caches, so a hit costs one lookup.
        self._header_memo: dict[str, str] = {}
        self._path_memo: dict[str, str] = {}

    @property
    def region(self) -> str:
        """The AWS region signed for (fixed per signer, which is why it is not part of the key cache)."""
        return self._region

    def _derive(self, secret_key: str, datestamp: str) -> _KeyEntry:
        """Derive the signing key (kDate -> kRegion -> kService -> kSigning) and publish it in the cache."""
        k_date = _hmac_sha256(f"AWS4{secret_key}".encode(), datestamp.encode())
        k_region = _hmac_sha256(k_date, self._region.encode())
        k_service = _hmac_sha256(k_region, self._service.encode())
        k_signing = _hmac_sha256(k_service, b"aws4_request")
        inner, outer = _hmac_pads(k_signing)
        entry = (secret_key, datestamp, datestamp + self._scope_suffix, inner, outer)
        self._key_cache = entry  # single atomic attribute store: readers see the old or the new tuple
        self.key_derivations += 1
        return entry

    def _header_miss(self, value: str) -> str:
        """Canonicalise a header value not yet in the memo, and remember it."""
        return _remember(self._header_memo, value, _trimall(value))

    def _path_miss(self, path: str) -> str:
        """Canonicalise a path not yet in the memo, and remember it."""
        return _remember(self._path_memo, path, _canonical_path(path))

    def sign(
        self,
        *,
        host: str,
        body: bytes,
        target: str,
        access_key: str,
        secret_key: str,
        token: Optional[str],
        now_s: float,
        path: str = "/",
    ) -> dict[str, str]:
        """Return the complete header dict to send (Host, Content-Type, X-Amz-Target, X-Amz-Date,
        X-Amz-Security-Token when token, Authorization) for a POST of `body` to `host` + `path`.

        ``host`` is the Host header value exactly as sent (``127.0.0.1:5000``; no port for 443/80; lowercase,
        as botocore derives it from the URL). It is signed and returned unchanged.
        ``target`` is the full ``X-Amz-Target`` value, e.g. ``DynamoDB_20120810.PutItem``. ``now_s`` is
        the request time in epoch seconds; the signature has whole-second resolution (fraction dropped).
        ``path`` is the URL path as it appears in the URL (already percent-encoded, if at all).
        """
        # X-Amz-Date, recomputed only when the whole second changes.
        second = int(now_s)
        time_entry = self._time_cache
        if time_entry[0] != second:
            time_entry = (second, time.strftime(_AMZ_DATE_FORMAT, time.gmtime(second)))
            self._time_cache = time_entry
        amz_date = time_entry[1]

        # Signing key, re-derived only on a new secret or a new UTC day. Read the tuple once: another
        # thread may replace the attribute meanwhile, but this tuple stays self-consistent.
        key_entry = self._key_cache
        datestamp = amz_date[:8]
        if key_entry[0] != secret_key or key_entry[1] != datestamp:
            key_entry = self._derive(secret_key, datestamp)
        scope = key_entry[2]

        signed_headers = _SIGNED_HEADERS_TOKEN if token else _SIGNED_HEADERS
        string_to_sign = self._string_to_sign(host, target, token, path, body, amz_date, scope)

        # HMAC(kSigning, string_to_sign) from the cached pad states (see _hmac_pads). The cached states are
        # never updated, only copied, and hashlib's copy() holds the object's own lock, so sharing them
        # between threads is safe.
        inner = key_entry[3].copy()
        inner.update(string_to_sign.encode())
        outer = key_entry[4].copy()
        outer.update(inner.digest())

        headers = {"Host": host, "Content-Type": CONTENT_TYPE, "X-Amz-Target": target, "X-Amz-Date": amz_date}
        if token:
            headers["X-Amz-Security-Token"] = token
        headers["Authorization"] = (
            f"{_ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed_headers}, "
            f"Signature={outer.hexdigest()}"
        )
        return headers

    def _string_to_sign(
        self, host: str, target: str, token: Optional[str], path: str, body: bytes, amz_date: str, scope: str
    ) -> str:
        """The SigV4 string to sign for :meth:`sign`'s request: the algorithm, the date, the credential
        scope and the SHA-256 of the canonical request, whose header values and path come from the memos."""
        # `memo.get(v) or miss(v)`: a miss (or an empty canonical value) just recomputes; still correct.
        memo = self._header_memo
        canonical_host = memo.get(host) or self._header_miss(host)
        canonical_target = memo.get(target) or self._header_miss(target)
        canonical_path = "/" if path == "/" else (self._path_memo.get(path) or self._path_miss(path))

        # Canonical request: method, path, query (empty), headers in sorted name order, a blank line
        # (botocore's canonical headers end with "\n" and are then joined with "\n"), signed headers, and
        # the payload hash.
        if token:
            canonical_token = memo.get(token) or self._header_miss(token)
            canonical_request = (
                f"POST\n{canonical_path}\n\ncontent-type:{CONTENT_TYPE}\nhost:{canonical_host}\n"
                f"x-amz-date:{amz_date}\nx-amz-security-token:{canonical_token}\nx-amz-target:{canonical_target}\n\n"
                f"{_SIGNED_HEADERS_TOKEN}\n{_sha256(body).hexdigest()}"
            )
        else:
            canonical_request = (
                f"POST\n{canonical_path}\n\ncontent-type:{CONTENT_TYPE}\nhost:{canonical_host}\n"
                f"x-amz-date:{amz_date}\nx-amz-target:{canonical_target}\n\n"
                f"{_SIGNED_HEADERS}\n{_sha256(body).hexdigest()}"
            )
        return f"{_ALGORITHM}\n{amz_date}\n{scope}\n{_sha256(canonical_request.encode()).hexdigest()}"
