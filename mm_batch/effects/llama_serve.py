"""llama.cpp's server from the `xllamacpp` wheel, started with llama-server's own command line.

The `local` extra installs llama.cpp prebuilt: `xllamacpp` (published by Xorbits, built by its
CI with AVX2 and without AVX-512) compiles llama.cpp's C++ server into a Python extension that
listens on HTTP like `llama-server` does, with the same endpoints. mm-batch starts it as it
starts a `llama-server` binary (`effects.llama`): this file is run by path, `python -I
llama_serve.py -m MODEL --port N ...`, in a process of its own, and imports nothing of
mm-batch. It takes the flags `LlamaServer.argv` passes and refuses any other (exit 2, as
argparse does); SIGTERM or SIGINT stops it."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llama_serve.py", allow_abbrev=False)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jinja", action="store_true")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--poll", type=int, default=50)
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--slot-save-path", default="")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        import xllamacpp
    except ImportError as exc:  # most often the OpenMP runtime, which slim images leave out
        hint = " (install libgomp1: apt-get install libgomp1)" if "libgomp" in str(exc) else ""
        print(f"llama_serve: xllamacpp does not load: {exc}{hint}", file=sys.stderr, flush=True)
        return 1

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.use_jinja = args.jinja
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = args.threads
        cpu.poll = args.poll
    params.offline = args.offline
    if args.slot_save_path:
        # llama-server's flag adds the separator its code joins file names with.
        params.slot_save_path = os.path.join(args.slot_save_path, "")
    params.endpoint_slots = True

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:  # a model it cannot load: say why, as llama-server does
        print(f"llama_serve: the server did not start: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"llama_serve: listening on {server.listening_address}", file=sys.stderr, flush=True)
    stop.wait()
    # The server's threads are the process's: leave without unwinding them (no request is
    # answered after the signal; mm-batch stops a server only once its runs are done).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
