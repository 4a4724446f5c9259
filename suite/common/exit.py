"""End a command without the interpreter's teardown.

A command that imported torch spends 0.3-1 s after its last line tearing down modules and
collecting their objects (measured on 2 cores: ``python -m suite.submit`` of a tiny run printed its
last line 0.7 s before the process ended; the tests start it ~150 times). Nothing in that teardown is
needed: what must run at exit runs here first (``atexit`` handlers: logging, multiprocessing,
``weakref.finalize``'s temporary folders; threads that are not daemons are joined; the standard
streams flushed), then the process ends with the command's exit code. An exception other than
``SystemExit`` is not caught: it ends the process the usual way, with its traceback.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Callable, NoReturn


def run_command(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())``, without the teardown."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # sys.exit("message"): printed, exit status 1
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else int(code)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head) or stream: nothing left to say
            pass
    os._exit(code)
