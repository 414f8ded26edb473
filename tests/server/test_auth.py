"""``rlvr.server.auth``: which keys are accepted and where they come from, and the ASGI admission middleware (401
without a valid key, 413 over the size limit, both before any route runs or any body byte is read), driven in
process through fake ``receive`` / ``send`` callables, with no sockets."""

from __future__ import annotations

import asyncio
import json
import string

import pytest

from rlvr.errors import ConfigurationError
from rlvr.server import auth
from rlvr.server.auth import AdmissionMiddleware, BodyTooLarge, load_api_keys, principal_of

KEY = "tml-test-key-0123456789"
OTHER = "tml-other-key-0123456789"
LIMIT = 1000


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(auth.ENV_KEY, raising=False)
    monkeypatch.delenv(auth.ENV_KEYS_FILE, raising=False)
    return monkeypatch


class App:
    """The wrapped application: records each scope it sees and reads the whole body."""

    def __init__(self) -> None:
        self.scopes: list[dict] = []
        self.body = b""

    async def __call__(self, scope, receive, send) -> None:
        self.scopes.append(scope)
        if scope["type"] == "http":
            while True:
                message = await receive()
                self.body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


class Exchange:
    """One request through the middleware: the reply, and whether the app ran or any body was read."""

    def __init__(self, headers: dict[str, str], path: str = "/api/v1/forward_backward",
                 chunks: tuple[bytes, ...] = (b"",), keys: tuple[str, ...] = (KEY, OTHER)) -> None:
        self.app = App()
        self.reads = 0
        self.sent: list[dict] = []
        self.scope = {"type": "http", "path": path,
                      "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]}
        pending = list(chunks)

        async def receive() -> dict:
            self.reads += 1
            body = pending.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pending)}

        async def send(message: dict) -> None:
            self.sent.append(message)

        asyncio.run(AdmissionMiddleware(self.app, keys, max_body_bytes=LIMIT)(self.scope, receive, send))

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def detail(self) -> str:
        return json.loads(self.sent[1]["body"])["detail"]

    @property
    def rejected_untouched(self) -> bool:
        """The app never ran and not one body byte was read."""
        return not self.app.scopes and self.reads == 0


# -- load_api_keys ----------------------------------------------------------------------------------------------------


def test_keys_given_as_one_string_or_several_are_accepted_stripped_and_deduplicated(no_env):
    assert load_api_keys(KEY) == [KEY]
    assert load_api_keys([f"  {OTHER} ", KEY, OTHER, ""]) == [OTHER, KEY]


def test_keys_file_lines_with_comments_and_blanks(no_env, tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# the team's keys\n{KEY}  # laptop\n\n   \n{OTHER}\n")
    assert load_api_keys(keys_file=path) == [KEY, OTHER]
    assert load_api_keys(KEY, keys_file=str(path)) == [KEY, OTHER]  # arguments and file together


def test_keys_file_path_expands_the_home_folder(no_env, tmp_path):
    no_env.setenv("HOME", str(tmp_path))
    (tmp_path / "keys").write_text(KEY + "\n")
    assert load_api_keys(keys_file="~/keys") == [KEY]


def test_missing_keys_file_is_named(no_env, tmp_path):
    with pytest.raises(ConfigurationError, match=f"API keys file '{tmp_path / 'nope'}' does not exist"):
        load_api_keys(keys_file=tmp_path / "nope")


def test_environment_supplies_keys_only_when_no_argument_does(no_env, tmp_path):
    path = tmp_path / "keys"
    path.write_text(OTHER + "\n")
    no_env.setenv(auth.ENV_KEY, f"{KEY} , ,tml-third-key-0123456789")
    assert load_api_keys() == [KEY, "tml-third-key-0123456789"]
    no_env.setenv(auth.ENV_KEYS_FILE, str(path))
    assert load_api_keys() == [KEY, "tml-third-key-0123456789", OTHER]
    # An explicit argument replaces the environment, it does not add to it.
    assert load_api_keys("tml-explicit-0123456789") == ["tml-explicit-0123456789"]
    assert load_api_keys(keys_file=path) == [OTHER]


def test_no_key_anywhere_refuses_to_run_open(no_env):
    for given in (None, "", [], ["  "]):
        with pytest.raises(ConfigurationError, match="no API key configured: set RLVR_API_KEY=tml-"):
            load_api_keys(given)


def test_keys_must_start_with_tml_and_have_16_characters(no_env):
    assert load_api_keys("tml-" + "a" * 12) == ["tml-" + "a" * 12]  # exactly 16
    for bad in ("tml-" + "a" * 11, "sk-0123456789abcdefgh", "TML-0123456789abcdef"):
        with pytest.raises(ConfigurationError, match="must start with 'tml-' and be at least 16 characters"):
            load_api_keys(bad)


def test_a_refused_key_is_not_echoed_in_full(no_env):
    secret = "sk-SECRETSECRETSECRET"
    with pytest.raises(ConfigurationError) as caught:
        load_api_keys(secret)
    assert "SECRET" not in str(caught.value)


def test_principal_is_stable_distinct_and_does_not_reveal_the_key():
    assert principal_of(KEY) == principal_of(KEY)
    assert principal_of(KEY) != principal_of(OTHER)
    name = principal_of(KEY)
    assert set(name) <= set(string.hexdigits) and KEY[4:] not in name and "0123" not in name


# -- AdmissionMiddleware ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{"X-API-Key": KEY}, {"X-API-Key": OTHER}, {"Authorization": f"Bearer {KEY}"},
     {"Authorization": f"bearer   {KEY} "}],
    ids=["x_api_key", "second_key", "bearer", "bearer_lowercase_spaces"],
)
def test_a_valid_key_reaches_the_app_with_its_principal(headers):
    exchange = Exchange(headers, chunks=(b"abc", b"def"))
    assert exchange.status == 200
    key = headers.get("X-API-Key") or KEY
    assert exchange.app.scopes[0]["state"]["principal"] == principal_of(key)
    assert exchange.app.body == b"abcdef"


