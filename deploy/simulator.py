"""The vLLM simulator as a compose service: the simulator behind a TCP relay.

The simulator is a test fixture and listens on loopback only. In the ``sim`` profile it must
answer on the compose network as ``vllm:8000``, like the real server it stands in for, so
this script starts it on 127.0.0.1 and relays one port to it. It exits when the simulator
exits (a dead process, which Docker's restart policy handles, as for vLLM).

    python /opt/hangwatch/simulator.py --listen 0.0.0.0:8000 -- --scenario idle
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys

BACKEND = ("127.0.0.1", 8001)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def relay(client_reader, client_writer) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*BACKEND)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))
    except asyncio.CancelledError:  # shutting down with a connection open
        client_writer.close()
        server_writer.close()


async def serve(host: str, port: int, simulator: subprocess.Popen) -> int:
    server = await asyncio.start_server(relay, host, port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        while not stop.is_set() and simulator.poll() is None:
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
    if simulator.poll() is None:
        simulator.terminate()
    return simulator.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="0.0.0.0:8000", help="HOST:PORT on the compose network")
    parser.add_argument("simulator_args", nargs="*", help="passed to python -m hangwatch.simulator (after --)")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    simulator = subprocess.Popen([sys.executable, "-m", "hangwatch.simulator", "--listen", f"{BACKEND[0]}:{BACKEND[1]}",
                                  *args.simulator_args])
    return asyncio.run(serve(host, int(port), simulator))


if __name__ == "__main__":
    sys.exit(main())
