"""Every command the README shows is run here, as written.

The README's shell blocks are read from the file itself, so a command added to it, or a changed
output, is tested without editing this module:

- the set-up block names `make run` and `make test`; `make test` is what CI runs (`.ci/run`);
- the five-minute tour starts with `make run &`: it is started for real (on a free port, its
  checkpoint in a temporary directory: the only two things changed), and the tour waits for
  `encoder ready` as the README says;
- every other command of the tour runs in bash against that server, in the README's order, and a
  comment line under a command is its expected output: each must appear in what the command
  printed, with `...` standing for anything;
- the server is stopped as the tour says (Ctrl-C: SIGINT to its process group) and must drain;
- every `make <target>` the README names in its text is a target `make help` lists.

A README shell block outside the set-up and the tour fails the test: it would be a command that
nothing runs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testkit.server import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
TOUR_HEADING = "## Five-minute tour"
SETUP_HEADING = "## Set-up: two commands"
README_ADDRESS = "localhost:30000"
READY_LINE = "encoder ready ("  # the server's log line, not make's hint that names it


@dataclass
class Command:
    """One shell command of the README (continuation lines joined) and the output shown under it."""

    text: str
    expected: list[str] = field(default_factory=list)


def sections(text: str) -> dict[str, str]:
    """The README's ``## `` sections by heading line."""
    out: dict[str, str] = {}
    heading = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line.strip()
            out[heading] = ""
        else:
            out[heading] = out.get(heading, "") + line
    return out


def shell_blocks(text: str) -> list[str]:
    """The bodies of the ```bash blocks of ``text``."""
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[Command]:
    """A block's commands; a full-line comment under a command is its expected output."""
    out: list[Command] = []
    pending = ""
    for line in block.splitlines():
        if pending:
            pending += "\n" + line
        elif line.startswith("#"):
            assert out, f"a comment line before any command in a README shell block: {line!r}"
            out[-1].expected.append(line[1:].strip())
            continue
        elif not line.strip():
            continue
        else:
            pending = line
        if pending.endswith("\\"):
            continue
        out.append(Command(pending))
        pending = ""
    assert not pending, f"a README command ends with a line continuation: {pending!r}"
    return out


def without_comment(command: str) -> str:
    """The command with a trailing ``# ...`` explanation removed (none of the README's quote a #)."""
    return command.split("  #", 1)[0].strip()


def shows(output: str, expected: str) -> bool:
    """``expected``'s pieces between ``...`` appear in ``output`` in order."""
    at = 0
    for piece in expected.split("..."):
        found = output.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def readme_sections() -> dict[str, str]:
    return sections(README.read_text())


def test_every_shell_block_of_the_readme_is_one_this_module_runs() -> None:
    parts = readme_sections()
    assert SETUP_HEADING in parts and TOUR_HEADING in parts, "the README lost its set-up or tour section"
    for heading, body in parts.items():
        if heading not in (SETUP_HEADING, TOUR_HEADING):
            assert not shell_blocks(body), f"README section {heading!r} shows shell commands that no test runs"
    assert not re.findall(r"^```(?!bash\n|\n|$)(?:sh|shell|console)\b", README.read_text(), flags=re.M), \
        "shell commands in a block that is not marked bash"


def test_the_setup_commands_are_make_run_and_make_test_and_ci_runs_make_test() -> None:
    (block,) = shell_blocks(readme_sections()[SETUP_HEADING])
    assert [without_comment(c.text) for c in commands(block)] == ["make run", "make test"]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    ci_commands = [line for line in ci if line and not line.startswith("#") and not line.startswith("set ")
                   and not line.startswith("cd ")]
    assert ci_commands == ["make test"], f".ci/run runs more than the README's `make test`: {ci_commands}"


def test_every_make_target_the_readme_names_is_listed_by_make_help() -> None:
    named = set(re.findall(r"`make ([a-z][a-z0-9-]*)", README.read_text()))
    assert {"run", "test", "help"} <= named
    listed = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    help_targets = set(re.findall(r"^make ([a-z][a-z0-9-]*)", listed, flags=re.M))
    missing = named - help_targets - {"help"}
    assert not missing, f"`make help` does not list {sorted(missing)}:\n{listed}"


def _wait_for_line(log: Path, proc: subprocess.Popen[bytes], line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if line in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"`make run` exited with {proc.returncode} before {line!r}:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    pytest.fail(f"`make run` did not print {line!r} within {timeout} s:\n{log.read_text(errors='replace')}")


def _stop_like_ctrl_c(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C; then the group must be gone."""
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        proc.poll()  # reaps make once it exits: a zombie would still count as a member of the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"`make run` still ran 60 s after Ctrl-C:\n{log.read_text(errors='replace')}")
    proc.wait(10)


def test_the_five_minute_tour_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("the README's tour needs curl, which is not on PATH")
    blocks = shell_blocks(readme_sections()[TOUR_HEADING])
    tour = [c for block in blocks for c in commands(block)]
    assert tour and without_comment(tour[0].text) == "make run &", "the tour no longer starts with `make run &`"

    port = free_port()
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            ["make", "run", f"PORT={port}", f"MODEL={tmp_path / 'model'}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_for_line(log, server, READY_LINE, timeout=280)
        # One bash script for the whole tour (a variable set by one command is used by the next),
        # with a marker between commands so that each command's output is checked on its own.
        script = ["set -e"]
        for i, command in enumerate(tour[1:]):
            assert README_ADDRESS in command.text or "=" in command.text.split()[0], \
                f"a tour command that neither sets a variable nor talks to the server: {command.text!r}"
            script += [f"echo '@@ {i}'", command.text.replace(README_ADDRESS, f"127.0.0.1:{port}")]
        ran = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, f"the tour failed:\n{ran.stdout}\n{ran.stderr}"
        outputs = re.split(r"^@@ \d+\n", ran.stdout, flags=re.M)[1:]
        assert len(outputs) == len(tour) - 1
        for command, output in zip(tour[1:], outputs):
            for expected in command.expected:
                assert shows(output, expected), f"{command.text!r} printed\n{output}\nnot {expected!r}"
    finally:
        if server.poll() is None:
            _stop_like_ctrl_c(server, log)
    text = log.read_text(errors="replace")
    assert "drained" in text, f"Ctrl-C did not drain the server:\n{text}"
