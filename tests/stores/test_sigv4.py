"""``fastlease.stores._sigv4.SigV4Signer`` must sign exactly what botocore signs, byte for byte.

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

import botocore.auth
import botocore.session
import pytest
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.credentials import Credentials

from fastlease.stores import _sigv4
from fastlease.stores._sigv4 import SigV4Signer

CONTENT_TYPE = "application/x-amz-json-1.0"
GET_ITEM = "DynamoDB_20120810.GetItem"
PUT_ITEM = "DynamoDB_20120810.PutItem"
ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
# Session tokens are long base64 strings with '/', '+' and '='.
TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD+example/token==" * 4
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NOW_DATE = "20231114T221320Z"

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


def test_botocore_clock_pin_takes_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the reference itself: if botocore stops reading the clock via this attribute, say so."""
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/",
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
    ours = SigV4Signer("us-east-1").sign(
        host=host, body=body, target=GET_ITEM, access_key=ACCESS, secret_key=SECRET, token=token, now_s=NOW
    )
    reference = botocore_sign(
        monkeypatch, url=url, body=body, target=GET_ITEM, secret=SECRET, token=token, region="us-east-1", now_s=NOW
    )
    assert_same(ours, reference, token)
    assert ours["X-Amz-Date"] == NOW_DATE
    # The Host we send is the one botocore signed (it derives it from the URL).
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
    host = f"dynamodb.{region}.amazonaws.com"
    body = b'{"TableName":"locks"}'
    ours = SigV4Signer(region).sign(
        host=host, body=body, target=PUT_ITEM, access_key=ACCESS, secret_key=SECRET, token=token, now_s=NOW
    )
    reference = botocore_sign(
        monkeypatch,
        url=f"https://{host}/",
        body=body,
        target=PUT_ITEM,
        secret=SECRET,
        token=token,
        region=region,
        now_s=NOW,
    )
    assert_same(ours, reference, token)
    assert f"/{region}/dynamodb/aws4_request," in ours["Authorization"]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("token", TOKENS)
def test_matches_botocore_per_body(monkeypatch: pytest.MonkeyPatch, body: bytes, token: Optional[str]) -> None:
    ours = SigV4Signer("eu-west-1").sign(
        host="127.0.0.1:5000",
        body=body,
        target=PUT_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token=token,
        now_s=NOW,
    )
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/",
        body=body,
        target=PUT_ITEM,
        secret=SECRET,
        token=token,
        region="eu-west-1",
        now_s=NOW,
    )
    assert_same(ours, reference, token)


def test_bodies_differ_in_signature() -> None:
    """The payload hash is really part of the signature (escaped vs raw UTF-8 of the same JSON differ)."""
    signer = SigV4Signer("us-east-1")
    signatures = {
        signer.sign(
            host="127.0.0.1:5000",
            body=param.values[0],
            target=PUT_ITEM,
            access_key=ACCESS,
            secret_key=SECRET,
            token=None,
            now_s=NOW,
        )["Authorization"]
        for param in BODIES
    }
    assert len(signatures) == len(BODIES)


def test_date_change_rederives_key(monkeypatch: pytest.MonkeyPatch) -> None:
    signer = SigV4Signer("us-east-1")
    last_second = 1_700_006_399.0  # 2023-11-14T23:59:59Z
    next_day = last_second + 1.0  # 2023-11-15T00:00:00Z
    results = []
    for now_s in (last_second, next_day):
        ours = signer.sign(
            host="127.0.0.1:5000",
            body=b"{}",
            target=GET_ITEM,
            access_key=ACCESS,
            secret_key=SECRET,
            token=TOKEN,
            now_s=now_s,
        )
        reference = botocore_sign(
            monkeypatch,
            url="http://127.0.0.1:5000/",
            body=b"{}",
            target=GET_ITEM,
            secret=SECRET,
            token=TOKEN,
            region="us-east-1",
            now_s=now_s,
        )
        assert_same(ours, reference, TOKEN)
        results.append(ours)
    assert [r["X-Amz-Date"] for r in results] == ["20231114T235959Z", "20231115T000000Z"]
    assert signer.key_derivations == 2
    # And back to the previous day (a clock step back) re-derives again rather than reusing the new key.
    ours = signer.sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token=TOKEN,
        now_s=last_second,
    )
    assert ours == results[0]
    assert signer.key_derivations == 3


