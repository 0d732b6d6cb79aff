"""The command line: `token` refuses what would not work, and every command's --help helps."""

from __future__ import annotations

from pathlib import Path

import pytest

from memento_sessions.auth import verify_token
from memento_sessions.cli import main
from memento_sessions.cli.commands import build_parser
from memento_sessions.embedded.datadir import auth_secret
from tests.helpers import SECRET


@pytest.fixture(autouse=True)
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMENTO_AUTH_SECRET", raising=False)
    monkeypatch.delenv("MEMENTO_DATA_DIR", raising=False)


def test_token_without_a_daemons_data_dir_refuses_and_creates_nothing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = tmp_path / "elsewhere"
    assert main(["token", "--agent", "a1", "--data-dir", str(nowhere)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"no daemon's data dir at {nowhere}" in err and "MEMENTO_AUTH_SECRET" in err
    assert not nowhere.exists()


def test_token_signs_with_the_daemons_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = auth_secret(tmp_path)  # as `serve` makes it
    assert main(["token", "--agent", "a1", "--namespace", "team-a", "--data-dir", str(tmp_path)]) == 0
    identity = verify_token(secret, capsys.readouterr().out.strip())
    assert (identity.agent_id, identity.namespace) == ("a1", "team-a")


def test_token_signs_with_memento_auth_secret_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MEMENTO_AUTH_SECRET", SECRET)
    assert main(["token", "--agent", "a1", "--data-dir", str(tmp_path / "elsewhere")]) == 0
    assert verify_token(SECRET, capsys.readouterr().out.strip()).agent_id == "a1"
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(("ttl", "message"), [
    ("0", "must be a positive number of seconds, not 0"),
    ("-60", "must be a positive number of seconds, not -60"),
    ("soon", "'soon' is not a whole number of seconds"),
])
def test_token_refuses_a_ttl_that_is_not_positive(ttl: str, message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    auth_secret(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["token", "--agent", "a1", "--ttl", ttl, "--data-dir", str(tmp_path)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and f"argument --ttl: {message}" in err


COMMANDS = [["serve"], ["token"], ["check"], ["kg"], ["kg", "load"], ["prune"], ["mcp"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_a_helpful_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert not description.startswith(("positional", "options")), f"no description:\n{text}"
    if command != ["kg"]:
        assert "--data-dir" in text
    if command in (["serve"], ["token"], ["kg", "load"], ["check"], ["mcp"]):
        assert "example" in text, f"no example:\n{text}"


def test_ingest_into_an_unreachable_daemon_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text('{"type": "user", "message": {"role": "user", "content": "hi"}}\n')
    monkeypatch.setenv("MEMENTO_TOKEN", "any")
    assert main(["ingest", "--url", "ws://127.0.0.1:1/ws", str(transcript)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memento-sessions ingest: cannot connect to ws://127.0.0.1:1/ws:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
