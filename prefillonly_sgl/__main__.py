import sys

from prefillonly_sgl.cli import main

sys.exit(main())