def test_secret_change_same_day_rederives_key(monkeypatch: pytest.MonkeyPatch) -> None:
    signer = SigV4Signer("us-east-1")
    rotated = "Zm9vYmFyYmF6cXV4cm90YXRlZHNlY3JldGtleTEy"
    seen = []
    for secret, now_s in ((SECRET, NOW), (rotated, NOW + 60.0)):
        ours = signer.sign(
            host="127.0.0.1:5000",
            body=b"{}",
            target=GET_ITEM,
            access_key=ACCESS,
            secret_key=secret,
            token=TOKEN,
            now_s=now_s,
        )
        reference = botocore_sign(
            monkeypatch,
            url="http://127.0.0.1:5000/",
            body=b"{}",
            target=GET_ITEM,
            secret=secret,
            token=TOKEN,
            region="us-east-1",
            now_s=now_s,
        )
        assert_same(ours, reference, TOKEN)
        seen.append(ours["Authorization"])
    assert signer.key_derivations == 2
    assert seen[0] != seen[1]


def test_cached_key_is_reused_same_day_same_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same secret and UTC day: one derivation, whatever else changes (second, body, target, token, access
    key, host), and every signature still matches botocore."""
    signer = SigV4Signer("us-east-1")
    calls: list[tuple[float, bytes, str, Optional[str], str, str]] = [
        (NOW, b"{}", GET_ITEM, None, ACCESS, "127.0.0.1:5000"),
        (NOW, b"{}", GET_ITEM, None, ACCESS, "127.0.0.1:5000"),
        (NOW + 1.0, b'{"a":1}', PUT_ITEM, TOKEN, ACCESS, "127.0.0.1:5000"),
        (NOW + 3600.5, b'{"b":2}', GET_ITEM, TOKEN, "ASIAOTHERKEY", "127.0.0.1:5000"),
        (NOW + 3601.0, b"{}", PUT_ITEM, None, ACCESS, "localhost:8000"),
    ]
    for now_s, body, target, token, access, host in calls:
        ours = signer.sign(
            host=host, body=body, target=target, access_key=access, secret_key=SECRET, token=token, now_s=now_s
        )
        reference = botocore_sign(
            monkeypatch,
            url=f"http://{host}/",
            body=body,
            target=target,
            secret=SECRET,
            token=token,
            region="us-east-1",
            now_s=now_s,
            access=access,
        )
        assert_same(ours, reference, token)
        assert signer.key_derivations == 1


def test_key_cache_counts_derivations_from_zero() -> None:
    signer = SigV4Signer("us-east-1")
    assert signer.key_derivations == 0
    signer.sign(host="h", body=b"{}", target=GET_ITEM, access_key=ACCESS, secret_key=SECRET, token=None, now_s=NOW)
    assert signer.key_derivations == 1


def test_signers_for_different_regions_do_not_share_keys() -> None:
    kwargs: dict[str, Any] = dict(
        host="h", body=b"{}", target=GET_ITEM, access_key=ACCESS, secret_key=SECRET, token=None, now_s=NOW
    )
    east = SigV4Signer("us-east-1").sign(**kwargs)["Authorization"]
    west = SigV4Signer("us-west-2").sign(**kwargs)["Authorization"]
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
    ours = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token=None,
        now_s=now_s,
    )
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/",
        body=b"{}",
        target=GET_ITEM,
        secret=SECRET,
        token=None,
        region="us-east-1",
        now_s=now_s,
    )
    assert_same(ours, reference, None)
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
    ours = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token=TOKEN,
        now_s=NOW,
        path=path,
    )
    reference = botocore_sign(
        monkeypatch,
        url=f"http://127.0.0.1:5000{path}",
        body=b"{}",
        target=GET_ITEM,
        secret=SECRET,
        token=TOKEN,
        region="us-east-1",
        now_s=NOW,
    )
    assert_same(ours, reference, TOKEN)


def test_header_values_are_trimmed_in_the_canonical_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """SigV4 "trimall": botocore signs the whitespace-collapsed value; the header is still sent as given."""
    token = "  tok\t en  with   runs "
    target = f" {GET_ITEM}  "
    ours = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=target,
        access_key=ACCESS,
        secret_key=SECRET,
        token=token,
        now_s=NOW,
    )
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/",
        body=b"{}",
        target=target,
        secret=SECRET,
        token=token,
        region="us-east-1",
        now_s=NOW,
    )
    assert_same(ours, reference, token)
    assert ours["X-Amz-Target"] == target
    plain = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token="tok en with runs",
        now_s=NOW,
    )
    assert plain["Authorization"] == ours["Authorization"]


def test_empty_token_means_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore tests ``if credentials.token``: an empty string sends and signs no token header."""
    ours = SigV4Signer("us-east-1").sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token="",
        now_s=NOW,
    )
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/",
        body=b"{}",
        target=GET_ITEM,
        secret=SECRET,
        token="",
        region="us-east-1",
        now_s=NOW,
    )
    assert_same(ours, reference, None)


