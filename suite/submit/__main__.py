import sys

from suite.submit.cli import main

sys.exit(main())
