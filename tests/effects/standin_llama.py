"""A stand-in for llama-server: its argv, /health, and chat completions that take a while.

Run as `python standin_llama.py <llama-server argv...>`. Its settings are environment variables
named as llama-server's own (`LLAMA_...`): mm-batch passes a server no others. It writes its
argv (JSON) to $LLAMA_STANDIN_DIR/argv-<port>.json and `<port> <time>` to
$LLAMA_STANDIN_DIR/listening.log once it listens, answers every completion after
$LLAMA_STANDIN_LATENCY_S seconds with a short text (the texts of the JSON list
$LLAMA_STANDIN_TEXTS first, in order, then "done"), and appends
`<port> <start> <end> <max_tokens>` for each to $LLAMA_STANDIN_DIR/calls.log: the intervals in
which it "computed"; /slots says slot 0 computes while a completion is in flight (and its save
waits until it is done).
A completion of no tokens (`max_tokens` or `n_predict` 0: mm-batch's first request of a
server, which computes the prompt only) is noted in $LLAMA_STANDIN_DIR/prefills.log as
`<port> <slot>` instead, answered at once, and uses up no text.
Besides the chat endpoint (`/v1/chat/completions`) it answers the native ones: `/apply-template`
renders `TEMPLATE(<messages and tools as JSON>)` as the prompt, and `/completion` answers as the
chat endpoint does, in the native shape; each request's path and body is appended as a JSON line
to $LLAMA_STANDIN_DIR/requests.jsonl; a completion's `stop` strings cut its text as
llama-server cuts it.
Slots are saved (`/slots/N?action=save`) as a JSON file of
the port and the completions answered so far, and restored from such a file only (anything
else is refused, as llama-server refuses a state it cannot load, and all of it without
--slot-save-path); each restore appends
`<port> <slot> <file's text>` to $LLAMA_STANDIN_DIR/restored.log.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ARGV = sys.argv[1:]
PORT = int(ARGV[ARGV.index("--port") + 1])
DIR = Path(os.environ["LLAMA_STANDIN_DIR"])
LATENCY_S = float(os.environ.get("LLAMA_STANDIN_LATENCY_S", "0"))
PARALLEL = int(ARGV[ARGV.index("--parallel") + 1])
TEXTS = json.loads(os.environ.get("LLAMA_STANDIN_TEXTS", "[]"))
SLOTS = Path(ARGV[ARGV.index("--slot-save-path") + 1]) if "--slot-save-path" in ARGV else None


def _native(text: str, stops: list[str]) -> dict[str, Any]:
    """A native completion of `text`, cut where it first writes one of `stops` as
    llama-server cuts it: the stop string left out, and named."""
    reply: dict[str, Any] = {"stop_type": "eos", "tokens_evaluated": 10, "tokens_predicted": 1}
    found = [(text.find(stop), stop) for stop in stops if stop in text]
    if not found:
        return {**reply, "content": text, "stopping_word": ""}
    at, stop = min(found)
    return {**reply, "content": text[:at], "stop_type": "word", "stopping_word": stop}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answered = 0  # completions so far: the tokens a saved slot "holds", with the prefills
    prefilled = 0
    computing = 0  # completions in flight: slot 0 is busy while there is one

    def do_GET(self) -> None:
        if self.path == "/slots":
            busy = Handler.computing > 0
            self._send([{"id": i, "is_processing": busy and i == 0} for i in range(PARALLEL)])
            return
        self._send({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path.startswith("/slots/"):
            self._slot_file(int(self.path.split("/")[2].split("?")[0]), body["filename"])
            return
        with (DIR / "requests.jsonl").open("a") as log:
            log.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if self.path == "/apply-template":
            self._send({"prompt": f"TEMPLATE({json.dumps(body, sort_keys=True)})"})
            return
        if body.get("max_tokens", body.get("n_predict")) == 0:
            self._prefill(body)
            return
        started = time.time()
        Handler.computing += 1
        time.sleep(LATENCY_S)
        Handler.computing -= 1
        with (DIR / "calls.log").open("a") as log:
            asked = body.get("max_tokens", body.get("n_predict"))
            log.write(f"{PORT} {started} {time.time()} {asked}\n")
        text = TEXTS[Handler.answered] if Handler.answered < len(TEXTS) else "done"
        Handler.answered += 1
        if self.path == "/completion":
            self._send(_native(text, body.get("stop") or []))
            return
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        self._send(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [choice],
                "usage": usage,
            }
        )

    def _prefill(self, body: dict[str, Any]) -> None:
        """A completion of no tokens (the prompt computed into the cache): noted in
        prefills.log as `<port> <slot>`, answered at once with nothing, no text used up."""
        with (DIR / "prefills.log").open("a") as log:
            log.write(f"{PORT} {body.get('id_slot', -1)}\n")
        Handler.prefilled += 1
        if self.path == "/completion":
            self._send(_native("", []))
            return
        choice = {"index": 0, "message": {"role": "assistant", "content": ""}}
        self._send(
            {"object": "chat.completion", "choices": [{**choice, "finish_reason": "length"}]}
        )

    def _slot_file(self, slot: int, filename: str) -> None:
        if SLOTS is None:
            self._send({"error": {"code": 501, "message": "slot save is not enabled"}}, 501)
            return
        if self.path.endswith("action=save"):
            while slot == 0 and Handler.computing:  # as llama-server: a busy slot's turn first
                time.sleep(0.05)
            (SLOTS / filename).write_text(json.dumps({"port": PORT, "answered": Handler.answered}))
            self._send({"id_slot": slot, "n_saved": Handler.answered + Handler.prefilled})
            return
        try:
            text = (SLOTS / filename).read_text()
            json.loads(text)
        except (OSError, ValueError):
            self._send({"error": {"code": 400, "message": "invalid slot save file"}}, 400)
            return
        with (DIR / "restored.log").open("a") as log:
            log.write(f"{PORT} {slot} {text}\n")
        self._send({"id_slot": slot, "n_restored": 1})

    def _send(self, payload: object, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        return


(DIR / f"argv-{PORT}.json").write_text(json.dumps(ARGV))
server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
with (DIR / "listening.log").open("a") as log:  # bound: from now on it answers
    log.write(f"{PORT} {time.time()}\n")
server.daemon_threads = True
server.serve_forever()
