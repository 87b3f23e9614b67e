#!/usr/bin/env python3
"""Write the PCI part of the simulated hosts' sysfs trees (tests/harness/profiles/<profile>/sys):
`devices/pci<root>/<bridge>/.../<bdf>/` for every PCI function (vendor, device, class, numa_node, uevent),
`bus/pci/devices/<bdf>` links to them as the kernel makes them, and `class/infiniband/<hca>/device` links.
The layouts below are what the profiles' sys/README.md tables describe. `--check` exits 1 when a committed
tree differs from what this would write (a unit test runs it)."""

import os
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROFILES = ROOT / "tests" / "harness" / "profiles"

# (vendor, device, class, driver) of the functions used
V100S = ("0x10de", "0x1df6", "0x030200", "nvidia")
MI100 = ("0x1002", "0x738c", "0x038000", "amdgpu")
CX7 = ("0x15b3", "0x1021", "0x020700", "mlx5_core")
BF3 = ("0x15b3", "0xa2dc", "0x020000", "mlx5_core")
XEON_ROOT_PORT = ("0x8086", "0x347a", "0x060400", "pcieport")
EPYC_ROOT_PORT = ("0x1022", "0x1483", "0x060400", "pcieport")
PEX_SWITCH_PORT = ("0x1000", "0xc010", "0x060400", "pcieport")  # Broadcom PEX88096, as in DGX A100


def fn(bdf, ident, numa, *children, hca=None):
    return {"bdf": bdf, "ident": ident, "numa": numa, "children": children, "hca": hca}


def bdf(bus, dev=0):
    return "0000:%02x:%02x.0" % (bus, dev)


def nvidia_8gpu_rdma():
    """DGX-style: 4 PCIe switches (2 per NUMA node), each with 2 second-level switches holding 1 GPU + 1 HCA.

    The GPUs keep the bus ids of the replayed capture (a VM's: all on bus 00) and the HCAs the made-up ones
    of the profile, so below a bridge they sit on bus 00, which a real kernel never shows; the bridges are
    numbered as a real host would number them (root port 00:0k.0 -> bus k0, ...)."""
    gpus = ["0000:00:%02x.0" % dev for dev in range(0x0D, 0x15)]
    hcas = [("mlx5_0", "0000:00:15.0"), ("mlx5_1", "0000:00:16.0"), ("mlx5_4", "0000:00:17.0"),
            ("mlx5_5", "0000:00:18.0"), ("mlx5_6", "0000:00:19.0"), ("mlx5_7", "0000:00:1a.0"),
            ("mlx5_8", "0000:00:1b.0"), ("mlx5_9", "0000:00:1c.0")]
    ports = []
    for k in range(4):
        numa, base = k // 2, 0x10 * (k + 1)
        subs = []
        for j, sub in enumerate((base + 2, base + 6)):
            name, hca_bdf = hcas[2 * k + j]
            subs.append(fn(bdf(base + 1, j), PEX_SWITCH_PORT, numa,
                           fn(bdf(sub), PEX_SWITCH_PORT, numa,
                              fn(bdf(sub + 1, 0), PEX_SWITCH_PORT, numa, fn(gpus[2 * k + j], V100S, numa)),
                              fn(bdf(sub + 1, 1), PEX_SWITCH_PORT, numa, fn(hca_bdf, CX7, numa, hca=name)))))
        ports.append(fn("0000:00:%02x.0" % (k + 1), XEON_ROOT_PORT, numa,
                        fn(bdf(base), PEX_SWITCH_PORT, numa, *subs)))
    ports.append(fn("0000:00:05.0", XEON_ROOT_PORT, 0, fn("0000:00:1d.0", BF3, 0, hca="mlx5_bond_0")))
    return {"pci0000:00": ports}


