"""Make `ansible_collections.narwhal.deploy` importable from a plain checkout.

collections/ansible_collections/narwhal/deploy is a link to the repository root.
"""
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))
