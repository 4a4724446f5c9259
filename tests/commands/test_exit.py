"""Every command ends through suite.common.exit.run_command: its exit code, its atexit handlers
and its buffered output kept, the interpreter's teardown skipped."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)


def _run(body: str):
    code = ("import atexit, sys, threading, time\n"
            "from suite.common.exit import run_command\n"
            "atexit.register(lambda: print('atexit ran'))\n" + body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("main, code", [("lambda: 3", 3), ("lambda: None", 0), ("lambda: sys.exit(2)", 2)])
def test_the_exit_code_is_the_commands_and_atexit_handlers_run(main, code):
    proc = _run(f"print('buffered', end='')\nrun_command({main})")
    assert proc.returncode == code and proc.stdout == "bufferedatexit ran\n", proc


def test_a_message_exit_prints_it_and_fails():
    proc = _run("run_command(lambda: sys.exit('no such recipe'))")
    assert proc.returncode == 1 and proc.stderr.strip() == "no such recipe"


def test_a_thread_that_is_not_a_daemon_finishes_first():
    proc = _run("threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
                "run_command(lambda: 0)")
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["thread done", "atexit ran"]


def test_an_error_still_ends_with_its_traceback():
    proc = _run("def main():\n    raise RuntimeError('boom')\nrun_command(main)")
    assert proc.returncode == 1 and "RuntimeError: boom" in proc.stderr
