"""narwhal.deploy engine launcher: the zipapp's entry point (see narwhal_launcher/cli.py)."""
import sys

from narwhal_launcher.cli import main

sys.exit(main())
