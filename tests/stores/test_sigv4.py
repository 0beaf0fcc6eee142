"""``fastlease.stores.dynamodb.sigv4.SigV4Signer`` must sign exactly what botocore signs, byte for byte.

The reference is botocore itself: ``botocore.auth.SigV4Auth.add_auth`` on an ``AWSRequest`` shaped like a
DynamoDB JSON request, and (end to end) a real botocore DynamoDB client whose request is captured just
before it would be sent. botocore reads the clock inside ``add_auth`` through the module attribute
``botocore.auth.get_current_datetime`` (imported from ``botocore.compat``); the tests pin that one
attribute to the same instant they pass to our signer as ``now_s``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import sys
import threading
from typing import Any, Optional
from urllib.parse import urlsplit

import botocore.auth
import botocore.session
import pytest
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.credentials import Credentials

from fastlease.stores.dynamodb import sigv4 as _sigv4
from fastlease.stores.dynamodb.sigv4 import SigV4Signer

CONTENT_TYPE = "application/x-amz-json-1.0"
GET_ITEM = "DynamoDB_20120810.GetItem"
PUT_ITEM = "DynamoDB_20120810.PutItem"
ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
# Session tokens are long base64 strings with '/', '+' and '='.
TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD+example/token==" * 4
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NOW_DATE = "20231114T221320Z"
LOCAL_URL = "http://127.0.0.1:5000/"  # a DynamoDB Local / moto server

# (url botocore is given, Host value we are given): botocore derives Host from the URL.
ENDPOINTS = [
    pytest.param("http://127.0.0.1:5000/", "127.0.0.1:5000", id="http-port"),
    pytest.param("https://dynamodb.us-east-1.amazonaws.com/", "dynamodb.us-east-1.amazonaws.com", id="https"),
    pytest.param("https://dynamodb.eu-west-1.amazonaws.com:443/", "dynamodb.eu-west-1.amazonaws.com", id="https-443"),
    pytest.param("http://localhost:80/", "localhost", id="http-80"),
    pytest.param("https://localhost:8443/", "localhost:8443", id="https-port"),
]
TOKENS = [pytest.param(None, id="no-token"), pytest.param(TOKEN, id="token")]
REGIONS = ["us-east-1", "eu-west-1", "ap-northeast-1", "us-gov-west-1", "cn-north-1"]

KEY_JSON = {"TableName": "locks", "Key": {"pk": {"S": "é"}, "sk": {"S": "日本"}}, "Note": {"S": "🔒 lock"}}
BODIES = [
    pytest.param(b"{}", id="empty-object"),
    pytest.param(b"", id="empty"),
    pytest.param(json.dumps({"TableName": "locks", "Key": {"pk": {"S": "a"}}}).encode(), id="ascii"),
    # What botocore's own serializer sends: non-ASCII as \u escapes (\u00e9, surrogate pair for the emoji).
    pytest.param(json.dumps(KEY_JSON).encode(), id="json-escaped"),
    # Raw UTF-8 bytes of the same document: é, 日本, and a 4-byte emoji.
    pytest.param(json.dumps(KEY_JSON, ensure_ascii=False).encode("utf-8"), id="raw-utf8"),
    pytest.param('{"k":"é"}'.encode("utf-8") + b"\n\x00\xff", id="raw-bytes"),
]


def _utc(now_s: float) -> datetime.datetime:
    """What botocore.compat.get_current_datetime() would return at ``now_s``: naive UTC."""
    return datetime.datetime.fromtimestamp(now_s, datetime.timezone.utc).replace(tzinfo=None)


def pin_botocore_clock(monkeypatch: pytest.MonkeyPatch, now_s: float) -> None:
    """Make botocore's SigV4Auth.add_auth see ``now_s`` as the current time."""

    def fake_now(remove_tzinfo: bool = True) -> datetime.datetime:
        now = _utc(now_s)
        return now if remove_tzinfo else now.replace(tzinfo=datetime.timezone.utc)

    monkeypatch.setattr(botocore.auth, "get_current_datetime", fake_now)


def botocore_sign(
    monkeypatch: pytest.MonkeyPatch,
    *,
    url: str,
    body: bytes,
    target: str,
    secret: str,
    token: Optional[str],
    region: str,
    now_s: float,
    access: str = ACCESS,
) -> dict[str, str]:
    """Headers botocore's SigV4Auth puts on the request (Host is not one: botocore derives it from the URL)."""
    pin_botocore_clock(monkeypatch, now_s)
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": target}
    )
    botocore.auth.SigV4Auth(Credentials(access, secret, token), "dynamodb", region).add_auth(request)
    return dict(request.headers.items())


