"""The fork server: a small warm interpreter that forks, confines, supervises and reports one job at a time.

What it is: a standard-library-only script, started by ``rlvr.sandbox.executor`` as ``<python> -I -S server.py
<config-json>`` with a clean environment, optionally inside ``bwrap``. It loads its sibling modules by path, builds
the seccomp program and the Landlock policy once, puts the job folders on a size-capped tmpfs when it can (root),
tells the trainer which layers are active, then serves ``run`` requests read from stdin. For each job it:

1. creates a private folder with a random name and per-job random secrets;
2. forks; the child starts a new session, points stdin at ``/dev/null`` and stdout/stderr at capped files, enters
   its folder, sets rlimits, drops root, applies Landlock, closes every other descriptor, loads the seccomp filter
   and runs the ``harness``;
3. supervises the child through a pidfd until the wall-clock deadline (checking disk use every 10 ms where no tmpfs
   caps it), then kills it and its process group, reaps it, and kills anything it left behind (this server is a
   child subreaper, so orphans come back to it);
4. has ``verdict`` check the reported secrets and decide the status, reads the output tails, deletes the folder and
   writes one result frame.

A ``{"mode": "script"}`` job (``ScriptJob``) is confined the same way but runs a whole program (``script``): stdin
from the job, its files written once Landlock holds, and as result its exit status, output head and files asked back.

What it is not: a security boundary against the trainer, nor usable from the package (it is a script); the trainer
side (pool, restarts, result objects) lives in ``executor``.
"""

from __future__ import annotations

import errno
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_MAX_REPORT_BYTES = 1 << 20
_SETUP_FAILED_EXIT = 120
_DISK_WATCH_S = 0.01


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_rlvr_sandbox_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


protocol = _load("protocol")
confine = _load("confine")
harness = _load("harness")
script = _load("script")
verdict = _load("verdict")


