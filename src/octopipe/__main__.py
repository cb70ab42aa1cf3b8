import sys

from octopipe.cli import main

sys.exit(main())
