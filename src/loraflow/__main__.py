import sys

from loraflow.commands.cli import main

sys.exit(main())
