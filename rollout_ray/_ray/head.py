"""Starting or joining Ray for a driver: by default a private local Ray, on loopback only and
lean (what a local eval does not use is not started, and the driver does not sleep through
Ray's once-a-second polls while the node registers)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray
import ray._private.ray_constants as ray_constants

from .._errors import RayUnreachable

LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's own switch for single-machine platforms: "0" keeps every service on 127.0.0.1."""


def init_ray(address: str | None, **options: Any) -> None:
    """Connect to ``address`` (or ``RAY_ADDRESS``); without one, start a private local Ray.

    Private: ``address="local"`` never joins a cluster that happens to run on the machine
    (``ray.init()`` would join whatever ``/tmp/ray/ray_current_cluster`` names, another
    user's included). On loopback: the local default's services listen on 127.0.0.1 only;
    to let other machines in, start a cluster with ``ray start`` (see ``cluster/``) and pass
    its address. Lean: see ``lean_head``. ``options`` go to ``ray.init`` (e.g. ``num_cpus``).

    Raises:
        RayUnreachable: nothing listens at ``address`` (``check_reachable``).
    """
    address = address or os.environ.get("RAY_ADDRESS")
    options = {"include_dashboard": False, "log_to_driver": False, **options}
    if address:
        check_reachable(address)
        ray.init(address=address, **options)
        return
    # ray.init turns a loopback node address into the machine's reachable one; Ray keeps
    # everything on loopback only where it runs without clusters, a switch read here (this
    # process) and, through the environment, by every process Ray starts.
    os.environ[LOOPBACK_ONLY] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    logging.getLogger(_RAY_AUTH_LOGGER).addFilter(_quiet_default_token_auth)
    with lean_head():
        ray.init(address="local", **options)


REACH_TIMEOUT = 5.0
"""Seconds to wait for a cluster's port to accept a connection: a dropped first SYN is resent
after 1 s, then 3 s; a cluster that takes longer to accept one is not usable anyway."""


def check_reachable(address: str, timeout: float = REACH_TIMEOUT) -> None:
    """Raise ``RayUnreachable`` unless something accepts a TCP connection at ``address``
    (``host:port`` or ``ray://host:port``; ``auto`` and ``local`` are Ray's to resolve) and
    answers a gRPC hello as Ray's services do (``check_grpc``).

    ``ray.init`` on a dead address retries for ~40 s, printing C++ warnings about the
    machine's own address where the user typed 127.0.0.1; on a port where something else
    listens it waited forever (an HTTP server) or failed after ~20 s with a long traceback.
    This says it in one line, within ``timeout`` seconds.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        conn = _connect(host.strip("[]"), int(port), time.monotonic() + timeout)
    except TimeoutError:
        raise RayUnreachable(address, f"no answer within {timeout:g}s") from None
    except OSError as e:
        raise RayUnreachable(address, e.strerror or type(e).__name__) from None
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):  # TLS: no plaintext hello
            check_grpc(conn, address, timeout)


H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first. Ray's
GCS and its client server (``ray://``) are gRPC servers, which answer with a SETTINGS frame."""


def check_grpc(conn: socket.socket, address: str, timeout: float) -> None:
    """Raise ``RayUnreachable`` unless the server on ``conn`` answers ``H2_HELLO`` with an
    HTTP/2 SETTINGS frame within ``timeout`` seconds; the error names what answered instead."""
    try:
        conn.sendall(H2_HELLO)
        _ready(conn, time.monotonic() + timeout, write=False)
        answer = conn.recv(1024)
    except TimeoutError:
        raise RayUnreachable(
            address,
            f"something accepts connections there but did not answer a gRPC hello "
            f"within {timeout:g}s: not a Ray cluster",
        ) from None
    except OSError as e:
        raise RayUnreachable(
            address, f"the connection was reset at a gRPC hello ({e.strerror or type(e).__name__}): not a Ray cluster"
        ) from None
    if len(answer) >= 9 and answer[3] == 4:  # a frame header whose type is SETTINGS
        return
    if not answer:
        raise RayUnreachable(
            address, "something accepts connections there but closed at a gRPC hello: not a Ray cluster"
        )
    raise RayUnreachable(address, f"{_what_answered(answer)}: not a Ray cluster")


SLICE = 0.1
"""Seconds a wait blocks at a time. SIGINT may be delivered to any thread (Ray's import starts
some); a thread blocked in one long recv is not woken by it, so Ctrl-C waited out the whole
5 s bound under load. Between slices the interpreter runs the pending handler: Ctrl-C ends the
wait within one slice."""


