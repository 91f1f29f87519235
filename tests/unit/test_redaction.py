"""crewlet.redaction: known secret values and credential shapes out of text,
whole or streamed, what a node knows, and the environment of other programs."""

from __future__ import annotations

import io
import json
import random
import string

import pytest

from crewlet import log, redaction
from crewlet.agent.providers import base
from crewlet.redaction import REDACTED, Stream, scrub

KEY = "correcthorse-0123456789-battery"
TOKEN = "cwl_Zm9vYmFyYmF6cXV1eA"


@pytest.fixture(autouse=True)
def nothing_known():
    redaction.forget_all()
    yield
    redaction.forget_all()


def test_known_values_are_replaced_longest_first_and_short_ones_ignored():
    assert redaction.learn([KEY, TOKEN, "short", None, ""]) == 2
    assert redaction.learn([KEY]) == 0  # known already
    assert redaction.known() == {KEY, TOKEN}
    text = f"the key is {KEY}, the token {TOKEN}; a short is fine"
    assert scrub(text) == f"the key is {REDACTED}, the token {REDACTED}; a short is fine"
    # A known value inside a longer known value: the longer one wins whole.
    redaction.learn([KEY[:12]])
    assert scrub(f"<{KEY}>") == f"<{REDACTED}>"
    assert scrub(f"<{KEY[:12]}>") == f"<{REDACTED}>"
    # Regex metacharacters in a value are literal.
    redaction.learn(["a.b*c+d?e(f)"])
    assert scrub("xa.b*c+d?e(f)x axbbcde") == f"x{REDACTED}x axbbcde"


def test_shapes_are_redacted_as_base_redact_did_and_base_redact_is_this_one():
    said = ('Incorrect API key provided: sk-proj-abcdef123456. Authorization: Bearer abc.def-123456 '
            '{"api_key": "q1w2e3r4t5"} password=hunter2hunter2 Bearer authentication failed')
    out = scrub(said)
    for gone in ("sk-proj-abcdef123456", "abc.def-123456", "q1w2e3r4t5", "hunter2hunter2"):
        assert gone not in out
    assert "Bearer authentication failed" in out and 'api_key": "[redacted]"' in out
    assert "password=[redacted]" in out
    # The provider's redact: its own key, the known values and the shapes.
    redaction.learn([TOKEN])
    assert base.redact(f"{KEY} {TOKEN} sk-abcdefgh12", [KEY]) == f"{REDACTED} {REDACTED} {REDACTED}"
    assert base.REDACTED == REDACTED and base.SECRET_MIN == redaction.SECRET_MIN
    assert base.env_secrets({"OPENAI_API_KEY": "v1", "HOME": "/root"}) == ["v1"]


def test_text_without_a_secret_is_returned_as_is():
    # What it costs is bench/redaction.py's to measure, beside a bare scan: tests assert no speed.
    text = " ".join("".join(random.choices(string.ascii_letters + string.digits, k=random.randint(2, 9)))
                    for _ in range(1500))  # ~10 KB of words none of which is a secret or a shape's word
    text = text.replace("sk", "xx").lower()
    assert scrub(text) is text and redaction.scrub_known(text) is text
    redaction.learn(["".join(random.choices(string.ascii_letters, k=40)) for _ in range(20)])
    assert scrub(text) is text
    # And the fast path is not blind: the same text with a secret in the middle.
    secret = sorted(redaction.known())[0]
    half = len(text) // 2
    assert scrub(text[:half] + secret + text[half:]) == text[:half] + REDACTED + text[half:]


def test_a_json_tool_result_with_keys_and_tokens_is_not_searched_for_shapes_and_no_shape_is_missed():
    # "key" and "token" are in most JSON tool results; a shape opens with more than either.
    result = json.dumps({"items": [{"key": f"PROJ-{i}", "title": "fix it", "monkey": "token-bucket",
                                    "tokens": {"input": 12, "output": 3}, "keys": ["a1b2c3d4e5"]}
                                   for i in range(20)]})
    assert not redaction.may_hold_shape(result)
    assert scrub(result) is result
    # The look passes over nothing the regex would match: every opening, in any case, and
    # in the letters (?i) takes for ASCII ones ("ſ" for s, "ı"/"İ" for i, the Kelvin sign for k).
    odd = {"s": "\u017f", "i": "\u0131", "k": "\u212a"}
    openings = ["api_key=", "api-key: ", "APIKEY=", '"x-api-key": "', "access_token=", "Access-Token: ",
                "accesstoken=", "auth_token=", "auth-token: ", "AuthToken=", "secret=", "password: ",
                "Bearer ", "basic ", "sk-"]
    rnd = random.Random(7)
    for opening in openings:
        for _ in range(30):
            word = "".join(rnd.choice((c.upper(), c.lower(), odd.get(c.lower(), c))) for c in opening)
            text = f'{{"note": "x", "v": "{word}abcdefgh12345678"}}'
            if redaction.SECRET_SHAPES.search(text):
                assert redaction.may_hold_shape(text), text
                assert "abcdefgh12345678" not in scrub(text), text
    # İ (U+0130) lowers to two characters: still seen.
    dotted = "ap\u0130_key=abcdefgh1"
    assert redaction.SECRET_SHAPES.search(dotted) and redaction.may_hold_shape(dotted)
    assert scrub('{"api_key": "q1w2e3r4t5", "key": "k"}') == '{"api_key": "[redacted]", "key": "k"}'


