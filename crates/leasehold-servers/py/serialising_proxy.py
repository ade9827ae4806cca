"""A test-kit HTTP proxy that serialises the requests to an emulator: one in flight to it at a
time, over one keep-alive connection.

Emulators written as threaded servers may carry out two concurrent conditional writes as one
check and two writes: moto accepts two PUTs with `If-Match` the same ETag when they arrive
together, which S3 refuses. Behind this proxy each request reaches the emulator after the one
before it was answered, so a conditional write is checked against the state the previous write
left, as on the real service. Requests and answers pass through unchanged: method, target,
headers (Host included; not the hop-by-hop ones) and status; bodies are re-framed with a
Content-Length (a chunked request body is read whole first).

With `--gcs-delete-precondition` it also adds what fake-gcs-server lacks and real Cloud Storage
does: `ifGenerationMatch` on a DELETE of an object. fake-gcs-server carries out
`DELETE /storage/v1/b/B/o/NAME?ifGenerationMatch=G` whatever the object's generation; the proxy
first reads the object's metadata: missing → 404, another generation → 412, each with a JSON
error body as Cloud Storage writes it; the same generation → the DELETE is forwarded. Because
nothing else reaches the emulator through the proxy between the read and the DELETE, the check
and the delete are one step, as on the real service.

Usage: python serialising_proxy.py --upstream PORT [--gcs-delete-precondition]. Listens on a free
loopback port and prints it on stdout. Standard library only.
"""

import argparse
import http.client
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

# Headers that belong to one connection, not to the request or answer.
HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}

OBJECT = re.compile(r"^/storage/v1/b/([^/]+)/o/([^/]+)$")


def gcs_error(code, message, reason, **extra):
    """A JSON error body as Cloud Storage's JSON API writes it."""
    detail = {"message": message, "domain": "global", "reason": reason}
    detail.update(extra)
    return json.dumps({"error": {"code": code, "message": message, "errors": [detail]}}).encode()


class Upstream:
    """One keep-alive connection to the emulator, used by one request at a time."""

    def __init__(self, port):
        self.port = port
        self.lock = threading.Lock()
        self.conn = None

    def _exchange(self, method, target, headers, body):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port)
        self.conn.request(method, target, body=body, headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, resp.reason, resp.getheaders(), data

    def send(self, method, target, headers, body):
        """(status, reason, headers, body) of the emulator's answer. A kept connection the
        emulator closed while idle is replaced once (the request never reached it)."""
        reused = self.conn is not None
        try:
            return self._exchange(method, target, headers, body)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.close()
            if not reused:
                raise
            return self._exchange(method, target, headers, body)
        except Exception:
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle's algorithm holds the second
    # until the client's delayed ACK of the first (tens of milliseconds per request).
    disable_nagle_algorithm = True
    upstream = None  # set in main
    gcs_delete_precondition = False  # set in main

    def log_message(self, *_args):
        pass

    def _body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self):
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        send_body = body if body or self.command in ("POST", "PUT", "PATCH") else None
        up = self.upstream
        try:
            with up.lock:
                answer = self._precondition(up, headers)
                if answer is None:
                    answer = up.send(self.command, self.path, headers, send_body)
        except Exception as e:  # the emulator is gone or answered nonsense
            answer = (502, "Bad Gateway", [("Content-Type", "text/plain")], f"proxy: {e}\n".encode())
        self._reply(*answer)

    def _precondition(self, up, headers):
        """With --gcs-delete-precondition, for a DELETE of an object with `ifGenerationMatch`: the
        answer Cloud Storage gives when the object is missing or has another generation; None when
        the DELETE may go on (and for every other request)."""
        if not self.gcs_delete_precondition or self.command != "DELETE":
            return None
        parts = urlsplit(self.path)
        m = OBJECT.match(parts.path)
        wanted = parse_qs(parts.query).get("ifGenerationMatch")
        if m is None or not wanted:
            return None
        meta_headers = {k: v for k, v in headers.items() if k.lower() in ("host", "authorization")}
        status, reason, hdrs, data = up.send("GET", parts.path, meta_headers, None)
        json_type = [("Content-Type", "application/json; charset=UTF-8")]
        if status == 404:
            bucket, name = unquote(m.group(1)), unquote(m.group(2))
            msg = f"No such object: {bucket}/{name}"
            return 404, "Not Found", json_type, gcs_error(404, msg, "notFound")
        if status != 200:
            return status, reason, hdrs, data
        generation = str(json.loads(data).get("generation", ""))
        if generation != wanted[0]:
            msg = "At least one of the pre-conditions you specified did not hold."
            body = gcs_error(
                412, msg, "conditionNotMet", locationType="header", location="If-Match"
            )
            return 412, "Precondition Failed", json_type, body
        return None

    def _reply(self, status, reason, headers, data):
        try:
            # Not send_response: it adds the proxy's own Server and Date headers, and the answer
            # would carry two of each (a client reads the first Date: the proxy's).
            self.send_response_only(status, reason)
            length = None
            for k, v in headers:
                if k.lower() == "content-length":
                    length = v
                elif k.lower() not in HOP:
                    self.send_header(k, v)
            if self.command == "HEAD":
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
            elif status in (204, 304) or 100 <= status < 200:
                self.end_headers()
            else:
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client left (its own timeout)
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # A client that reset or closed its connection (a partition of the fault harness, a
        # client's own timeout) is no error of the proxy's: no traceback on stderr for it.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument(
        "--gcs-delete-precondition",
        action="store_true",
        help="enforce ifGenerationMatch on a DELETE of a Cloud Storage object",
    )
    args = p.parse_args()
    Handler.upstream = Upstream(args.upstream)
    Handler.gcs_delete_precondition = args.gcs_delete_precondition
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
