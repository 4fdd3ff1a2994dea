#!/usr/bin/python3
"""Interop: a foreign gRPC client (Debian's python3-grpcio) calls nebula.v1.Exchange/Ping on
the C server (rpc_test_server) over mutual TLS, with messages encoded by hand from the .proto
field numbers. Also checks that a wrong-cluster certificate and plaintext are refused.
Exits 77 (skip) when grpc cannot be imported. Usage: interop_ping.py SERVER GEN_CERTS_SH"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import grpc
except ImportError:
    print("grpc not importable: skipping")
    sys.exit(77)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from pbwire import field, parse  # noqa: E402


def main():
    server, gen = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="nb_interop.")
    proc = None
    try:
        subprocess.run(["sh", gen, tmp], check=True)
        rd = lambda n: open(os.path.join(tmp, n), "rb").read()
        proc = subprocess.Popen(
            [server, "--ca", os.path.join(tmp, "ca.pem"), "--cert", os.path.join(tmp, "server.pem"),
             "--key", os.path.join(tmp, "server.key"), "--expect-cluster", "dc-b"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = proc.stdout.readline().decode()
        assert line.startswith("PORT "), "server did not start: %r" % line
        target = "127.0.0.1:%d" % int(line.split()[1])

        # PingRequest: seq=1, sent_unix_ns=2, sender=3, payload=4, reply_size=5
        sent = time.time_ns()
        req = (field(1, 7, 0) + field(2, sent, 0) + field(3, b"dc-b") +
               field(4, b"\x5a" * 1000) + field(5, 4096, 0))
        creds = grpc.ssl_channel_credentials(rd("ca.pem"), rd("client.key"), rd("client.pem"))
        with grpc.secure_channel(target, creds) as ch:
            rep = {k: v[-1] for k, v in
                   parse(ch.unary_unary("/nebula.v1.Exchange/Ping")(req, timeout=10)).items()}
        # PingReply: seq=1, echo_sent_unix_ns=2, recv_unix_ns=3, responder=4, payload_size_seen=5,
        # payload=6
        assert rep[1] == 7, rep
        assert rep[2] == sent, rep
        assert rep[3] > 0
        assert rep[4] == b"dc-a", rep[4]
        assert rep[5] == 1000, rep[5]
        assert rep[6] == bytes(i & 0xFF for i in range(4096))
        print("mTLS Ping from python3-grpcio: ok (responder dc-a)")

        # A valid certificate of the wrong cluster: refused by the server's identity check.
        creds = grpc.ssl_channel_credentials(rd("ca.pem"), rd("wrong.key"), rd("wrong.pem"))
        with grpc.secure_channel(target, creds) as ch:
            try:
                ch.unary_unary("/nebula.v1.Exchange/Ping")(req, timeout=10)
                raise AssertionError("wrong cluster was served")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        print("wrong cluster refused: ok")

        # Plaintext: refused at the transport.
        with grpc.insecure_channel(target) as ch:
            try:
                ch.unary_unary("/nebula.v1.Exchange/Ping")(req, timeout=5)
                raise AssertionError("plaintext was served")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        print("plaintext refused: ok")
    finally:
        if proc is not None:
            proc.stdin.close()
            try:
                rc = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("server did not stop when its stdin closed")
            assert rc == 0, "server exited with %d" % rc
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