def test_a_tool_calls_arguments_are_scrubbed_deeply_and_kept_when_clean():
    redaction.learn([KEY])
    clean = {"a": ["x", {"b": 1}], "c": None}
    assert redaction.scrub_value(clean) is clean
    dirty = {"text": f"say {KEY}", "list": [KEY, 3, {"deep": KEY}], KEY: "as a key"}
    assert redaction.scrub_value(dirty) == {"text": f"say {REDACTED}", "list": [REDACTED, 3, {"deep": REDACTED}],
                                             REDACTED: "as a key"}


@pytest.mark.parametrize("seed", range(20))
def test_a_streamed_text_split_anywhere_never_shows_a_secret(seed):
    rnd = random.Random(seed)
    redaction.learn([KEY, TOKEN])
    text = (f"Here is what the tool said: {KEY} and then {TOKEN}, also "
            f"api_key: z9y8x7w6v5 and Bearer tok3n-abcdef, and sk-abcdefgh1234 — done. ") * 3
    stream, shown = Stream(), []
    i = 0
    while i < len(text):
        n = rnd.randint(1, 12)
        out = stream.feed(text[i:i + n])
        shown.append(out)
        i += n
        # Nothing released so far holds a secret, nor a piece of the known ones that is
        # long enough to be a whole shape's credential.
        so_far = "".join(shown)
        assert KEY not in so_far and TOKEN not in so_far
    shown.append(stream.end())
    whole = "".join(shown)
    for gone in (KEY, TOKEN, "z9y8x7w6v5", "tok3n-abcdef", "sk-abcdefgh1234"):
        assert gone not in whole, (gone, whole)
    assert whole == scrub(text)
    # Every known secret's first characters were held back, not shown early and then taken back.
    assert not any(KEY[:20] in piece for piece in shown)


@pytest.mark.parametrize("opening", ["password=", '"api_key": "', "Authorization: Bearer ", "secret: ",
                                     "sk-"])
def test_a_streamed_credential_whose_digits_come_late_is_held_until_it_is_decided(opening):
    # Longer than the stream's hold, and a credential only once its digits come.
    credential = "abcdefghij" * 4 + "42"
    text = f"the tool said {opening}{credential} and then went on for a while, as a reply does."
    stream, shown = Stream(), ""
    for ch in text:  # a character a piece: the worst split there is
        shown += stream.feed(ch)
        assert "abcdefgh" not in shown, shown  # not one piece of it shown before it is decided
    shown += stream.end()
    assert shown == scrub(text) and credential not in shown and "abcdefgh" not in shown, shown
    if opening == "sk-":
        return  # a vendor key needs no digit: forty letters are one
    # Decided as no credential (no digit, then a space): released as it was.
    plain = f"the tool said {opening}{'abcdefghij' * 4} and then went on for a while, as a reply does."
    stream = Stream()
    out = "".join(stream.feed(w + " ") for w in plain.split(" "))
    assert len(out) >= len(plain) - redaction.STREAM_HOLD - 2 and (out + stream.end()).rstrip() == plain


@pytest.mark.parametrize("seed", range(8))
def test_a_stream_never_shows_what_the_whole_texts_scrub_hides(seed):
    # Random texts of shape openings, credentials, known values and separators, split at
    # random: at every moment what was shown is the start of scrub(the whole text).
    redaction.learn([KEY, TOKEN])
    parts = ["password=", "PASSWORD: ", '"api_key": "', "x-api-key=", "Bearer ", "basic ", "sk-", "xsk-",
             "mysecret=", "token", "key", " ", ", ", "\n", '"', "}", "&", "a", "b", "1", "42", "\u00e9",
             "\u0130", "\u017f", KEY[:10], KEY, TOKEN, "-", "_", ".", "/", "=", "[", "abcdefghij" * 4,
             "12345678"]
    rnd = random.Random(seed)
    for _ in range(400):
        text = "".join(rnd.choice(parts) for _ in range(rnd.randint(1, 40)))
        whole, stream, shown, i = scrub(text), Stream(), "", 0
        while i < len(text):
            n = rnd.randint(1, 20)
            shown += stream.feed(text[i:i + n])
            i += n
            assert whole.startswith(shown), (text, shown)
        assert shown + stream.end() == whole, text


def test_a_stream_releases_text_as_it_comes_and_drops_a_void_attempt():
    stream = Stream()
    words = "a model writes its reply word by word, and a person sees it come " * 4
    out = "".join(stream.feed(w + " ") for w in words.split())
    assert len(out) >= len(words) - redaction.STREAM_HOLD - 2  # only the tail is held
    stream.drop()
    assert stream.end() == ""


