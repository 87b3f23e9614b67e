"""The filter tls_hosts (plugins/filter/narwhal.py over _tls/certs.py::engine_host_names): tls_material's hosts for the
engine hosts of a play, from the hand-shaped launch records, a fleet that is not a list refused by name."""

import json

import pytest
from ansible.errors import AnsibleFilterError
from test_support.paths import HAND_LAUNCH_CONFIG

from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters


def test_each_engine_host_of_the_play_gets_its_url_host_and_record_address():
    launch = json.loads(HAND_LAUNCH_CONFIG.read_text())
    engines = {"gpu-a": "engine-1", "gpu-b": "engine-2"}
    fleet = [{"engine": "engine-1", "url": "https://e1.example:8000"}, {"engine": "engine-2", "url": "https://e2:8000"}]
    found = filters.tls_hosts(["gpu-b", "router-1"], engines, {"engine-2": ["gpu-b"]}, fleet, launch)
    assert found == [{"host": "gpu-b", "names": ["e2", launch["engines"]["engine-2"]["node"]["address"]]}]
    assert filters.FilterModule().filters()["tls_hosts"] is filters.tls_hosts


def test_a_fleet_that_is_not_a_list_is_refused_by_name():
    with pytest.raises(AnsibleFilterError, match=r"tls_hosts takes the resolved fleet \(a list"):
        filters.tls_hosts(["gpu-a"], {}, {}, {"engine-1": "x"})
