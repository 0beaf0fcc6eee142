"""The GitHub Actions workflows (.github/workflows/), read from their YAML: the test workflow runs
``make test`` on every push and pull request with the interpreters the Makefile asks for, and the
wheels workflow runs the cibuildwheel that pyproject.toml pins. The workflows are in a git checkout
only (not in an sdist, nor in the wheel's copy of the suite): elsewhere these tests skip."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no workflows here")


def _workflow(name: str) -> dict[Any, Any]:
    import yaml  # the test dependency group has PyYAML; the wheel's suite never gets here

    loaded = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), name
    return loaded


def _triggers(workflow: dict[Any, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean true.
    triggers = workflow.get("on", workflow.get(True))
    if isinstance(triggers, str):
        triggers = [triggers]
    if isinstance(triggers, list):
        triggers = dict.fromkeys(triggers)
    assert isinstance(triggers, dict), triggers
    return triggers


def _steps(workflow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def _makefile_extra_pythons() -> list[str]:
    found = re.search(r"^EXTRA_PYTHONS \?=(.*)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert found, "the Makefile sets no EXTRA_PYTHONS default"
    return found.group(1).split()


def test_the_test_workflow_runs_on_every_push_and_pull_request() -> None:
    triggers = _triggers(_workflow("test.yml"))
    for event in ("push", "pull_request"):
        assert event in triggers, triggers
        # A filter (tags, branches, paths) would leave some pushes or pull requests untested.
        assert not triggers[event], f"{event} is filtered: {triggers[event]}"


def test_the_test_workflow_runs_make_test_on_ubuntu_with_the_whole_history() -> None:
    workflow = _workflow("test.yml")
    assert [job["runs-on"] for job in workflow["jobs"].values()] == ["ubuntu-latest"]
    runs = [line.strip() for step in _steps(workflow) for line in str(step.get("run", "")).splitlines()]
    assert "make test" in runs, runs
    # .ci/check-commit-subjects (run by make test) fails under CI=true without the history after its base.
    checkouts = [step for step in _steps(workflow) if str(step.get("uses", "")).startswith("actions/checkout@")]
    assert [step.get("with", {}).get("fetch-depth") for step in checkouts] == [0]


def test_the_test_workflow_sets_up_the_interpreters_that_make_test_uses() -> None:
    workflow = _workflow("test.yml")
    installed = [str(step["with"]["python-version"]) for step in _steps(workflow)
                 if str(step.get("uses", "")).startswith("actions/setup-python@")]
    extra_pythons = workflow.get("env", {}).get("EXTRA_PYTHONS")
    wanted = extra_pythons.split() if extra_pythons is not None else _makefile_extra_pythons()
    assert wanted, "the workflow would run the all_pythons tests on no other interpreter"
    # Each of EXTRA_PYTHONS exactly (the Makefile checks the version that answers), and 3.11 as the default:
    # the last one set up, which is the one the pyenv step makes global.
    assert set(wanted) <= set(installed), (wanted, installed)
    assert installed[-1] == "3.11", installed
    assert any("pyenv" in str(step.get("run", "")) for step in _steps(workflow)), "no step sets up pyenv"


def test_the_wheels_workflow_runs_the_cibuildwheel_that_pyproject_pins() -> None:
    pinned = re.search(r'"cibuildwheel==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pinned, "pyproject.toml's wheel group pins no cibuildwheel"
    actions = [str(step["uses"]) for step in _steps(_workflow("wheels.yml"))
               if str(step.get("uses", "")).startswith("pypa/cibuildwheel@")]
    assert actions and all(action == f"pypa/cibuildwheel@v{pinned.group(1)}" for action in actions), actions
