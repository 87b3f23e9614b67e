# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The interface reader (plugins/module_utils/_facts/interface_reader.py): the nominal speed of an interface from
its sysfs `speed` file, over trees laid out as the kernel lays them out (a NIC, a veth, loopback, a missing
interface). (Its `ip` read is tested through the modules: tests/unit/plugins/modules/test_engine_host_facts.py.)"""

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.interface_reader import read_link_speed


def _net_tree(root, name, speed, virtual):
    """<root>/class/net/<name> linked into devices/ as the kernel links it: devices/virtual/net/<name> for a veth,
    devices/pci0000:00/0000:00:03.0/net/<name> for a NIC."""
    device = root / "devices" / ("virtual" if virtual else "pci0000:00/0000:00:03.0") / "net" / name
    device.mkdir(parents=True)
    if speed is not None:
        (device / "speed").write_text(speed)
    (root / "class" / "net").mkdir(parents=True, exist_ok=True)
    (root / "class" / "net" / name).symlink_to(device)


def test_read_link_speed_of_a_nic_a_veth_and_a_missing_interface(tmp_path):
    _net_tree(tmp_path, "ens1f0", "100000\n", False)
    _net_tree(tmp_path, "eth1", "10000\n", True)
    _net_tree(tmp_path, "lo", None, True)
    assert read_link_speed(str(tmp_path), "ens1f0") == {"mbps": 100000, "virtual": False, "why": None}
    veth = read_link_speed(str(tmp_path), "eth1")
    assert veth["mbps"] == 10000 and veth["virtual"] is True and "a veth always reports 10000" in veth["why"]
    lo = read_link_speed(str(tmp_path), "lo")
    assert lo["mbps"] is None and "cannot read %s" % (tmp_path / "class" / "net" / "lo" / "speed") in lo["why"]
    gone = read_link_speed(str(tmp_path), "eth9")
    assert gone["mbps"] is None and gone["virtual"] is False and "No such file" in gone["why"]
