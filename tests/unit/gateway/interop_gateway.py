#!/usr/bin/python3
"""Interop: a foreign gRPC client (Debian's python3-grpcio) submits a job to a real
`nebula gateway` and reads it back over mutual TLS, with protobuf messages encoded by hand from
proto/nebula/v1/gateway.proto and the descriptor signed by the openssl CLI (ECDSA P-256/SHA-256,
DER). Also: a TLS client without a certificate is refused, an unknown job is NOT_FOUND, and
the standard health service answers SERVING (NOT_FOUND for an unknown service).
Exits 77 (skip) when grpc cannot be imported. Usage: interop_gateway.py NEBULA_BINARY"""
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


JOB = {"id": 1, "owner": 2, "name": 3, "state": 4, "reason": 5, "cluster": 8}


def job_str(f, name):
    return f.get(JOB[name], [b""])[0].decode()


SCRIPT = 'case "$1" in quick-*) echo "hello from $1";; esac\n'


def main():
    nb = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="nb_gwpy.")
    gw = None
    try:
        pki = os.path.join(tmp, "pki")
        run = lambda *a: subprocess.run([nb] + list(a), check=True, stdout=subprocess.DEVNULL)
        run("certs", "init", "--dir", pki)
        run("certs", "issue", "--dir", pki, "--cluster", "dc-a", "--san", "127.0.0.1")
        run("certs", "issue", "--dir", pki, "--user", "alice")
        with open(os.path.join(tmp, "job.sh"), "w") as f:
            f.write(SCRIPT)
        with open(os.path.join(tmp, "gw.json"), "w") as f:
            f.write('{"cluster_id": "dc-a", "listen": "127.0.0.1:0",'
                    ' "tls": {"ca": "pki/ca.crt", "cert": "pki/clusters/dc-a.crt",'
                    ' "key": "pki/clusters/dc-a.key"},'
                    ' "command": ["/bin/sh", "%s", "{job}"],'
                    ' "acl": [{"user": "alice", "clusters": ["dc-a"]}], "poll_ms": 20}'
                    % os.path.join(tmp, "job.sh"))
        gw = subprocess.Popen([nb, "gateway", "--config", os.path.join(tmp, "gw.json")],
                              stdout=subprocess.PIPE)
        line = gw.stdout.readline().decode()
        assert "listening" in line, "gateway did not start: %r" % line
        target = "127.0.0.1:%d" % int(line.split()[-1])
        rd = lambda *p: open(os.path.join(pki, *p), "rb").read()

        # Submit: descriptor signed with the openssl CLI
        doc = (b'{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "quick"},'
               b' "spec": {"clusters": [{"id": "dc-a", "data": {"languages": ["en"]}}]}}')
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign",
                              os.path.join(pki, "users", "alice.key")],
                             input=doc, check=True, stdout=subprocess.PIPE).stdout
        req = field(1, doc) + field(2, sig) + field(3, rd("users", "alice.crt"))
        creds = grpc.ssl_channel_credentials(rd("ca.crt"), rd("users", "alice.key"),
                                             rd("users", "alice.crt"))
        with grpc.secure_channel(target, creds) as ch:
            job = parse(ch.unary_unary("/nebula.v1.Gateway/Submit")(req, timeout=10))
            jid = job_str(job, "id")
            assert jid.startswith("quick-"), jid
            assert job_str(job, "owner") == "alice"
            assert job_str(job, "cluster") == "dc-a"
            print("Submit from python3-grpcio: ok (%s)" % jid)
            # Get until it ends
            for _ in range(250):
                job = parse(ch.unary_unary("/nebula.v1.Gateway/Get")(field(1, jid), timeout=10))
                if job_str(job, "state") in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.02)
            assert job_str(job, "state") == "succeeded", job
            assert job_str(job, "name") == "quick"
            print("Get: ok (succeeded)")
            # Watch (server stream) from the start: ends by itself at the final state
            events = [parse(e) for e in
                      ch.unary_stream("/nebula.v1.Gateway/Watch")(field(1, jid), timeout=10)]
            kinds = [e[4][0].decode() for e in events]  # JobEvent.kind = 4
            seqs = [e[2][0] for e in events]            # JobEvent.seq = 2
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
            assert kinds[0] == "state" and "launch" in kinds and "exit" in kinds, kinds
            states = [e[6][0].decode() for e in events if 6 in e]  # JobEvent.state = 6
            assert states[-1] == "succeeded", states
            print("Watch: ok (%d events)" % len(events))
            # List by state
            rep = parse(ch.unary_unary("/nebula.v1.Gateway/List")(field(2, "succeeded"),
                                                                   timeout=10))
            ids = [job_str(parse(j), "id") for j in rep.get(1, [])]
            assert jid in ids, ids
            print("List: ok")
            # Logs (server stream)
            data = b"".join(parse(c).get(2, [b""])[0]
                            for c in ch.unary_stream("/nebula.v1.Gateway/Logs")(field(1, jid),
                                                                                 timeout=10))
            assert data == ("hello from %s\n" % jid).encode(), data
            print("Logs: ok")
            try:
                ch.unary_unary("/nebula.v1.Gateway/Get")(field(1, "nope-1"), timeout=10)
                raise AssertionError("unknown job was served")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND, e
            # the standard health service (grpc.health.v1), messages by hand:
            # HealthCheckRequest{service = 1}, HealthCheckResponse{status = 1}, SERVING = 1
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            for svc in ("", "nebula.v1.Gateway"):
                rep = parse(check(field(1, svc) if svc else b"", timeout=10))
                assert rep.get(1) == [1], (svc, rep)
            try:
                check(field(1, "no.such.Service"), timeout=10)
                raise AssertionError("an unknown service was answered")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND, e
            watch = ch.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=10)
            assert parse(next(watch)).get(1) == [1]
            watch.cancel()
            print("Health Check and Watch: ok")
        # TLS without a client certificate: refused at the handshake
        creds = grpc.ssl_channel_credentials(rd("ca.crt"))
        with grpc.secure_channel(target, creds) as ch:
            try:
                ch.unary_unary("/nebula.v1.Gateway/List")(b"", timeout=5)
                raise AssertionError("a client without certificate was served")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        print("no client certificate refused: ok")
    finally:
        if gw is not None:
            gw.terminate()
            try:
                rc = gw.wait(timeout=15)
            except subprocess.TimeoutExpired:
                gw.kill()
                gw.wait()
                raise AssertionError("gateway did not stop on SIGTERM")
            assert rc == 0, "gateway exited with %d" % rc
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
