"""Start the test suite's ``nas-run`` processes without paying for their imports each time.

Every ``nas-run`` process spends about 5 of its 9 seconds (a ``debug=fast`` run, this 2-core
machine) importing torch, Lightning (which imports torchmetrics, transformers, scipy.signal),
Hydra, W&B and matplotlib. The end-to-end tests start some 250 of them. This module keeps one
server process per test worker that has imported those libraries once and forks a child for
each ``nas-run`` command: the child takes the command's argv, working directory, environment
and standard streams, and runs the console script's own ``main()`` in a fresh process (its own
pid, process group, exit status, atexit handlers); nothing of nas-run itself is imported
before the fork.

What differs from a ``subprocess.run`` of the installed script: the libraries above were
imported under the test worker's environment (the tests change only variables those imports
do not read), the child is its own process group leader, and it ends without the interpreter's
teardown of every module (:func:`_exit_as_python_does`: 2.2 s a command, over half of it copying
the server's memory pages; exit status, atexit functions and flushed streams as Python's own exit).
A test that watches or signals a command starts it with :func:`popen` (helpers.start_command):
the server runs its children side by side. Tests that need the installed script itself (a signal
ignored from the start, the packaging checks) start it with ``subprocess`` (NAS_RUN); so do all
tests with ``NAS_TEST_ZYGOTE=0`` in the environment.

Run as a script, this file is the server: ``python zygote.py <socket path>``.
"""
from __future__ import annotations

import gc
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

#: what the server imports once: the heavy third-party libraries every nas-run process needs.
#: W&B too (with the launch module its ``init`` imports: about 2.5 s a run); its import-time state
#: that a process must own (two temporary folders, a random generator) is made anew in each child
#: (:func:`_fresh_wandb_state`). pandas (with pyarrow): W&B imports it at a run's first logged
#: value when it is installed, as it is with the [test] extra (about 0.45 s a run).
PRELOAD = ("torch", "numpy", "pytorch_lightning", "lightning_fabric", "torchmetrics", "hydra",
           "hydra._internal.utils", "hydra._internal.config_loader_impl", "omegaconf", "rich.console",
           "rich.table", "matplotlib", "matplotlib.pyplot", "scipy.stats", "sacrebleu", "tokenizers", "yaml",
           "wandb", "wandb.sdk.launch.inputs.internal", "wandb.sdk.data_types._private",
           "wandb.sdk.artifacts.artifact", "pandas")

_HEADER = struct.Struct("!I")


#: the console scripts the server runs (pyproject.toml's [project.scripts]), from this environment's bin folder
COMMANDS = ("nas-run", "nas-eval", "nas-report", "nas-bench", "nas-repro")


def serves(argv0: str, argv1: str | None = None) -> bool:
    """Whether the server runs this command (and is enabled): one of this environment's nas-*
    console scripts, or this Python with ``-c <code>`` (tests/faults.py)."""
    if os.environ.get("NAS_TEST_ZYGOTE", "1") == "0" or not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        return False
    if argv0 == sys.executable:
        return argv1 == "-c"
    path = os.path.abspath(argv0)
    return (os.path.basename(path) in COMMANDS and os.path.dirname(path) == os.path.dirname(sys.executable)
            and os.path.isfile(path))


