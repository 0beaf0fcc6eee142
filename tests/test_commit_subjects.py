""".ci/check-commit-subjects (CONTRIBUTING.md, "Commit messages"): after its base commit, every commit message
starts with a subject of one line of at most 72 characters. Each test builds a small repository of
its own; the script is in a git checkout only (not in an sdist, nor in the wheel's copy of the suite)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "check-commit-subjects"

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no .ci/ here")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GIT_") and name != "CI"}
    # No repository above tmp_path is found, and no user configuration applies.
    env.update(GIT_CEILING_DIRECTORIES=str(tmp_path), HOME=str(tmp_path), GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid")
    env.update(extra)
    return env


def _git(repo: Path, tmp_path: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def _commit(repo: Path, tmp_path: Path, message: str) -> str:
    _git(repo, tmp_path, "commit", "-q", "--allow-empty", "--cleanup=verbatim", "-m", message)
    return _git(repo, tmp_path, "rev-parse", "HEAD")


def _check(tmp_path: Path, directory: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "-C", str(directory), *args], env=_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose base commit has a subject far over the limit: history before it is not checked."""
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, tmp_path, "init", "-q")
    return path, _commit(path, tmp_path, "x" * 300 + "\n\nthe old history")


def test_subjects_of_at_most_72_characters_pass(tmp_path: Path, repo: tuple[Path, str]) -> None:
    path, base = repo
    _commit(path, tmp_path, "a" * 72 + "\n\nwhy")
    _commit(path, tmp_path, "é" * 72 + "\n\ncharacters are counted, not UTF-8 bytes")
    _commit(path, tmp_path, "no body at all")
    done = _check(tmp_path, path, "--base", base)
    assert done.returncode == 0, done.stderr
    assert "3 commits after" in done.stdout


def test_a_subject_of_73_characters_fails_and_names_its_commit(tmp_path: Path, repo: tuple[Path, str]) -> None:
    path, base = repo
    _commit(path, tmp_path, "fine\n\nbody")
    long_one = _commit(path, tmp_path, "b" * 73 + "\n\nwhy")
    done = _check(tmp_path, path, "--base", base)
    assert done.returncode == 1, done.stdout
    assert f"{long_one[:12]} subject of 73 characters (at most 72)" in done.stderr
    assert done.stderr.count(" characters (at most 72)") == 1, done.stderr  # the fine commit passed


def test_a_subject_of_more_than_one_line_fails(tmp_path: Path, repo: tuple[Path, str]) -> None:
    path, base = repo
    wrapped = _commit(path, tmp_path, "a first line\nthat goes on here\n\nbody")
    done = _check(tmp_path, path, "--base", base)
    assert done.returncode == 1, done.stdout
    assert f"{wrapped[:12]} subject of more than one line" in done.stderr


def test_a_commit_on_a_merged_branch_is_checked(tmp_path: Path, repo: tuple[Path, str]) -> None:
    path, base = repo
    _git(path, tmp_path, "checkout", "-q", "-b", "side")
    on_side = _commit(path, tmp_path, "c" * 80)
    _git(path, tmp_path, "checkout", "-q", "-")
    _commit(path, tmp_path, "on the main line")
    _git(path, tmp_path, "merge", "-q", "--no-ff", "--no-edit", "side")
    done = _check(tmp_path, path, "--base", base)
    assert done.returncode == 1 and on_side[:12] in done.stderr, (done.stdout, done.stderr)


def test_without_history_it_skips_with_a_message_but_fails_under_ci(tmp_path: Path) -> None:
    unpacked = tmp_path / "fastlease-0.1.0"  # as an sdist unpacks: no .git
    unpacked.mkdir()
    skipped = _check(tmp_path, unpacked)
    assert skipped.returncode == 0 and "skipped" in skipped.stdout and "not a git checkout" in skipped.stdout
    under_ci = _check(tmp_path, unpacked, CI="true")
    assert under_ci.returncode == 1 and "CI must check" in under_ci.stderr, (under_ci.stdout, under_ci.stderr)


def test_a_shallow_clone_without_the_base_skips_but_fails_under_ci(tmp_path: Path, repo: tuple[Path, str]) -> None:
    path, base = repo
    _commit(path, tmp_path, "one")
    _commit(path, tmp_path, "two")
    shallow = tmp_path / "shallow"
    _git(tmp_path, tmp_path, "clone", "-q", "--depth", "1", f"file://{path}", str(shallow))
    skipped = _check(tmp_path, shallow, "--base", base)
    assert skipped.returncode == 0 and "not in this clone's history" in skipped.stdout, skipped.stdout
    assert _check(tmp_path, shallow, "--base", base, CI="true").returncode == 1


def test_this_repository_keeps_the_rule_after_the_base() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "after 227850fd20ba" in done.stdout, done.stdout