def assert_same(ours: dict[str, str], reference: dict[str, str], token: Optional[str]) -> None:
    """Byte-for-byte equality of everything botocore adds when signing."""
    assert ours["Authorization"].encode() == reference["Authorization"].encode()
    assert ours["X-Amz-Date"].encode() == reference["X-Amz-Date"].encode()
    if token:
        assert ours["X-Amz-Security-Token"].encode() == reference["X-Amz-Security-Token"].encode() == token.encode()
    else:
        assert "X-Amz-Security-Token" not in ours
        assert "X-Amz-Security-Token" not in reference
    # botocore adds no payload-hash header for DynamoDB, and neither do we.
    assert "X-Amz-Content-SHA256" not in reference
    assert "X-Amz-Content-SHA256" not in ours


def sign_ours(
    signer: Optional[SigV4Signer] = None,
    *,
    url: str = LOCAL_URL,
    body: bytes = b"{}",
    target: str = GET_ITEM,
    secret: str = SECRET,
    token: Optional[str] = None,
    region: str = "us-east-1",
    now_s: float = NOW,
    access: str = ACCESS,
) -> dict[str, str]:
    """Sign with ``signer`` (a fresh one for ``region`` if None) what botocore would sign for a POST to ``url``.

    Host and path are taken from the URL as botocore takes them (``_host_from_url``: lowercase, default port
    dropped; ``urlsplit().path``: as written, so ``""`` stays ``""``), so one URL describes both sides of a
    comparison. ``test_matches_botocore_per_endpoint`` pins the derived Host to literal values.
    """
    if signer is None:
        signer = SigV4Signer(region)
    assert signer.region == region, "a shared signer must be for the region botocore is asked to sign for"
    return signer.sign(
        host=botocore.auth._host_from_url(url),
        path=urlsplit(url).path,
        body=body,
        target=target,
        access_key=access,
        secret_key=secret,
        token=token,
        now_s=now_s,
    )


