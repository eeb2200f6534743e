"""The rehearsal server serves inside the unit's sandbox, and systemd itself rates that sandbox and the
sandboxes of the watchdog's and OnFailure='s units.

The gate of converge and side_effect and test_drain's streams ran against this unit, so the
server serves under it (test_watchdog.py runs the watchdog under its own); these tests read what
systemd applied to the running process and what ``systemd-analyze security`` makes of the units
(docs/security.md).
"""

from __future__ import annotations

import re

UNIT = "inference-server"
# systemd-analyze security's overall exposure (0 = best, 10 = worst; 1.0-4.9 is "OK") must stay at or
# below this. Measured 1.4 (systemd 252, Debian 12 container, 2026-12-02); before the sandbox of
# issue 26 the unit measured 7.5 "EXPOSED".
MAX_EXPOSURE = 2.0
# The watchdog and the give-up recorder (issue 44, item 6): root (systemctl and the key file need it) without
# any capability, a read-only system but their state and the textfile, no devices, private /tmp, IPC and
# mounts, @system-service calls; the watchdog reaches loopback and this host's addresses, the recorder no
# network at all. Rated 8.7 EXPOSED before (ProtectSystem=full, every capability); 1.5 and 0.7 offline
# (systemd-analyze --offline=true, systemd 252, the templates as rendered for this scenario; to be measured
# here by the lead). The thresholds leave the same margin as the server's (0.5): a container's systemd
# reads the IP allow-list and the devices of the running host, which moves the figure by a tenth or two.
MAX_EXPOSURE_WATCHDOG = 2.0
MAX_EXPOSURE_GAVE_UP = 1.2


def test_systemd_rates_the_units_sandbox_below_the_threshold(host, systemd_exposure):
    score, table = systemd_exposure(host, UNIT)
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE} for {UNIT}.service:\n{table}"


def test_the_running_server_is_inside_the_sandbox(host):
    shown = host.run(
        f"systemctl show -p ProtectSystem,ProtectHome,PrivateDevices,PrivateTmp,ProtectProc,"
        f"NoNewPrivileges,RestrictNamespaces,UMask,DevicePolicy,IPAddressDeny {UNIT}"
    ).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert props["ProtectSystem"] == "strict"
    assert props["ProtectHome"] == "yes"
    assert props["PrivateDevices"] == props["PrivateTmp"] == "yes"
    assert props["ProtectProc"] == "invisible"
    assert props["NoNewPrivileges"] == "yes"
    assert props["UMask"] == "0077"
    assert props["DevicePolicy"] == "closed"
    # A loopback bind gets the IP filter too (issue 44): loopback and this host's own addresses.
    assert sorted(props["IPAddressDeny"].split()) == ["0.0.0.0/0", "::/0"]
    # What the kernel applies to the main process: no capabilities, no new privileges, a seccomp filter.
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    status = host.file(f"/proc/{pid}/status").content_string
    assert re.search(r"^CapBnd:\s+0+$", status, re.M), status
    assert re.search(r"^CapEff:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
    assert re.search(r"^Seccomp:\s+2$", status, re.M), status
    assert host.service(UNIT).is_running


def test_the_loopback_server_reaches_only_loopback_and_its_own_addresses(host):
    allow = host.run(f"systemctl show -p IPAddressAllow --value {UNIT}").stdout.split()
    own = host.run("hostname --all-ip-addresses").stdout.split()
    assert {"127.0.0.0/8", "::1/128"} <= set(allow), allow
    assert {a.split("/")[0] for a in allow} - {"127.0.0.0", "::1"} <= set(own), (allow, own)


def test_the_running_server_writes_no_core_and_has_ipc_of_its_own(host):
    """LimitCORE=0 (a core dump would hold the API key and the secrets of its environment) and PrivateIPC."""
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    limits = host.file(f"/proc/{pid}/limits").content_string
    assert re.search(r"^Max core file size\s+0\s+0\s+bytes", limits, re.M), limits
    # inference_server_limits' LimitNOFILE (65536), or the container's own ceiling when that is lower
    # (docker gives PID 1 a hard limit of its daemon's choosing: 20000 on the CI machines).
    ceiling = re.search(r"^Max open files\s+\d+\s+(\d+)", host.file("/proc/1/limits").content_string, re.M)
    wanted = min(65536, int(ceiling.group(1)))
    assert re.search(rf"^Max open files\s+{wanted}\s+{wanted}\s+files", limits, re.M), (wanted, limits)
    ipc = host.run(f"readlink /proc/{pid}/ns/ipc /proc/1/ns/ipc").stdout.split()
    assert len(ipc) == 2 and ipc[0] != ipc[1], ipc


def test_systemd_rates_the_watchdogs_and_the_give_up_recorders_sandbox_below_their_thresholds(host, systemd_exposure):
    for unit, threshold in ((f"{UNIT}-watchdog", MAX_EXPOSURE_WATCHDOG), (f"{UNIT}-gave-up", MAX_EXPOSURE_GAVE_UP)):
        score, table = systemd_exposure(host, unit)
        assert score <= threshold, f"exposure {score} > {threshold} for {unit}.service:\n{table}"


def test_the_watchdogs_units_run_as_root_without_capabilities_on_a_read_only_system(host):
    for unit, network in ((f"{UNIT}-watchdog", True), (f"{UNIT}-gave-up", False)):
        shown = host.run(
            f"systemctl show -p ProtectSystem,CapabilityBoundingSet,ReadWritePaths,PrivateDevices,PrivateNetwork,"
            f"NoNewPrivileges,IPAddressDeny {unit}.service"
        ).stdout
        props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        assert (props["ProtectSystem"], props["CapabilityBoundingSet"], props["NoNewPrivileges"]) == (
            "strict",
            "",
            "yes",
        )
        assert sorted(props["ReadWritePaths"].split()) == [
            f"/var/lib/{UNIT}-deploy",
            "/var/lib/node_exporter/textfile_collector",
        ], props
        assert props["PrivateDevices"] == "yes" and props["PrivateNetwork"] == ("no" if network else "yes"), props
        assert sorted(props["IPAddressDeny"].split()) == ["0.0.0.0/0", "::/0"], props
