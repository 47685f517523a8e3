"""Starting the app on a free localhost port for tests that talk to it over HTTP, and the headless browser that
the browser suites drive (Debian's chromium; never `playwright install`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patient_url_ok(url: str, wait_s: float = 180.0) -> bool:
    """Gradio's start-up check that its own page answers, given the patience a busy 2-core machine needs: Gradio's
    asks with a 3 s timeout and, on one timeout, refuses to start ("When localhost is not accessible, a shareable
    link must be created"), which two test workers and a decoding server can outlast."""
    import time

    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.head(url, timeout=30).status_code in (200, 301, 302, 303, 307, 308, 401):
                return True
        except (httpx.ConnectError, httpx.TimeoutException):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


@contextmanager
def serving(demo, **launch) -> Iterator[str]:
    """Launch `demo` without blocking; yields its URL and closes it afterwards."""
    from gradio import networking

    networking.url_ok = patient_url_ok
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@contextmanager
def embedded_page() -> Iterator[str]:
    """The page served by the embedded SmolLM2 target and the default head, with rooms whose instructor's page beats
    each second and is away after five unheard (the defaults' 10 and 25, as fast): a class test sees an instructor's
    closed page said to its followers in seconds, not in a minute. Yields its URL."""
    from eagleviz.app.rooms import Rooms
    from eagleviz.app.ui import PAGE, build_app
    from eagleviz.decoding.load import load_engine

    rooms = Rooms(here_every_s=1.0, away_after_s=5.0, alive_s=1.0)
    with serving(build_app(load_engine(), model_id="HuggingFaceTB/SmolLM2-135M-Instruct", rooms=rooms),
                 **PAGE) as url:
        yield url


def client(url: str):
    """A gradio_client for `url` whose set-up waits as long as the server takes: its config and API reads use
    httpx's default 5 s timeout, which a burst of clients on a busy 2-core machine outlasts ("timed out" is then
    the client giving up, not the server refusing)."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": 300})
