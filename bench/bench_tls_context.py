"""What the HTTP client's TLS connections cost in CPU: one verifying context per CA bundle
(envbuild/upstream/http_client.py) against urllib3 parsing the bundle for every connection.

``lock`` checks every file's sha256 against its index's pages, eight pages at once, each on a
connection of its own; the registry client opens two (the token server's, the registry's).
Here an https server on 127.0.0.1 (a trustme certificate) holds each reply until ``--pages``
requests are in, so that a fresh client opens that many connections at once; the CA bundle is
the system's with the test CA appended (PIP_CERT, as a proxy's CA is given). Both ways run in
the same rounds, interleaved: the client as it is, and the same client with its shared context
turned off (urllib3's own path, what every connection did before). The CPU is the process's:
the server's handshakes are in both, alike. Prints the medians and their ratio.

    python bench/bench_tls_context.py [--pages 8] [--rounds 9] [--bundle /etc/ssl/certs/ca-certificates.crt]
"""

from __future__ import annotations

import argparse
import http.server
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trustme  # noqa: E402

from envbuild.upstream import http_client  # noqa: E402


class Held(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    gate: threading.Barrier

    def do_GET(self) -> None:
        Held.gate.wait(20)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def once(url: str, pages: int, bundle: Path, shared: bool) -> float:
    """CPU seconds of the process while a fresh client gets ``pages`` pages at once."""
    Held.gate = threading.Barrier(pages)
    original = http_client._WatchedAdapter._context
    if not shared:  # urllib3's own path: the bundle parsed for each connection
        http_client._WatchedAdapter._context = lambda self, *args: None  # type: ignore[method-assign]
    try:
        client = http_client.HttpClient(env={"PIP_CERT": str(bundle)},
                                        policy=http_client.HttpPolicy(total_timeout_s=30))
        start = time.process_time()
        threads = [threading.Thread(target=client.get, args=(f"{url}/page/{i}",)) for i in range(pages)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.process_time() - start
    finally:
        http_client._WatchedAdapter._context = original  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--bundle", type=Path, default=Path("/etc/ssl/certs/ca-certificates.crt"))
    args = parser.parse_args()
    authority = trustme.CA()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-tls-") as scratch:
        bundle = Path(scratch) / "bundle.pem"
        system = args.bundle.read_bytes() if args.bundle.is_file() else b""
        bundle.write_bytes(system + authority.cert_pem.bytes())
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        authority.issue_cert("127.0.0.1").configure_cert(context)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Held)
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"https://127.0.0.1:{server.server_address[1]}"
        times: dict[bool, list[float]] = {True: [], False: []}
        try:
            for round_ in range(args.rounds + 1):
                for shared in ((True, False) if round_ % 2 == 0 else (False, True)):
                    took = once(url, args.pages, bundle, shared)
                    if round_:  # the first round warms both up
                        times[shared].append(took)
        finally:
            server.shutdown()
            server.server_close()
    each = {shared: statistics.median(t) for shared, t in times.items()}
    print(f"bundle          {len(system) // 1024} KiB of CAs (+ the test CA); {args.pages} pages at once, "
          f"{args.rounds} interleaved rounds")
    for shared, name in ((True, "one context   "), (False, "per connection")):
        print(f"{name}  median {1000 * each[shared]:6.1f} ms CPU  {[round(1000 * t) for t in times[shared]]}")
    print(f"ratio           {each[False] / each[True]:.1f}x the CPU without the shared context; "
          f"{1000 * (each[False] - each[True]) / args.pages:.1f} ms per connection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
