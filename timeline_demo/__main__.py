"""`python -m timeline_demo`: the end-to-end demo (see `timeline_demo.demo`)."""

import sys

from timeline_demo.demo import main

sys.exit(main())