def test_two_keys_get_two_principals():
    one, two = Exchange({"X-API-Key": KEY}), Exchange({"X-API-Key": OTHER})
    assert one.app.scopes[0]["state"]["principal"] != two.app.scopes[0]["state"]["principal"]


def test_missing_key_is_401_before_the_app_runs_or_the_body_is_read():
    exchange = Exchange({"Content-Type": "application/json"}, chunks=(b"{}",))
    assert exchange.status == 401
    assert exchange.detail.startswith("missing API key: send it in the X-API-Key header")
    assert exchange.rejected_untouched
    assert exchange.sent[0]["headers"][0] == (b"content-type", b"application/json")


@pytest.mark.parametrize(
    "headers",
    [{"X-API-Key": "tml-wrong-key-000000000"}, {"X-API-Key": KEY[:-1]}, {"X-API-Key": KEY + "0"},
     {"X-API-Key": KEY.upper()}, {"X-API-Key": ""}, {"Authorization": f"Basic {KEY}"},
     {"Authorization": "Bearer tml-wrong-key-000000000"}, {"X-API-Key": "tml-\xe9\xff-0123456789ab"}],
    ids=["wrong", "prefix", "longer", "case", "empty", "basic_scheme", "wrong_bearer", "non_ascii"],
)
def test_an_invalid_key_is_401_before_the_app_runs_or_the_body_is_read(headers):
    exchange = Exchange(headers, chunks=(b"{}",))
    assert exchange.status == 401
    assert exchange.detail == "invalid API key: it is not one of the server's keys"
    assert exchange.rejected_untouched


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    # The module promises hmac.compare_digest against every key, whichever matches (or none): the time taken
    # does not tell which key, or which prefix, was close.
    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    keys = (KEY, OTHER, "tml-third-key-0123456789")
    for presented, ok in ((KEY, True), ("tml-third-key-0123456789", True), ("tml-wrong-key-000000000", False)):
        calls.clear()
        exchange = Exchange({"X-API-Key": presented}, keys=keys)
        assert (exchange.status == 200) is ok
        assert [b for _, b in calls] == [k.encode() for k in keys]
        assert all(a == presented.encode() for a, _ in calls)


def test_health_check_and_non_http_scopes_need_no_key():
    exchange = Exchange({}, path="/api/v1/healthz")
    assert exchange.status == 200 and exchange.app.scopes
    app = App()
    scope = {"type": "lifespan"}
    asyncio.run(AdmissionMiddleware(app, [KEY], max_body_bytes=LIMIT)(scope, None, None))
    assert app.scopes == [scope]


def test_declared_body_over_the_limit_is_413_and_at_the_limit_passes():
    at_limit = Exchange({"X-API-Key": KEY, "Content-Length": str(LIMIT)}, chunks=(b"x" * LIMIT,))
    assert at_limit.status == 200 and len(at_limit.app.body) == LIMIT
    over = Exchange({"X-API-Key": KEY, "Content-Length": str(LIMIT + 1)}, chunks=(b"x" * (LIMIT + 1),))
    assert over.status == 413
    assert over.detail == f"request body of {LIMIT + 1} bytes exceeds the server limit of {LIMIT} bytes; send fewer " \
                          "datums per request"
    assert over.rejected_untouched


def test_an_oversized_body_without_a_key_is_refused_for_the_key():
    exchange = Exchange({"Content-Length": str(10 * LIMIT)})
    assert exchange.status == 401 and exchange.rejected_untouched


def test_content_length_that_is_not_a_number_is_400():
    exchange = Exchange({"X-API-Key": KEY, "Content-Length": "12abc"})
    assert exchange.status == 400 and "Content-Length b'12abc' is not a number" in exchange.detail
    assert exchange.rejected_untouched


def test_streamed_body_growing_past_the_limit_stops_at_the_chunk_that_crosses_it():
    exchange = Exchange({"X-API-Key": KEY}, chunks=(b"x" * (LIMIT // 2), b"x" * (LIMIT // 2)))  # exactly LIMIT
    assert exchange.status == 200 and len(exchange.app.body) == LIMIT
    with pytest.raises(BodyTooLarge, match=f"exceeds the server limit of {LIMIT} bytes"):
        Exchange({"X-API-Key": KEY}, chunks=(b"x" * (LIMIT // 2), b"x" * (LIMIT // 2), b"x"))


def test_refusals_under_v1_use_openais_error_shape_and_the_tinker_routes_keep_theirs():
    missing = Exchange({}, path="/v1/chat/completions")
    error = json.loads(missing.sent[1]["body"])["error"]
    assert missing.status == 401 and missing.rejected_untouched
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("missing API key") and "Authorization: Bearer" in error["message"]
    over = Exchange({"X-API-Key": KEY, "Content-Length": str(LIMIT + 1)}, path="/v1/completions")
    assert over.status == 413 and "exceeds the server limit" in json.loads(over.sent[1]["body"])["error"]["message"]
    assert "detail" in json.loads(Exchange({}, path="/api/v1/create_session").sent[1]["body"])