class Server:
    """State of one fork server: its configuration, the prepared layers, and the job loop."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.pid = os.getpid()
        self.jobs_root = config["jobs_root"]
        self.out_dir = config["out_dir"]
        self.stdout_path = os.path.join(self.out_dir, "stdout")
        self.stderr_path = os.path.join(self.out_dir, "stderr")
        self.tail_chars = int(config.get("tail_chars", 4000))
        self.layers: dict[str, dict] = {}
        self.limits = dict(config["limits"])
        os.makedirs(self.jobs_root, exist_ok=True)
        os.makedirs(self.out_dir, mode=0o700, exist_ok=True)
        sys.path.extend(config.get("extra_paths", ()))
        for module in config.get("preload", ()):
            try:
                importlib.import_module(module)
            except ImportError:
                pass
        self._prepare_subreaper()
        self._prepare_pidfd()
        self._prepare_privileges()
        self._prepare_landlock()
        self._prepare_seccomp()
        self._prepare_nproc()
        self._prepare_disk()
        self.layers["rlimits"] = {"active": True, "detail": ", ".join(
            f"{k}={v}" for k, v in sorted(self.limits.items()) if v is not None) + ", core=0"}

    # -- preparation -------------------------------------------------------------------------------------------
    def _layer(self, name: str, active: bool, detail: str) -> None:
        self.layers[name] = {"active": active, "detail": detail}

    def _prepare_subreaper(self) -> None:
        try:
            confine.become_subreaper()
            known = confine.children() is not None
            self._layer("subreaper", known, "orphans of a job return to the fork server and are killed"
                        if known else "active, but /proc cannot list children: orphans are not swept")
        except OSError as exc:
            self._layer("subreaper", False, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {exc}")

    def _prepare_pidfd(self) -> None:
        try:
            fd = os.pidfd_open(os.getpid())
            os.close(fd)
            self.use_pidfd = True
            self._layer("pidfd", True, "wall-clock timeouts wait on a pidfd with poll()")
        except (AttributeError, OSError) as exc:
            self.use_pidfd = False
            self._layer("pidfd", False, f"pidfd_open unavailable ({exc}); falling back to 10 ms waitpid polling")

    def _prepare_privileges(self) -> None:
        self.drop: tuple[int, int, bool] | None = None
        uid, gid = self.config.get("uid", 65534), self.config.get("gid", 65534)
        if os.geteuid() != 0:
            self._layer("privileges", True, f"not root: jobs run as uid {os.geteuid()}")
            return
        if not self.config.get("drop_privileges", True):
            self._layer("privileges", False, "running as root and drop_privileges=False: jobs run as root")
            return
        read_paths = [p for p in self._interpreter_paths() if os.path.exists(p)]
        try:
            unreadable = confine.unreadable_for(uid, gid, read_paths)
        except OSError as exc:
            self._layer("privileges", False, f"root, but cannot drop to uid {uid}: {exc}; jobs run as root")
            return
        keep = bool(unreadable)
        self.drop = (uid, gid, keep)
        detail = f"root -> uid {uid}/gid {gid}, no groups, no capabilities"
        if keep:
            detail += (f" except CAP_DAC_READ_SEARCH (uid {uid} cannot read {unreadable[0]}; reads stay"
                       " confined to the interpreter and system folders by Landlock)")
        self._layer("privileges", True, detail)
        os.chmod(self.jobs_root, 0o711)

    def _interpreter_paths(self) -> list[str]:
        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
        paths.update(p for p in sys.path if p)
        paths.update(self.config.get("extra_paths", ()))
        return sorted(paths)

    def _prepare_landlock(self) -> None:
        self.landlock = None
        if not self.config.get("landlock", True):
            self._layer("landlock", False, "disabled by the caller (use_landlock=False)")
            return
        try:
            landlock = _load("landlock")
            policy = landlock.Policy(landlock.interpreter_read_paths(tuple(self.config.get("extra_paths", ()))))
        except OSError as exc:
            self._layer("landlock", False, f"could not prepare the policy: {exc}")
            return
        if not policy.active:
            self._layer("landlock", False, policy.reason)
            return
        self.landlock = policy
        self._layer("landlock", True, landlock.describe(policy.abi))

    def _prepare_seccomp(self) -> None:
        self.seccomp = None
        if not self.config.get("seccomp", True):
            self._layer("seccomp", False, "disabled by the caller (use_seccomp=False)")
            return
        try:
            module = _load("seccomp")
            self.seccomp = module.Filter()
        except OSError as exc:
            self._layer("seccomp", False, str(exc))
            return
        self._layer("seccomp", True, f"libseccomp {self.seccomp.version}, {len(self.seccomp.denied)} calls denied "
                    "(no fork/exec, no sockets but stream socketpairs, signals only to itself)")

    def _prepare_nproc(self) -> None:
        """RLIMIT_NPROC counts every task of a real uid, so it only means something for a uid of our own."""
        budget = int(self.config.get("max_processes", 128))
        if self.drop is not None:
            self.limits["processes"] = budget + confine.count_tasks_of_uid(self.drop[0])
        elif os.geteuid() != 0 and self.seccomp is None:
            self.limits["processes"] = budget + confine.count_tasks_of_uid(os.getuid())
        else:
            self.limits["processes"] = None

    def _prepare_disk(self) -> None:
        """Bound what jobs write: a private tmpfs when root, bwrap's sized tmpfs, else a statvfs watchdog."""
        limit = int(self.config.get("disk_bytes", 256 << 20))
        mib = limit >> 20
        self.disk_watch: int | None = None
        if self.config.get("wrapped"):
            self._layer("disk", True, f"bwrap's private /tmp holds the job folders, {mib} MiB at most")
            return
        if os.geteuid() == 0:
            try:
                confine.private_tmpfs(self.jobs_root, limit)
                self._layer("disk", True, f"a private {mib} MiB tmpfs holds the job folders (writes past it fail)")
                return
            except OSError as exc:
                reason = f"no private tmpfs ({exc})"
        else:
            reason = "not root"
        self.disk_watch = limit
        self._layer("disk", True, f"{reason}: a watchdog kills a job whose writes pass {mib} MiB (checked every "
                    f"{_DISK_WATCH_S * 1000:.0f} ms, so a fast writer may overshoot)")

    # -- one job -----------------------------------------------------------------------------------------------
    def run(self, job: dict) -> dict:
        scripted = job.get("mode") == "script"
        tests = [] if scripted else list(job.get("tests", ()))
        timeout = float(job["timeout"])
        job_dir = os.path.join(self.jobs_root, os.urandom(12).hex())
        try:
            os.mkdir(job_dir, 0o700)
            if self.drop is not None:
                os.chown(job_dir, self.drop[0], self.drop[1])
            read_end, write_end = os.pipe()
        except OSError as exc:
            return self._result(job, "error", 0, f"[sandbox] could not create the job folder: {exc}", 0.0, "")
        pool = os.urandom(16 * (len(tests) + 2))
        job_secrets = {"pass": [pool[16 * i:16 * i + 16] for i in range(len(tests))], "end": pool[-32:-16],
                       "setup": pool[-16:]}
        limits = dict(self.limits, cpu_s=max(1, int(timeout + 0.999)))
        if job.get("memory_bytes"):  # a job may ask for less memory than the pool's limit, never more
            limits["memory_bytes"] = min(int(job["memory_bytes"]), self.limits["memory_bytes"])
        started = time.monotonic()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            verdict.force_rmtree(job_dir)
            return self._result(job, "error", 0, f"[sandbox] fork failed: {exc}", 0.0, "")
        if pid == 0:  # pragma: no cover - the job process
            os.close(read_end)
            self._child(job, job_dir, write_end, limits, job_secrets)
        os.close(write_end)
        # Only the parent keeps these names: the job's copy of this frame holds nothing but the emptied dict.
        expected = {s: i for i, s in enumerate(job_secrets["pass"])}
        end_secret, setup_secret = job_secrets["end"], job_secrets["setup"]
        try:
            report, how, exit_info = self._supervise(pid, read_end, started + timeout)
        except BaseException:
            self._kill(pid, -1)  # never leave a job running behind a failed supervisor
            os.waitpid(pid, 0)
            verdict.force_rmtree(job_dir)
            raise
        duration = time.monotonic() - started
        if scripted:
            return self._script_result(job, timeout, report, how, exit_info, duration, setup_secret, job_dir)
        return self._judge(job, tests, timeout, report, how, exit_info, duration, expected, end_secret,
                           setup_secret, job_dir)

    def _child(self, job: dict, job_dir: str, report_fd: int, limits: dict, job_secrets: dict) -> None:
        """Confine this freshly forked process and run the harness; never returns."""
        scripted, program, step = job.get("mode") == "script", "", "confine"
        try:
            os.setsid()
            stdin = script.stdin_fd(job.get("stdin")) if scripted else os.open("/dev/null", os.O_RDONLY)
            out = os.open(self.stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err = os.open(self.stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            for fd, target in ((stdin, 0), (out, 1), (err, 2)):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(job_dir)
            confine.set_rlimits(limits)
            if self.drop is not None:
                confine.drop_privileges(*self.drop)
            confine.set_parent_death_signal(self.pid)
            if self.landlock is not None:
                self.landlock.apply(job_dir)
            os.closerange(3, report_fd)  # the Landlock path descriptors, the server's leftovers
            os.closerange(report_fd + 1, 1 << 20)
            if scripted:  # as the job's uid, under Landlock and the rlimits: a file can land in its folder only
                step = "write the program and its files"
                program = script.stage(job, job_dir)
                step = "confine"
            if self.seccomp is not None:
                self.seccomp.apply()
            os.environ["HOME"] = os.environ["TMPDIR"] = job_dir  # the rest was set once in the server
            setup_code, code, tests = job.get("setup_code", ""), job["code"], list(job.get("tests", ()))
            job.clear()
        except BaseException as exc:
            try:
                os.write(2, f"[sandbox] could not {step} the job, so it did not run: {exc!r}\n".encode())
                os.write(report_fd, harness.SETUP_FAILED + job_secrets["setup"])
            finally:
                os._exit(_SETUP_FAILED_EXIT)
        try:
            if scripted:
                os.close(report_fd)  # nothing to report: the exit status is the result
                script.run(code, program)
            harness.run(setup_code, code, tests, job_secrets, report_fd)
        finally:
            os._exit(1)  # never fall back into the server's code in a job process

    def _supervise(self, pid: int, read_end: int, deadline: float) -> tuple[bytes, str, tuple[int, float]]:
        """Wait for the job to exit or the deadline.

        Returns the report bytes, how it ended ("exited", "timeout", "disk" or "abort") and
        (wait status, CPU seconds).
        """
        report = bytearray()
        try:
            pidfd = os.pidfd_open(pid) if self.use_pidfd else -1
        except OSError:  # out of descriptors, say: fall back to polling for this job
            pidfd = -1
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        poller.register(0, select.POLLHUP)
        if pidfd >= 0:
            poller.register(pidfd, select.POLLIN)
        how = "timeout"
        reading = True
        status = None
        disk_base = confine.used_bytes(self.jobs_root) if self.disk_watch is not None else 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self.disk_watch is not None and confine.used_bytes(self.jobs_root) - disk_base > self.disk_watch:
                how = "disk"
                break
            wait_ms = remaining * 1000 if pidfd >= 0 else min(remaining * 1000, 10)
            if self.disk_watch is not None:
                wait_ms = min(wait_ms, _DISK_WATCH_S * 1000)
            events = poller.poll(max(1, int(wait_ms + 0.999)))
            done = False
            for fd, event in events:
                if fd == read_end:
                    chunk = os.read(read_end, 65536)
                    if not chunk:
                        poller.unregister(read_end)
                        reading = False
                    elif len(report) < _MAX_REPORT_BYTES:
                        report += chunk
                elif fd == pidfd:
                    done = True
                elif fd == 0 and event & (select.POLLHUP | select.POLLERR):
                    how, done = "abort", True
                elif fd == 0:
                    poller.unregister(0)
            if pidfd < 0:
                waited, wait_status, usage = os.wait4(pid, os.WNOHANG)
                if waited:
                    status, done = (wait_status, usage.ru_utime + usage.ru_stime), True
            if done:
                if how != "abort":
                    how = "exited"
                break
        if how != "exited":
            self._kill(pid, pidfd)
        if status is None:
            _, wait_status, usage = os.wait4(pid, 0)
            status = (wait_status, usage.ru_utime + usage.ru_stime)
        try:
            os.killpg(pid, signal.SIGKILL)  # anything still in the job's process group
        except OSError:
            pass
        if reading:
            os.set_blocking(read_end, False)
            while len(report) < _MAX_REPORT_BYTES:
                try:
                    chunk = os.read(read_end, 65536)
                except BlockingIOError:
                    break  # a leftover process still holds the write end; it is killed below
                if not chunk:
                    break
                report += chunk
        os.close(read_end)
        if pidfd >= 0:
            os.close(pidfd)
        confine.kill_children()
        return bytes(report), how, status

    @staticmethod
    def _kill(pid: int, pidfd: int) -> None:
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def _judge(self, job: dict, tests: list, timeout: float, report: bytes, how: str, exit_info: tuple[int, float],
               duration: float, expected: dict, end_secret: bytes, setup_secret: bytes, job_dir: str) -> dict:
        found = verdict.count_reports(report, expected, end_secret, setup_secret)
        status, notes = verdict.decide(found, len(tests), how, exit_info[0], exit_info[1], timeout, self.disk_watch)
        stderr_tail = verdict.tail(self.stderr_path, self.tail_chars)
        stdout_tail = verdict.tail(self.stdout_path, self.tail_chars)
        if notes:
            stderr_tail = (stderr_tail + ("\n" if stderr_tail and not stderr_tail.endswith("\n") else "")
                           + "".join(f"[sandbox] {note}\n" for note in notes))
        try:
            verdict.force_rmtree(job_dir)
        except OSError as exc:
            stderr_tail += f"[sandbox] could not delete the job folder {job_dir}: {exc}\n"
        return self._result(job, status, len(found.passed), stderr_tail, duration, stdout_tail, len(tests))

    def _script_result(self, job: dict, timeout: float, report: bytes, how: str, exit_info: tuple[int, float],
                       duration: float, setup_secret: bytes, job_dir: str) -> dict:
        """The result frame of a script job: status, return code, the head of its output, the files asked back."""
        limit = int(job.get("output_bytes", 1 << 20))
        stdout, stderr = script.read_head(self.stdout_path, limit), script.read_head(self.stderr_path, limit)
        if verdict.count_reports(report, {}, b"", setup_secret).setup_failed:
            status, return_code, notes, files = script.ERROR, None, [], {}
        else:
            status, return_code, notes = script.outcome(how, exit_info[0], exit_info[1], timeout, self.disk_watch)
            files, fetch_notes = script.fetch(job_dir, list(job.get("fetch_files", ())),
                                              int(self.limits.get("file_bytes") or 16 << 20))
            notes += fetch_notes
        if notes:
            stderr += "\n" if stderr and not stderr.endswith("\n") else ""
            stderr += "".join(f"[sandbox] {note}\n" for note in notes)
        try:
            verdict.force_rmtree(job_dir)
        except OSError as exc:
            stderr += f"[sandbox] could not delete the job folder {job_dir}: {exc}\n"
        return {"op": "result", "id": job.get("id"), "status": status, "return_code": return_code, "stdout": stdout,
                "stderr": stderr, "duration_s": duration, "files": files}

    @staticmethod
    def _result(job: dict, status: str, num_passed: int, stderr_tail: str, duration: float, stdout_tail: str,
                num_tests: int | None = None) -> dict:
        return {"op": "result", "id": job.get("id"), "status": status, "num_passed": num_passed,
                "num_tests": len(job.get("tests", ())) if num_tests is None else num_tests,
                "stderr_tail": stderr_tail, "stdout_tail": stdout_tail, "duration_s": duration}

    # -- loop --------------------------------------------------------------------------------------------------
    def serve(self) -> int:
        protocol.write_frame(1, {"op": "ready", "pid": self.pid, "layers": self.layers,
                                 "python": sys.version.split()[0]})
        gc.collect()
        # What every job inherits, set once here rather than in each job.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-long output fails with EFBIG, not death
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent", "TMPDIR": "/tmp"})
        sys.argv = ["<solution>"]
        gc.freeze()  # keep the warm heap shared with the jobs instead of copied by the collector
        while True:
            try:
                message = protocol.read_frame(0)
            except (OSError, ValueError):
                return 1
            if message is None or message.get("op") == "exit":
                return 0
            if message.get("op") != "run":
                continue
            try:
                result = self.run(message)
            except Exception as exc:
                result = self._result(message, "error", 0, f"[sandbox] the fork server failed: {exc!r}", 0.0, "")
            try:
                protocol.write_frame(1, result)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    return 0
                raise


def main(argv: list[str]) -> int:
    """Entry point: ``server.py CONFIG_JSON``."""
    if len(argv) != 2:
        sys.stderr.write("usage: python -I -S server.py CONFIG_JSON (started by rlvr.sandbox, not by hand)\n")
        return 2
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return Server(json.loads(argv[1])).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
