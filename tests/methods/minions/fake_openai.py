"""An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 for tests (no network needed)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def completion(content: str, *, prompt_tokens: int = 11, completion_tokens: int = 7,
               finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class FakeOpenAI:
    """An OpenAI-like /chat/completions on 127.0.0.1: scripted replies first, then ``respond``."""

    def __init__(self, reply: Callable[[list[dict[str, str]]], str] | None = None) -> None:
        self.reply = reply
        self.script: list[tuple[int, Any, dict[str, str], float]] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with fake.lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    item = fake.script.pop(0) if fake.script else None
                status, payload, headers, delay = item or fake.respond(body, dict(self.headers))
                if delay:
                    time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        # A short poll interval keeps shutdown() fast.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def respond(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any, dict[str, str], float]:
        """``reply(messages)`` if given (usage counted with ``count_tokens``); else echo the last
        message, where a message "sleep 0.05 ..." delays the answer."""
        if self.reply is not None:
            from lmforge.methods.minions.clients import count_tokens

            text = self.reply(body["messages"])
            sent = sum(count_tokens(m["content"]) for m in body["messages"])
            return 200, completion(text, prompt_tokens=sent, completion_tokens=count_tokens(text)), {}, 0.0
        last = body["messages"][-1]["content"]
        delay = float(last.split()[1]) if last.startswith("sleep ") else 0.0
        return 200, completion(f"echo: {last}", prompt_tokens=len(last), completion_tokens=2), {}, delay

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