def _ready(conn: socket.socket, deadline: float, *, write: bool) -> None:
    """Wait, a slice at a time, until ``conn`` can be read (written); TimeoutError at ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        readable, writable, _ = select.select([] if write else [conn], [conn] if write else [], [], min(left, SLICE))
        if readable or writable:
            return


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """A blocking TCP connection to ``host:port`` made within ``deadline``, waited for in slices."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    conn = socket.socket(family, kind, proto)
    try:
        conn.setblocking(False)
        failed = conn.connect_ex(where)
        if failed == errno.EINPROGRESS:
            _ready(conn, deadline, write=True)
            failed = conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failed:
            raise OSError(failed, os.strerror(failed))
        conn.setblocking(True)
        return conn
    except BaseException:
        conn.close()
        raise


def _what_answered(answer: bytes) -> str:
    """The server an answer came from, as far as its first bytes say."""
    text = answer.decode("latin-1")
    if text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        # Python's http.server answers a version it does not speak as HTTP/0.9 did: a bare page.
        title = re.search(r"<title>([^<]{1,60})", text, re.IGNORECASE)
        return f"an HTTP server answered an HTML page{f' ({title.group(1).strip()!r})' if title else ''}"
    if not text.startswith("HTTP/"):
        return f"something answered that is not gRPC ({answer[:32]!r})"
    lines = text.split("\r\n")
    server = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("server:")), "")
    return f"an HTTP server{f' ({server[:60]})' if server else ''} answered {lines[0][:60]!r}"


LEAN_SKIPS = ("start_monitor", "start_log_monitor", "start_api_server")
"""What a private local Ray does not start: the autoscaler's monitor (one machine, fixed
resources), the log monitor (it only streams worker logs to a driver, and ``log_to_driver``
is off) and the dashboard's API server (job submission and the state API, which nothing here
uses; with ``include_dashboard=False`` Ray still starts it). Each is a Python process that
imports Ray: together ~3 CPU-s, and ``ray.init`` waits for the API server, so on 2 cores
``ray.init`` takes ~1.5 s less (benchmarks/README.md, cold start). A full Ray (``ray start``)
passed as ``address`` is joined as it is."""

REGISTRATION_POLL = 0.05
"""Seconds between the driver's looks for its new node in the GCS while ``ray.init`` waits.
Ray's own wait (``services.get_node``) looks once a second, and the raylet registers ~0.9-1.2 s
after it starts (it waits for its agents), so half of all starts slept ~0.9 s past it."""


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """While ``ray.init`` starts the head node, its ``LEAN_SKIPS`` start nothing and the wait
    for the node's registration polls every ``REGISTRATION_POLL`` seconds.

    Ray has no public switch for either (``RayParams.no_monitor`` exists but ``ray.init`` does
    not pass it), so the ``Node`` methods and the ``services`` function are stood in for, for
    the duration of the call only. A Ray without one of them is started as it is."""
    from ray._private import services
    from ray._private.node import Node

    saved = {name: Node.__dict__[name] for name in LEAN_SKIPS if name in Node.__dict__}
    get_node = getattr(services, "get_node", None)
    if len(saved) != len(LEAN_SKIPS) or get_node is None:
        yield
        return
    for name in LEAN_SKIPS:
        setattr(Node, name, _start_nothing)
    services.get_node = _after_registration(get_node)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)
        services.get_node = get_node


def _start_nothing(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


def _after_registration(get_node: Callable[[str, str], Any], timeout: float = 30.0) -> Callable[[str, str], Any]:
    """``get_node``, called once the GCS lists the node (or on any doubt: Ray's own wait,
    with its own timeout and errors, then decides)."""

    def get_registered_node(gcs_address: str, node_id: str) -> Any:
        with contextlib.suppress(Exception):  # ours is only a faster wait: Ray's call decides
            from ray._raylet import GcsClient  # type: ignore[attr-defined]  # private: absent from the stubs

            client = GcsClient(address=gcs_address)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if any(known.hex() == node_id for known in client.get_all_node_info(timeout=timeout)):
                    break
                time.sleep(REGISTRATION_POLL)
        return get_node(gcs_address, node_id)

    return get_registered_node


_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _quiet_default_token_auth(record: logging.LogRecord) -> bool:
    """Drop Ray's WARNING that a new local Ray has token authentication on: it is the private
    local default's normal state (on, and on loopback), not news on every run."""
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")
