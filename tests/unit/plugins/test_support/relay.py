# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A TCP relay on 127.0.0.1 in front of a local engine's port, the one the router tests and bench/router_overload.py
put between vllm-router and a stand-in engine to hold or slow what passes: bytes pass both ways as they come, and a
subclass sees each chunk first (`chunk`) to wait, count, or send it itself."""
import socket
import threading


class Relay:
    """Listens on a free loopback port (`url`) and relays each connection to `upstream_port`, a thread per direction.
    `backlog`: the listen queue (a load test needs more than a test's 64)."""

    backlog = 64

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(self.backlog)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _peer = self.sock.accept()
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                return
            state = self.connection()
            threading.Thread(target=self.pipe, args=(conn, up, True, state), daemon=True).start()
            threading.Thread(target=self.pipe, args=(up, conn, False, state), daemon=True).start()

    def connection(self):
        """What both directions of one connection share (chunk's `state`); None unless a subclass keeps something."""
        return None

    def chunk(self, data, dst, inbound, state):
        """Called with each chunk before it passes (`inbound`: from the router toward the engine): may wait or count;
        True when it sent the chunk to `dst` itself."""
        return False

    def pipe(self, src, dst, inbound, state):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.chunk(data, dst, inbound, state):
                    dst.sendall(data)
        except OSError:
            pass
        for end in (src, dst):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.sock.close()