def sign_both(
    monkeypatch: pytest.MonkeyPatch,
    *,
    url: str = LOCAL_URL,
    body: bytes = b"{}",
    target: str = GET_ITEM,
    secret: str = SECRET,
    token: Optional[str] = None,
    region: str = "us-east-1",
    now_s: float = NOW,
    access: str = ACCESS,
    signer: Optional[SigV4Signer] = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Sign one request with our signer and with botocore, assert they are the same, return (ours, botocore's).

    Pass ``signer`` to sign with a shared instance (key-cache tests); by default each call uses a fresh one.
    """
    request: dict[str, Any] = dict(
        url=url, body=body, target=target, secret=secret, token=token, region=region, now_s=now_s, access=access
    )
    ours = sign_ours(signer, **request)
    reference = botocore_sign(monkeypatch, **request)
    assert_same(ours, reference, token)
    return ours, reference


def test_botocore_clock_pin_takes_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the reference itself: if botocore stops reading the clock via this attribute, say so."""
    reference = botocore_sign(
        monkeypatch,
        url=LOCAL_URL,
        body=b"{}",
        target=GET_ITEM,
        secret=SECRET,
        token=None,
        region="us-east-1",
        now_s=NOW,
    )
    assert reference["X-Amz-Date"] == NOW_DATE
    assert reference["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS}/20231114/us-east-1/dynamodb/")


@pytest.mark.parametrize("url, host", ENDPOINTS)
@pytest.mark.parametrize("token", TOKENS)
def test_matches_botocore_per_endpoint(
    monkeypatch: pytest.MonkeyPatch, url: str, host: str, token: Optional[str]
) -> None:
    body = json.dumps({"TableName": "locks", "Key": {"pk": {"S": "job-1"}}}).encode()
    ours, _ = sign_both(monkeypatch, url=url, body=body, token=token)
    assert ours["X-Amz-Date"] == NOW_DATE
    # The Host we send is the one botocore signed (it derives it from the URL), and it is the literal value
    # expected: this also pins the derivation sign_ours borrows from botocore.
    assert ours["Host"] == botocore.auth._host_from_url(url) == host


@pytest.mark.parametrize("token", TOKENS)
def test_returns_exactly_the_headers_to_send(token: Optional[str]) -> None:
    headers = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000", body=b"{}", target=PUT_ITEM, access_key=ACCESS, secret_key=SECRET, token=token, now_s=NOW
    )
    expected = {"Host", "Content-Type", "X-Amz-Target", "X-Amz-Date", "Authorization"}
    if token:
        expected.add("X-Amz-Security-Token")
    assert set(headers) == expected
    assert headers["Host"] == "127.0.0.1:5000"
    assert headers["Content-Type"] == CONTENT_TYPE
    assert headers["X-Amz-Target"] == PUT_ITEM
    signed = (
        "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
        if token
        else ("content-type;host;x-amz-date;x-amz-target")
    )
    assert f", SignedHeaders={signed}, Signature=" in headers["Authorization"]


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("token", TOKENS)
def test_matches_botocore_per_region(monkeypatch: pytest.MonkeyPatch, region: str, token: Optional[str]) -> None:
    ours, _ = sign_both(
        monkeypatch,
        url=f"https://dynamodb.{region}.amazonaws.com/",
        body=b'{"TableName":"locks"}',
        target=PUT_ITEM,
        token=token,
        region=region,
    )
    assert f"/{region}/dynamodb/aws4_request," in ours["Authorization"]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("token", TOKENS)
def test_matches_botocore_per_body(monkeypatch: pytest.MonkeyPatch, body: bytes, token: Optional[str]) -> None:
    sign_both(monkeypatch, body=body, target=PUT_ITEM, token=token, region="eu-west-1")


def test_bodies_differ_in_signature() -> None:
    """The payload hash is really part of the signature (escaped vs raw UTF-8 of the same JSON differ)."""
    signer = SigV4Signer("us-east-1")
    signatures = {sign_ours(signer, body=param.values[0], target=PUT_ITEM)["Authorization"] for param in BODIES}
    assert len(signatures) == len(BODIES)


@pytest.mark.parametrize(
    "steps, amz_dates",
    [
        # A new UTC day with the same secret: the last second of 2023-11-14, then the first of 2023-11-15.
        pytest.param(
            [(SECRET, 1_700_006_399.0), (SECRET, 1_700_006_400.0)],
            ["20231114T235959Z", "20231115T000000Z"],
            id="date-change",
        ),
        # A rotated secret within the same UTC day.
        pytest.param(
            [(SECRET, NOW), ("Zm9vYmFyYmF6cXV4cm90YXRlZHNlY3JldGtleTEy", NOW + 60.0)],
            [NOW_DATE, "20231114T221420Z"],
            id="secret-change",
        ),
    ],
)
def test_date_or_secret_change_rederives_key(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, float]], amz_dates: list[str]
) -> None:
    """The cached signing key depends on the secret and the UTC day: a change of either re-derives it, and so
    does changing back (a clock step back, a rollback of a rotation) rather than reusing the newer key."""
    signer = SigV4Signer("us-east-1")
    results = [
        sign_both(monkeypatch, secret=secret, token=TOKEN, now_s=now_s, signer=signer)[0] for secret, now_s in steps
    ]
    assert [r["X-Amz-Date"] for r in results] == amz_dates
    assert results[0]["Authorization"] != results[1]["Authorization"]
    assert signer.key_derivations == 2
    secret, now_s = steps[0]
    ours = sign_ours(signer, secret=secret, token=TOKEN, now_s=now_s)
    assert ours == results[0]
    assert signer.key_derivations == 3


