"""The admin credential's proof: bound to one method, a few minutes old at most, never
accepted by a process that has no credential; where a process finds the credential."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sqsq import admincred

KEY = b"k" * 64
METHOD = "/sqsq.v1.Admin/ReadSnapshot"


def test_a_proof_holds_for_its_method_and_a_few_minutes() -> None:
    proof = admincred.token(KEY, METHOD, now=1_000_000)
    assert admincred.verify(KEY, proof, METHOD, now=1_000_000 + 60)
    assert not admincred.verify(KEY, proof, "/sqsq.v1.Admin/CreateSnapshot", now=1_000_000)
    assert not admincred.verify(KEY, proof, METHOD, now=1_000_000 + 301)
    assert not admincred.verify(b"o" * 64, proof, METHOD, now=1_000_000)
    assert not admincred.verify(None, proof, METHOD, now=1_000_000)
    assert not admincred.verify(KEY, None, METHOD)
    assert not admincred.verify(KEY, "garbage", METHOD)


def test_where_the_credential_comes_from(tmp_path: Path) -> None:
    assert admincred.load(tmp_path, env={}) is None
    made = admincred.load(tmp_path, env={}, create=True)
    path = tmp_path / admincred.FILE_NAME
    assert made == path.read_bytes().strip() and len(made) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    other = tmp_path / "other"
    other.write_text("x" * 40 + "\n")
    assert admincred.load(tmp_path, env={admincred.ENV_TOKEN_FILE: str(other)}) == b"x" * 40
    assert admincred.load(tmp_path, env={admincred.ENV_TOKEN: "v" * 32,
                                         admincred.ENV_TOKEN_FILE: str(other)}) == b"v" * 32
    env: dict[str, str] = {}
    admincred.for_children(env, tmp_path)
    assert env == {admincred.ENV_TOKEN_FILE: str(path.resolve())}


def test_a_short_credential_is_refused() -> None:
    with pytest.raises(admincred.CredentialError, match=r"\$SQSQ_ADMIN_TOKEN: .* 5 bytes"):
        admincred.load(None, env={admincred.ENV_TOKEN: "short"})


def test_a_tool_follows_each_cluster_it_is_given_but_never_one_the_env_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench runs one cluster after another in one process: the second must not inherit
    the first's credential file (deleted with its directory by then), or every Admin call
    and every node it starts fails."""
    monkeypatch.delenv(admincred.ENV_TOKEN, raising=False)
    monkeypatch.delenv(admincred.ENV_TOKEN_FILE, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        admincred.load(directory, env={}, create=True)
    admincred.use_directory(first)
    assert admincred.load(None) == (first / admincred.FILE_NAME).read_bytes().strip()
    admincred.use_directory(second)
    assert admincred.load(None) == (second / admincred.FILE_NAME).read_bytes().strip()
    third = tmp_path / "third"
    children = dict(os.environ)  # a cluster's children get its own credential, made now
    admincred.for_children(children, third)
    assert children[admincred.ENV_TOKEN_FILE] == str((third / admincred.FILE_NAME).resolve())
    named = tmp_path / "named"
    named.write_text("n" * 40)
    monkeypatch.setenv(admincred.ENV_TOKEN_FILE, str(named))
    admincred.use_directory(first)
    assert admincred.load(None) == b"n" * 40
