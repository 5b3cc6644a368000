"""``python -m dagtop``: the ``dagtop`` command, for where its script is not on the PATH."""

import sys

from dagtop.commands.cli import main

sys.exit(main())