def amd_4gpu_rdma():
    """Two-socket EPYC: one root complex per quadrant (pci0000:00/20/40/60 on NUMA 0, 80/a0/c0/e0 on NUMA 1).
    Each GPU of the capture (83, a3, c3, e3:00.0, NUMA 1) shares a PCIe switch with one HCA (mlx5_6..9);
    mlx5_0/1/4/5 sit alone below root ports of NUMA 0, the BlueField-3 bond next to mlx5_0. Bus numbers are
    consistent (root port 80:01.1 -> bus 81 -> 82 -> GPU 83 / HCA 84)."""
    roots = {}
    for q, hca in enumerate(("mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")):
        r = 0x80 + 0x20 * q
        roots["pci0000:%02x" % r] = [
            fn("0000:%02x:01.1" % r, EPYC_ROOT_PORT, 1,
               fn(bdf(r + 1), PEX_SWITCH_PORT, 1,
                  fn(bdf(r + 2, 0), PEX_SWITCH_PORT, 1, fn(bdf(r + 3), MI100, 1)),
                  fn(bdf(r + 2, 1), PEX_SWITCH_PORT, 1, fn(bdf(r + 4), CX7, 1, hca=hca))))]
    for q, hca in enumerate(("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5")):
        r = 0x20 * q
        roots["pci0000:%02x" % r] = [fn("0000:%02x:01.1" % r, EPYC_ROOT_PORT, 0, fn(bdf(r + 1), CX7, 0, hca=hca))]
    roots["pci0000:00"].append(fn("0000:00:03.1", EPYC_ROOT_PORT, 0, fn(bdf(0x02), BF3, 0, hca="mlx5_bond_0")))
    return roots


LAYOUTS = {"nvidia-8gpu-rdma": nvidia_8gpu_rdma, "amd-4gpu-rdma": amd_4gpu_rdma}


def write(sysdir, roots):
    for sub in ("devices", os.path.join("bus", "pci", "devices")):
        shutil.rmtree(sysdir / sub, ignore_errors=True)
    (sysdir / "bus" / "pci" / "devices").mkdir(parents=True)

    def put(parent, rel, node):
        path, rel = parent / node["bdf"], rel + "/" + node["bdf"]
        path.mkdir(parents=True)
        vendor, device, klass, driver = node["ident"]
        files = {"vendor": vendor, "device": device, "class": klass, "numa_node": str(node["numa"]),
                 "uevent": "DRIVER=%s\nPCI_ID=%s:%s\nPCI_SLOT_NAME=%s" % (
                     driver, vendor[2:].upper(), device[2:].upper(), node["bdf"])}
        for name, text in files.items():
            (path / name).write_text(text + "\n")
        os.symlink("../../.." + rel, sysdir / "bus" / "pci" / "devices" / node["bdf"])
        if node["hca"]:
            link = sysdir / "class" / "infiniband" / node["hca"] / "device"
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink("../../../bus/pci/devices/" + node["bdf"], link)
        for child in node["children"]:
            put(path, rel, child)

    for root, ports in roots.items():
        (sysdir / "devices" / root).mkdir(parents=True)
        for node in ports:
            put(sysdir / "devices" / root, "/devices/" + root, node)


def snapshot(sysdir):
    """{relative path: link target | file bytes | None (directory)} of what `write` owns."""
    result = {}
    tops = [sysdir / "devices", sysdir / "bus" / "pci"]
    tops += sorted((sysdir / "class" / "infiniband").glob("*/device"))
    for top in tops:
        if top.is_symlink() or top.is_file():
            result[str(top.relative_to(sysdir))] = os.readlink(top) if top.is_symlink() else top.read_bytes()
            continue
        for dirpath, dirs, files in os.walk(top):
            for name in dirs + files:
                path = pathlib.Path(dirpath, name)
                key = str(path.relative_to(sysdir))
                if path.is_symlink():
                    result[key] = os.readlink(path)
                else:
                    result[key] = None if path.is_dir() else path.read_bytes()
    return result


def main(argv):
    check = "--check" in argv
    stale = []
    for profile, layout in LAYOUTS.items():
        sysdir = PROFILES / profile / "sys"
        if not check:
            write(sysdir, layout())
            continue
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "sys"
            shutil.copytree(sysdir, copy, symlinks=True)
            write(copy, layout())
            if snapshot(copy) != snapshot(sysdir):
                stale.append(profile)
    if stale:
        print("out of date (run scripts/gen-sim-pci.py): %s" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