def test_cached_key_is_reused_same_day_same_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same secret and UTC day: one derivation, whatever else changes (second, body, target, token, access
    key, host), and every signature still matches botocore."""
    signer = SigV4Signer("us-east-1")
    calls: list[tuple[float, bytes, str, Optional[str], str, str]] = [
        (NOW, b"{}", GET_ITEM, None, ACCESS, LOCAL_URL),
        (NOW, b"{}", GET_ITEM, None, ACCESS, LOCAL_URL),
        (NOW + 1.0, b'{"a":1}', PUT_ITEM, TOKEN, ACCESS, LOCAL_URL),
        (NOW + 3600.5, b'{"b":2}', GET_ITEM, TOKEN, "ASIAOTHERKEY", LOCAL_URL),
        (NOW + 3601.0, b"{}", PUT_ITEM, None, ACCESS, "http://localhost:8000/"),
    ]
    for now_s, body, target, token, access, url in calls:
        sign_both(
            monkeypatch, url=url, body=body, target=target, token=token, now_s=now_s, access=access, signer=signer
        )
        assert signer.key_derivations == 1


def test_key_cache_counts_derivations_from_zero() -> None:
    signer = SigV4Signer("us-east-1")
    assert signer.key_derivations == 0
    sign_ours(signer, url="http://h/")
    assert signer.key_derivations == 1


def test_signers_for_different_regions_do_not_share_keys() -> None:
    east = sign_ours(region="us-east-1", url="http://h/")["Authorization"]
    west = sign_ours(region="us-west-2", url="http://h/")["Authorization"]
    assert east.rsplit("Signature=", 1)[1] != west.rsplit("Signature=", 1)[1]


@pytest.mark.parametrize(
    "now_s, amz_date",
    [
        (NOW + 0.999, NOW_DATE),  # the fraction is dropped, as botocore's strftime drops microseconds
        (0.0, "19700101T000000Z"),
        (951_782_400.0, "20000229T000000Z"),  # leap day
        (4_102_444_799.0, "20991231T235959Z"),
    ],
)
def test_timestamps_match_botocore(monkeypatch: pytest.MonkeyPatch, now_s: float, amz_date: str) -> None:
    ours, _ = sign_both(monkeypatch, now_s=now_s)
    assert ours["X-Amz-Date"] == amz_date


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "",
        "/ddb",
        "/ddb/",
        "//a///b//",
        "/a/./b/../c",
        "/../x",
        "/with%20space",
        "/~user/é/日本",
        "/a:b@c!$'()*+,;=",
    ],
)
def test_path_canonicalisation_matches_botocore(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Endpoints with a path prefix (proxies): botocore normalises dot segments, collapses slashes and
    percent-encodes again (``%20`` -> ``%2520``)."""
    url = f"http://127.0.0.1:5000{path}"
    assert urlsplit(url).path == path  # sign_ours passes our signer exactly this path
    sign_both(monkeypatch, url=url, token=TOKEN)


def test_header_values_are_trimmed_in_the_canonical_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """SigV4 "trimall": botocore signs the whitespace-collapsed value; the header is still sent as given."""
    target = f" {GET_ITEM}  "
    ours, _ = sign_both(monkeypatch, target=target, token="  tok\t en  with   runs ")
    assert ours["X-Amz-Target"] == target
    plain = sign_ours(target=GET_ITEM, token="tok en with runs")
    assert plain["Authorization"] == ours["Authorization"]


def test_empty_token_means_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore tests ``if credentials.token``: an empty string sends and signs no token header."""
    sign_both(monkeypatch, token="")  # assert_same checks neither side has X-Amz-Security-Token


@pytest.mark.parametrize("key_len", [0, 1, 32, 63, 64, 65, 200])
def test_hmac_helper_matches_stdlib_hmac(key_len: int) -> None:
    key = bytes(i % 256 for i in range(key_len))
    msg = "AWS4-HMAC-SHA256\n20231114T221320Z\né".encode()
    assert _sigv4._hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_memo_is_bounded_and_stays_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overflowing the header and path memos (ever-new tokens and paths) keeps them bounded, and a value that
    was evicted is signed correctly when it comes back."""
    signer = SigV4Signer("us-east-1")
    for i in range(_sigv4._MEMO_LIMIT * 2 + 3):
        sign_ours(signer, url=f"http://127.0.0.1:5000/p{i}", token=f"token-{i}")
        assert len(signer._header_memo) <= _sigv4._MEMO_LIMIT
        assert len(signer._path_memo) <= _sigv4._MEMO_LIMIT
    sign_both(monkeypatch, url="http://127.0.0.1:5000/p0", token="token-0", signer=signer)


