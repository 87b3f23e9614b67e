"""narwhal.deploy engine launcher, run on the engine host as one zipapp (launch_engine.pyz) built by prepare
from these files and the collection's pure planner (plugins/module_utils/_plan/ and the _common/ files it imports)."""