@pytest.mark.parametrize("key_len", [0, 1, 32, 63, 64, 65, 200])
def test_hmac_helper_matches_stdlib_hmac(key_len: int) -> None:
    key = bytes(i % 256 for i in range(key_len))
    msg = "AWS4-HMAC-SHA256\n20231114T221320Z\né".encode()
    assert _sigv4._hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_memo_is_bounded_and_stays_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    signer = SigV4Signer("us-east-1")
    for i in range(_sigv4._MEMO_LIMIT * 2 + 3):
        signer.sign(
            host="127.0.0.1:5000",
            body=b"{}",
            target=GET_ITEM,
            access_key=ACCESS,
            secret_key=SECRET,
            token=f"token-{i}",
            now_s=NOW,
            path=f"/p{i}",
        )
        assert len(signer._header_memo) <= _sigv4._MEMO_LIMIT
        assert len(signer._path_memo) <= _sigv4._MEMO_LIMIT
    ours = signer.sign(
        host="127.0.0.1:5000",
        body=b"{}",
        target=GET_ITEM,
        access_key=ACCESS,
        secret_key=SECRET,
        token="token-0",
        now_s=NOW,
        path="/p0",
    )
    reference = botocore_sign(
        monkeypatch,
        url="http://127.0.0.1:5000/p0",
        body=b"{}",
        target=GET_ITEM,
        secret=SECRET,
        token="token-0",
        region="us-east-1",
        now_s=NOW,
    )
    assert_same(ours, reference, "token-0")


def test_concurrent_signing_with_rotating_secrets_and_days() -> None:
    """No lock: many threads share one signer while the cached key keeps flipping between secrets and days.
    Every result must equal the single-threaded one for the same inputs (a torn cache would mix a key for one
    secret/day with the scope of another)."""
    secrets = [SECRET, "second-secret-key-0000000000000000000000", "third-secret-key-11111111111111111111111"]
    times = [NOW, NOW + 86_400.0, NOW + 2 * 86_400.0]
    cases = [(s, t) for s in secrets for t in times]

    def sign(signer: SigV4Signer, secret: str, now_s: float) -> str:
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
        start.wait()
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
            thread.join()
    finally:
        sys.setswitchinterval(interval)
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
    ours = SigV4Signer("us-east-1").sign(
        host=host,
        body=request.body,
        target=sent["X-Amz-Target"],
        access_key=ACCESS,
        secret_key=SECRET,
        token=token,
        now_s=now_s,
    )
    assert_same(ours, sent, token)
    assert ours["X-Amz-Target"] == sent["X-Amz-Target"]
    assert request.url == url
