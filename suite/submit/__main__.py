from suite.common.exit import run_command
from suite.submit.cli import main

run_command(main)
