"""python -m cli: the same as the `bellwether` command."""

import sys

from cli.main import main

sys.exit(main())
