"""Guardian of a runtime host: cleans up after the host process, however it died.

Run as a plain script (``python guardian.py ROOT TOKEN``), not as a module of the package, so
it starts in milliseconds. It detaches (double fork), prints its pid, and blocks reading its
standard input, a pipe from the host; when
the host exits — normally, by an exception, or by SIGKILL — the kernel closes the pipe, and
the guardian kills every process carrying ``ROLLOUT_RAY_HOST=TOKEN`` in its environment
(every program of every runtime the host ran inherits it, even after ``setsid``), then
removes ROOT, the directory holding those runtimes' work directories.
"""

import os
import shutil
import signal
import sys
import time

HOST_MARKER = "ROLLOUT_RAY_HOST"


def pids_with_marker(key: str, value: str) -> list[int]:
    """Pids (not ours) whose initial environment holds ``key=value``; zombies have none.

    Shared with ``LocalRuntime``; this file imports only the standard library, so it also
    runs as a plain script.
    """
    needle = f"{key}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # vanished, or not ours to read
            continue
    return found


def clean(root: str, token: str, budget: float = 5.0) -> None:
    deadline = time.monotonic() + budget
    while True:
        pids = pids_with_marker(HOST_MARKER, token)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.01)  # killed processes keep their environ until they finish exiting
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    root, token = sys.argv[1], sys.argv[2]
    # Detach: Ray kills a worker's direct children when the worker dies, which would take
    # the guardian down with the host it guards. The grandchild is nobody's direct child.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host's Ctrl-C is not ours to obey
    sys.stdout.write(f"{os.getpid()}\n")
    sys.stdout.flush()
    sys.stdout.close()
    while sys.stdin.buffer.read(65536):
        pass
    clean(root, token)


if __name__ == "__main__":
    main()
