# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The input catalogue (plugins/module_utils/_inputs/catalogue.py) is where
.env.example and the input docs come from (scripts/gen-inputs.py --check)."""

import subprocess
import sys

from test_support.paths import REPO


def test_env_example_and_docs_are_generated_from_the_input_description():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-inputs.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout
