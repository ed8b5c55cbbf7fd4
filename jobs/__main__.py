import sys

from jobs.ops.cli import main

sys.exit(main())