def test_concurrent_signing_with_rotating_secrets_and_days() -> None:
    """No lock: many threads share one signer while the cached key keeps flipping between secrets and days.
    Every result must equal the single-threaded one for the same inputs (a torn cache would mix a key for one
    secret/day with the scope of another)."""
    secrets = [SECRET, "second-secret-key-0000000000000000000000", "third-secret-key-11111111111111111111111"]
    times = [NOW, NOW + 86_400.0, NOW + 2 * 86_400.0]
    cases = [(s, t) for s in secrets for t in times]

    def sign(signer: SigV4Signer, secret: str, now_s: float) -> str:
        # signer.sign directly (not sign_ours): no URL parsing between calls, so the threads spend their time,
        # and get switched out, inside sign() where the cache is read and used.
        return signer.sign(
            host="127.0.0.1:5000",
            body=b"{}",
            target=GET_ITEM,
            access_key=ACCESS,
            secret_key=secret,
            token=TOKEN,
            now_s=now_s,
        )["Authorization"]

    expected = {case: sign(SigV4Signer("us-east-1"), *case) for case in cases}
    assert len(set(expected.values())) == len(cases)
    shared = SigV4Signer("us-east-1")
    errors: list[str] = []
    start = threading.Barrier(8)

    def worker(offset: int) -> None:
        start.wait(30)
        for i in range(400):
            case = cases[(i + offset) % len(cases)]
            got = sign(shared, *case)
            if got != expected[case]:
                errors.append(f"{case}: {got}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    # Switch threads as often as the interpreter allows, so a thread really is interrupted between reading
    # the cache and using it (with the default 5 ms interval a broken cache would almost never be caught).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


# --- End to end: what a real botocore DynamoDB client signs ---------------------------------------------------


@pytest.fixture
def isolated_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Keep the developer's AWS config/env from changing the client's behaviour."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ACCOUNT_ID",
        "AWS_ACCOUNT_ID_ENDPOINT_MODE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))


def capture_client_request(endpoint_url: str, region: str, token: Optional[str], call: str, params: dict) -> Any:
    """Run one DynamoDB call through a real botocore client and return the signed request it would send."""
    client = botocore.session.get_session().create_client(
        "dynamodb",
        region_name=region,
        endpoint_url=endpoint_url,
        aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET,
        aws_session_token=token,
    )
    captured = []

    class _Raw:
        def stream(self, **_: Any) -> Any:
            yield b"{}"

    def before_send(request: Any, **_: Any) -> AWSResponse:
        captured.append(request)
        return AWSResponse(request.url, 200, {}, _Raw())

    client.meta.events.register("before-send.dynamodb.*", before_send)
    getattr(client, call)(**params)
    client.close()
    assert len(captured) == 1
    return captured[0]


@pytest.mark.parametrize("url, host", ENDPOINTS[:2])
@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize(
    "call, params",
    [
        ("get_item", {"TableName": "locks", "Key": {"pk": {"S": "é日本🔒"}}, "ConsistentRead": True}),
        (
            "put_item",
            {
                "TableName": "locks",
                "Item": {"pk": {"S": "job"}, "n": {"N": "3"}},
                "ConditionExpression": "attribute_not_exists(pk)",
            },
        ),
    ],
)
def test_matches_real_botocore_client(
    monkeypatch: pytest.MonkeyPatch,
    isolated_aws_env: None,
    url: str,
    host: str,
    token: Optional[str],
    call: str,
    params: dict,
) -> None:
    now_s = NOW + 12.25
    pin_botocore_clock(monkeypatch, now_s)
    request = capture_client_request(url, "us-east-1", token, call, params)
    sent = {name: (value.decode() if isinstance(value, bytes) else value) for name, value in request.headers.items()}
    # The shape we assume: these are signed; User-Agent is blacklisted, the rest are added after signing.
    assert "X-Amz-Content-SHA256" not in sent
    assert sent["Content-Type"] == CONTENT_TYPE
    assert set(sent) - {"User-Agent", "amz-sdk-invocation-id", "amz-sdk-request", "Content-Length"} == (
        {"Content-Type", "X-Amz-Target", "X-Amz-Date", "Authorization"} | ({"X-Amz-Security-Token"} if token else set())
    )
    ours = sign_ours(url=url, body=request.body, target=sent["X-Amz-Target"], token=token, now_s=now_s)
    assert_same(ours, sent, token)
    assert ours["Host"] == host
    assert ours["X-Amz-Target"] == sent["X-Amz-Target"]
    assert request.url == url


def test_a_process_without_hashlib_signs_the_same_without_loading_openssl() -> None:
    """The renewal process has not loaded hashlib: it signs with CPython's own SHA-256 (no libcrypto),
    and its signatures are the ones this process, which uses OpenSSL's, makes."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fastlease.stores.dynamodb.sigv4 import SigV4Signer\n"
        "headers = SigV4Signer('eu-west-1').sign(host='dynamodb.eu-west-1.amazonaws.com', body=b'{\"k\":1}',\n"
        "    target='DynamoDB_20120810.UpdateItem', access_key='AKID', secret_key='secret', token='tok',\n"
        "    now_s=1_700_000_000.0)\n"
        "print(headers['Authorization'])\n"
        "print('_hashlib' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    authorization, loaded = done.stdout.split("\n")[:2]
    assert loaded == "False"
    assert "hashlib" in sys.modules  # this process signs with OpenSSL's SHA-256
    here = SigV4Signer("eu-west-1").sign(host="dynamodb.eu-west-1.amazonaws.com", body=b'{"k":1}',
                                         target="DynamoDB_20120810.UpdateItem", access_key="AKID",
                                         secret_key="secret", token="tok", now_s=1_700_000_000.0)
    assert here["Authorization"] == authorization
