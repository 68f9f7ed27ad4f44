import sys

from loraflow.cli import main

sys.exit(main())
