"""A loopback TCP proxy whose link can be cut, for the fault tests without root.

usage: cutproxy.py LISTEN_PORT=TARGET_PORT [...] --pidfile F
Forwards 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT for each pair. SIGUSR1 cuts the link:
every connection through the proxy is closed and new ones are closed as soon as they arrive
(the endpoints see resets and refused calls, like an interface going down). SIGUSR2 restores
it. SIGTERM stops the proxy.
"""
import asyncio
import os
import signal
import sys

cut = False
conns = set()


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def make_handler(target):
    async def handle(reader, writer):
        if cut:
            writer.close()
            return
        try:
            treader, twriter = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        tasks = (asyncio.ensure_future(pipe(reader, twriter)),
                 asyncio.ensure_future(pipe(treader, writer)))
        entry = (writer, twriter, tasks)
        conns.add(entry)
        await asyncio.gather(*tasks, return_exceptions=True)
        conns.discard(entry)

    return handle


def set_cut(on):
    global cut
    cut = on
    if on:
        for writer, twriter, tasks in list(conns):
            for t in tasks:
                t.cancel()
            writer.close()
            twriter.close()


async def main():
    pairs = [a for a in sys.argv[1:] if "=" in a]
    pidfile = sys.argv[sys.argv.index("--pidfile") + 1]
    servers = []
    for p in pairs:
        lp, tp = (int(x) for x in p.split("="))
        servers.append(await asyncio.start_server(make_handler(tp), "127.0.0.1", lp))
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGUSR1, set_cut, True)
    loop.add_signal_handler(signal.SIGUSR2, set_cut, False)
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    await stop
    set_cut(True)
    for s in servers:
        s.close()


asyncio.run(main())