def test_known_secrets_gathers_a_nodes_from_company_config_and_run_dir(tmp_path, monkeypatch):
    from crewlet import credentials, tokens
    from crewlet.config.model import NodeConfig

    run = tmp_path / "data" / "run"
    run.mkdir(parents=True, mode=0o700)
    users = credentials.ensure(str(run))
    token, _ = tokens.ensure_admin_token(str(run))
    fleet = tmp_path / "fleet.secret"
    credentials.write_fleet_secrets(str(fleet), [credentials.new_fleet_secret()])
    smtp = tmp_path / "smtp.pass"
    smtp.write_text("smtp-password-123\n")
    smtp.chmod(0o600)
    monkeypatch.setenv("T_S3_SECRET", "s3-secret-key-456")
    monkeypatch.setenv("T_PROVIDER_KEY", KEY)
    monkeypatch.setenv("T_HOOK_SECRET", "hook-secret-789")
    cfg = NodeConfig.model_validate({
        "node": {"id": "t1"}, "data_dir": str(tmp_path / "data"),
        "stream": {"fleet_credentials": str(fleet)},
        "smtp": {"host": "localhost", "username": "u", "password_file": str(smtp)},
        "files": {"secret_key_env": "T_S3_SECRET"}})
    company = {"providers": {"p": {"kind": "openai", "api_key_env": "T_PROVIDER_KEY"},
                             "q": {"kind": "scripted"}, "r": {"kind": "openai", "api_key_env": "T_UNSET"}},
               "integrations": {"gh": {"kind": "github", "secret_env": "T_HOOK_SECRET"}}}
    found = redaction.known_secrets(cfg, company=company)
    assert found == {KEY, "hook-secret-789", "smtp-password-123", "s3-secret-key-456", token,
                     *users.values(), *credentials.read_fleet_secrets(str(fleet))}
    # Nothing made yet is nothing known, not a failure.
    assert redaction.known_secrets(None, str(tmp_path / "nowhere")) == set()
    # learn_company learns them; a company as a model works as its dump does.
    from crewlet.company.model import Company
    model = Company.model_validate({"company": {"name": "t"}, "providers": company["providers"],
                                    "seats": [{"name": "s", "persona": "p", "provider": "q"}]})
    assert redaction.company_env_names(model) == ["T_PROVIDER_KEY", "T_UNSET"]
    assert redaction.learn_company(company, cfg) == len(found)
    assert scrub(f"{token} {KEY}") == f"{REDACTED} {REDACTED}"


def test_bare_env_keeps_nothing_secret():
    environ = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "OPENAI_API_KEY": KEY, "HOME": "/root",
               "GOMEMLIMIT": "1GiB", "CREWLET_NATS_SERVER": "/x"}
    assert redaction.bare_env(environ=environ) == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "GOMEMLIMIT": "1GiB"}
    assert redaction.bare_env({"X": "1"}, environ={})["X"] == "1"


def test_forwarded_child_lines_lose_known_secrets():
    out = io.StringIO()
    log.configure(node="t1", role="crewlet", fmt="json", stream=out)
    log.forward(f"stray {KEY}\n".encode(), role="seats", pid=7)  # nothing known: as it was
    redaction.learn([KEY])
    log.forward(f"stray {KEY} Bearer abcdefgh123\n".encode(), role="seats", pid=7)
    ours = json.dumps({"ts": 1, "level": "info", "event": "tool_said", "text": f"x {KEY} x"})
    log.forward(ours.encode() + b"\n", role="seats", pid=7)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["line"] == f"stray {KEY}"
    assert lines[1]["line"] == f"stray {REDACTED} Bearer {REDACTED}"
    assert lines[2]["event"] == "tool_said" and lines[2]["text"] == f"x {REDACTED} x"


def test_a_turn_records_error_is_scrubbed_wherever_it_goes():
    # roles/seats/turns.py makes a failed turn's error of its exception's text, which may
    # quote a secret; the record leaves the process as as_dict() (the live feed, custody,
    # the estate's row) and as its fields (the seat's stats, the `turn` log line).
    from crewlet.agent.turn import TurnRecord

    redaction.learn([KEY])
    record = TurnRecord("s", "t1", "n1", 3, 1)
    said = f"ProviderError: refused {KEY}, Authorization: Bearer abcdefgh123"
    record.outcome, record.error = "failed", said
    for error in (record.error, record.as_dict()["error"]):
        assert error == f"ProviderError: refused {REDACTED}, Authorization: Bearer {REDACTED}"
    assert TurnRecord("s", "t1", "n1", 3, 1, error=f"x {KEY}").as_dict()["error"] == f"x {REDACTED}"
    clean = TurnRecord("s", "t1", "n1", 3, 1)
    assert clean.error is None and clean.as_dict()["error"] is None
    assert set(clean.as_dict()) == {f.name for f in __import__("dataclasses").fields(TurnRecord)}