def terminal_signals() -> None:
    """SIGINT and SIGHUP at their defaults, as in a command started from a terminal, whatever this
    suite was started with: in the background of a script (``pytest &``: SIGINT ignored) or under
    nohup (SIGHUP ignored), every process it starts would inherit them ignored and keep them ignored,
    as nas-run rightly does then (tests/cli/test_scale.py), and the tests that press Ctrl-C or hang up
    would see a run that never stops. For a forked command, and before the exec of a plain one
    (``preexec_fn``). A test of an ignored signal sets it in its own ``preexec_fn``."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


# ----------------------------------------------------------------------------------- client
class _Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nas-zygote-")
        self.path = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test zygote did not start: {open(self.log.name).read()[-2000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_server: _Server | None = None
_lock = threading.Lock()
#: the process id (and process group) of the last command started
last_pid: int | None = None


def _get_server() -> _Server:
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = _Server()
        return _server


def shutdown():
    global _server
    if _server is not None:
        _server.close()
        _server = None


def _recv_line(reader) -> bytes:
    line = reader.readline()
    if not line.endswith(b"\n"):
        raise EOFError("the test zygote closed the connection")
    return line


def run(argv: list[str], *, cwd, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``,
    run by a child forked from the server; ``argv[0]`` is an installed console script (serves()).
    On a timeout the command's process group is killed."""
    cmd = Command(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = cmd.communicate(timeout)
    except subprocess.TimeoutExpired as late:
        try:
            os.killpg(cmd.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        cmd.wait()
        raise subprocess.TimeoutExpired(cmd.args, timeout, late.output, late.stderr) from None
    return subprocess.CompletedProcess(cmd.args, cmd.returncode, out, err)


class Command:
    """A command started by the server, with what the tests use of ``subprocess.Popen``: ``pid``
    (also its process group), ``stdout``/``stderr`` (text, when asked for), ``poll``, ``wait``,
    ``communicate``, ``send_signal``, ``kill`` and ``returncode`` (negative: ended by that signal)."""

    def __init__(self, argv: list[str], *, cwd, env: dict, stdout=None, stderr=None):
        self.args = [str(a) for a in argv]
        self.returncode: int | None = None
        server = _get_server()
        ends, keep = [], []
        for want in (stdout, stderr):
            if want == subprocess.PIPE:
                r, w = os.pipe()
                ends.append(w)
                keep.append(r)
            else:  # None or DEVNULL: this test's own stream is not the command's business
                ends.append(os.open(os.devnull, os.O_WRONLY))
                keep.append(None)
        null = os.open(os.devnull, os.O_RDONLY)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(server.path)
            payload = json.dumps({"argv": self.args, "cwd": os.path.abspath(str(cwd)), "env": dict(env)}).encode()
            socket.send_fds(self._sock, [_HEADER.pack(len(payload)) + payload], [null, *ends])
        finally:
            for fd in (null, *ends):
                os.close(fd)
        self.stdout, self.stderr = (None if r is None else open(r, encoding="utf-8", errors="replace") for r in keep)
        self._reader = self._sock.makefile("rb")
        global last_pid
        self.pid = last_pid = int(_recv_line(self._reader))

    def poll(self) -> int | None:
        if self.returncode is None:
            if select.select([self._sock], [], [], 0)[0]:
                self.returncode = int(_recv_line(self._reader))
                self._reader.close()
                self._sock.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not select.select([self._sock], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.poll()

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [f for f in (self.stdout, self.stderr) if f is not None and not f.closed]
        chunks = {f: [] for f in streams}
        sel = selectors.DefaultSelector()
        for f in streams:
            sel.register(f.fileno(), selectors.EVENT_READ, f)

        def text(f):
            return b"".join(chunks[f]).decode(errors="replace") if f in chunks else None

        try:
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout, text(self.stdout), text(self.stderr))
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.data].append(data)
                    else:
                        sel.unregister(key.fd)
        finally:
            sel.close()
        for f in streams:
            f.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return text(self.stdout), text(self.stderr)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(argv: list[str], *, cwd, env: dict, stdout=None, stderr=None) -> Command:
    """``subprocess.Popen(argv, cwd=cwd, env=env, stdout=..., stderr=..., text=True,
    start_new_session=True)`` run by a child forked from the server (``serves(argv[0])``)."""
    return Command(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)


# ----------------------------------------------------------------------------------- server
class _Child(BaseException):
    """Raised in a freshly forked child to leave the server's loop before running the command."""

    def __init__(self, request):
        self.request = request


def _recv_request(conn):
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if not msg:
        return None, fds
    (size,) = _HEADER.unpack(msg[:4])
    data = msg[4:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise EOFError
        data += more
    return json.loads(data), fds


def _serve(path: str) -> None:
    """Fork a child for each request and send its pid, then its exit status when it ends; children
    run side by side (a test may start one command and run another while it trains)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(8)
    os.rename(path + ".tmp", path)  # the client waits for this name: the server is ready
    parent = os.getppid()
    listener.settimeout(0.02)  # also how often ended children are reaped
    running: dict[int, socket.socket] = {}  # pid -> the connection its status goes to
    while True:
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the test worker is gone (even killed): so is its server
                return
            continue
        conn.setblocking(True)
        request, fds = _recv_request(conn)
        if request is None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in running.values():  # the other commands' connections are not this one's
                other.close()
            conn.close()  # the child's copy: the server keeps its own
            request["fds"] = fds
            raise _Child(request)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        running[pid] = conn


def _wandb_temporary_folders() -> list:
    """W&B's import-time temporary folders (TemporaryDirectory objects) and their suffixes."""
    private, artifact = sys.modules.get("wandb.sdk.data_types._private"), sys.modules.get("wandb.sdk.artifacts.artifact")
    found = ((getattr(private, "MEDIA_TMP", None), "wandb-media"),
             (getattr(getattr(artifact, "Artifact", None), "_TMP_DIR", None), "wandb-artifacts"))
    return [(tmp, suffix) for tmp, suffix in found if tmp is not None]


def _fresh_wandb_state() -> None:
    """In a forked child: what W&B made at import and a process must own. Its two temporary folders
    (media and artifact staging; other modules hold the same objects) are deleted at exit by the
    process that made them: the child drops its inherited copies' clean-up (the server's folders
    stay) and points them at folders of its own, deleted at its exit, as a fresh process would;
    its id generator draws fresh entropy."""
    import tempfile

    for tmp, suffix in _wandb_temporary_folders():
        tmp._finalizer.detach()
        tmp._own = tempfile.TemporaryDirectory(suffix)  # kept alive; cleaned up at this process's exit
        tmp.name = tmp._own.name
    runid = sys.modules.get("wandb.sdk.lib.runid")
    if runid is not None:
        runid._random.seed()


def _run_child(request) -> None:
    """In the forked child: become the command's process and run the installed console script."""
    import importlib
    import random
    import runpy

    import numpy

    os.setpgid(0, 0)
    terminal_signals()
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:  # as Python's start installs it where not ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in zip((0, 1, 2), request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    argv = request["argv"]
    code = argv[2] if argv[1:2] == ["-c"] else None  # python -c <code> <args>, else a console script
    # sys.path as Python builds it: the script's folder ('' for -c), then $PYTHONPATH, then the rest
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = sys.path[1 + len(before):] if sys.path[1:1 + len(before)] == before else sys.path[1:]
    sys.path[:] = ["" if code is not None else os.path.dirname(argv[0]),
                   *[p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p], *rest]
    importlib.invalidate_caches()
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh process draws fresh entropy (W&B run ids, temporary names)
    numpy.random.seed()
    _fresh_wandb_state()  # after the environment: TemporaryDirectory reads TMPDIR
    if code is not None:
        sys.argv = ["-c", *argv[3:]]
        main = sys.modules["__main__"]
        for name in [n for n in vars(main) if not n.startswith("__")]:  # the server's own names
            delattr(main, name)
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__cached__", None)
        exec(compile(code, "<string>", "exec"), vars(main))
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")  # the script ends with sys.exit(main())


def _warm_matplotlib() -> None:
    """Draw one throw-away figure with text, an image and a colour bar: matplotlib's first figure
    in a process loads its fonts and text layout (about 0.5 s), which every run's diagnostics
    figures would otherwise pay again in each forked command. Nothing is written."""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(2, 2))
        ax.set_title("warm-up", fontsize=8)
        fig.colorbar(ax.imshow([[0.0, 1.0]]), ax=ax, label="x")
        fig.tight_layout()
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
    except Exception:  # noqa: BLE001 - a warm-up only: the commands draw as they would anyway
        pass


def _main() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    _warm_matplotlib()
    for tmp, _ in _wandb_temporary_folders():  # the server writes no media: its folders go now, not at a kill
        tmp.cleanup()
    if threading.active_count() != 1:  # forking a process with threads is unsafe: serve nothing
        raise SystemExit(f"the test zygote has {threading.active_count()} threads after its imports")
    # the imported objects into the collector's permanent generation: a child's collections then
    # skip them instead of touching (and so copying) every page of the server's heap (about 0.4 s
    # a full collection here)
    gc.freeze()
    request = None
    try:
        _serve(sys.argv[1])
    except _Child as child:  # in a forked child (outside the handler: its traceback has no _Child)
        request = child.request
    if request is not None:
        _exit_as_python_does(_run_child, request)


def _exit_as_python_does(command, *args) -> None:
    """Run ``command`` in the forked child and end the process as the interpreter's own exit would:
    an uncaught exception printed by ``sys.excepthook`` (exit status 1), ``SystemExit``'s status or
    message, the non-daemon threads joined, the ``atexit`` functions run (W&B's, the temporary
    folders' clean-up), the standard streams flushed, and an uncaught KeyboardInterrupt ended by
    SIGINT. Only the interpreter's teardown of every module and object is left out: in a child
    forked from a server with torch, Lightning and W&B imported it takes about 2.2 s (1 s in a plain
    process), the rest copying the server's memory pages that the teardown's reference counting
    writes to. The one thing it would still do for a command, flush a file the command left open,
    would hide a bug of the command's: a test sees the lost bytes instead."""
    import atexit  # local names: a ``python -c`` command clears this module's (the server's __main__)
    import os
    import signal
    import sys
    import threading

    status, interrupted = 0, False
    try:
        command(*args)
    except SystemExit as stop:
        code = stop.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException as err:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(type(err), err, err.__traceback__)
        status, interrupted = 1, isinstance(err, KeyboardInterrupt)
    threading._shutdown()  # Python's exit joins the non-daemon threads first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as Python does since 3.8: the parent sees a death by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


if __name__ == "__main__":
    _main()
