"""A local user's squatter: binds the server's port in the window between the unit's port guard and the
engine's listen, answers every request as a healthy server would, and keeps what each client sent.

Usage: python3 squatter.py PORT ACCOUNT LOG STOPFILE. It binds 127.0.0.1:PORT when the port is free and a
process of ACCOUNT (the service account) started after the squatter: the engine of a start whose port
guard has already run. It answers each request 200 with "{}", until STOPFILE exists. LOG gets one JSON
line per connection (its bytes, decoded as latin-1) and a last line {"bound": n}.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def started_ticks(pid: str) -> int:
    """When process ``pid`` started, in clock ticks since boot (/proc/PID/stat, field 22)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def new_process_of(uid: int, since: int) -> bool:
    """Whether a process of ``uid`` started after ``since`` (clock ticks) runs now."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid and started_ticks(pid) > since:
                return True
        except OSError:
            continue
    return False


def serve(server: socket.socket, stop: str, out) -> None:  # noqa: ANN001 - a text file
    """Answer every connection on ``server`` until ``stop`` exists, logging what each sent."""
    server.listen(16)
    server.settimeout(0.2)
    while not os.path.exists(stop):
        try:
            client, _ = server.accept()
        except TimeoutError:
            continue
        client.settimeout(2)
        received = b""
        try:
            while b"\r\n\r\n" not in received and len(received) < 65536:
                chunk = client.recv(4096)
                if not chunk:
                    break
                received += chunk
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            pass
        client.close()
        out.write(json.dumps({"received": received.decode("latin-1")}) + "\n")
        out.flush()


def main() -> None:
    """Squat PORT in the start window until STOPFILE exists."""
    port, account, log, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    uid = pwd.getpwnam(account).pw_uid
    since = started_ticks("self")
    bound = 0
    with open(log, "a", encoding="utf-8") as out:
        while not os.path.exists(stop):
            time.sleep(0.01)
            if not new_process_of(uid, since):
                continue
            server = socket.socket()
            try:
                server.bind(("127.0.0.1", port))
            except OSError:
                server.close()
                continue
            bound += 1
            serve(server, stop, out)
            server.close()
        out.write(json.dumps({"bound": bound}) + "\n")


if __name__ == "__main__":
    main()
