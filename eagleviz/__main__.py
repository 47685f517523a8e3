import sys

from eagleviz.cli import main

sys.exit(main())
