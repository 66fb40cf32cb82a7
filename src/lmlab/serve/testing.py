"""`ServerThread`: an ASGI app served by uvicorn in a background thread on loopback, for tests and benches.

    with ServerThread(create_app(scheduler, tokenizer, served_name="tiny")) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")

The listening socket is bound before the thread starts (port 0: the OS picks a free one, so parallel servers never
race for a port), startup waits until ``GET /health`` answers 200, and exit stops uvicorn within a bounded time
(graceful first, then forced), also while a client still holds a stream open.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["ServerThread"]


class ServerThread:
    """Run `app` with uvicorn in a daemon thread (see the module docstring).

    Args:
        app: an ASGI application (`lmlab.serve.app.create_app`).
        host (`str`, defaults to ``"127.0.0.1"``): loopback by default: the server is for this process.
        port (`int`, defaults to 0): 0 picks a free port.
        ready_timeout (`float`, defaults to 30): seconds to wait for ``/health``.
        stop_timeout (`float`, defaults to 10): seconds a stop may take (half graceful, then forced).
        health_path (`str`, defaults to ``"/health"``): the path polled for readiness.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ready_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        health_path: str = "/health",
        log_level: str = "warning",
    ) -> None:
        if ready_timeout <= 0 or stop_timeout <= 0:
            raise ValueError(f"ready_timeout and stop_timeout must be > 0, got {ready_timeout}, {stop_timeout}")
        self.app, self.host, self.port = app, host, int(port)
        self.ready_timeout, self.stop_timeout = float(ready_timeout), float(stop_timeout)
        self.health_path, self.log_level = health_path, log_level
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI client's `base_url` (``http://host:port/v1``)."""
        return f"{self.url}/v1"

    def start(self) -> ServerThread:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level=self.log_level,
            timeout_graceful_shutdown=max(1, int(self.stop_timeout / 2)),
        )
        self.server = uvicorn.Server(config)

        def run() -> None:
            try:
                self.server.run(sockets=[sock])
            except BaseException as e:  # noqa: BLE001 - reported by start()/stop() in the caller's thread
                self._error = e
            finally:
                sock.close()

        # uvicorn installs no signal handlers outside the main thread, so it stops only through should_exit
        self.thread = threading.Thread(target=run, name=f"uvicorn-{self.port}", daemon=True)
        self.thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        def failure() -> str | None:
            if not self.thread.is_alive():
                return f"the server thread exited before {self.url + self.health_path} answered: {self._error!r}"
            return None

        wait_ready(self.url + self.health_path, self.ready_timeout, failure=failure,
                   listening=lambda: bool(self.server.started), poll_s=0.05)  # fmt: skip

    def stop(self) -> None:
        """Stop uvicorn: graceful for half of `stop_timeout`, then forced; raises if the thread still runs."""
        if self.thread is None:
            return
        self.server.should_exit = True
        self.thread.join(self.stop_timeout / 2)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(self.stop_timeout / 2)
        if self.thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop within {self.stop_timeout:g} s")
        self.thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_ready(
    url: str,
    timeout: float,
    *,
    failure: Callable[[], str | None] = lambda: None,
    listening: Callable[[], bool] = lambda: True,
    poll_s: float = 0.25,
) -> None:
    """Poll GET `url` until it answers 200 (the server has loaded its model).

    Raises RuntimeError with `failure()`'s text as soon as it returns one (the server died), TimeoutError after
    `timeout` seconds; `listening()` False skips a poll (the socket is not yet served).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        why = failure()
        if why is not None:
            raise RuntimeError(why)
        if listening():
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
        time.sleep(poll_s)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")
