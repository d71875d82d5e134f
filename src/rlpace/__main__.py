import sys

from rlpace.cli import main

sys.exit(main())
