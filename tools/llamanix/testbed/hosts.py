"""Real systemd hosts for tests: Debian root file systems booted with systemd as PID 1.

A unit llamanix renders only counts as working once a real systemd has started it, on the
versions users run: Debian 12 (systemd 252) and Debian 13 (systemd 257). This module

- builds each host's root file system once with ``mmdebstrap`` from Debian's own packages and
  caches it by content under ``$LLAMANIX_CACHE/hosts`` (``~/.cache/llamanix/hosts``);
- unpacks a private copy and boots it with ``systemd-nspawn --boot`` (its own network
  namespace: loopback only), and runs commands inside with ``nsenter``;
- installs llamanix as a user would: the distribution's python3 makes a venv at /opt/llamanix
  and pip installs the project's wheel offline from a directory of wheels; llama-server goes to
  /usr/local/bin and models to /srv/models. Nothing of this machine is bind-mounted in;
- always tears the host down: ``systemctl poweroff`` inside, then a kill of its PID 1 (which
  ends every process of the container), then of nspawn.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, get_args

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external import container, pip
from llamanix.external.files import extract_trusted, locked
from llamanix.external.process import Child, Finished, wait_exit
from llamanix.external.signals import signal_process
from llamanix.testbed.server_build import cache_root

HostName = Literal["debian12", "debian13"]
HOST_NAMES: tuple[HostName, ...] = get_args(HostName)

# Bump when the way a root file system is made changes, so cached ones are rebuilt.
ROOTFS_FORMAT = 2
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    # A user manager's bus, and logind's lingering: what `systemctl --user` needs for a
    # normal user's units.
    "dbus-user-session",
    "libpam-systemd",
    "python3",
    "python3-venv",
    # The CPU llama-server's OpenMP runtime.
    "libgomp1",
    "procps",
    # useradd: not in Debian 13's minimal set.
    "passwd",
    # sudo resets PATH: the tests run llamanix through it as a user would.
    "sudo",
    # The fleet bed (llamanix.testbed.fleet): hosts a controller reaches over ssh, each with
    # its own address on a bridge.
    "openssh-server",
    "iproute2",
    # A switch fences a server's port while it restarts (llamanix.external.nft).
    "nftables",
)
VENV = "/opt/llamanix"
LLAMANIX = f"{VENV}/bin/llamanix"
WHEELS = "/var/cache/llamanix-wheels"
MODELS = "/srv/models"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# How long a host's way down may take: longer than the longest stop timeout of its units
# (user@.service: 120 s), after which systemd kills what still runs and goes on.
SHUTDOWN_WAIT_S = 180.0
# The normal user of the user-unit scenarios.
USER = "alice"
USER_UID = 1000


@dataclass(frozen=True)
class HostSpec:
    name: HostName
    suite: str
    systemd: int
    python: str


SPECS: dict[HostName, HostSpec] = {
    "debian12": HostSpec("debian12", "bookworm", 252, "3.11"),
    "debian13": HostSpec("debian13", "trixie", 257, "3.13"),
}


def spec_of(name: str) -> HostSpec:
    if name not in SPECS:
        raise UserError(
            Problem("host", name, "is not a test host", "use one of: " + ", ".join(SPECS))
        )
    return SPECS[name]


def hosts_cache() -> Path:
    return cache_root() / "hosts"


def rootfs_key(spec: HostSpec) -> str:
    """What decides a root file system's content; its cache file is named by this hash."""
    data = {"format": ROOTFS_FORMAT, "suite": spec.suite, "packages": sorted(PACKAGES)}
    data["argv"] = container.mmdebstrap_argv(spec.suite, sorted(PACKAGES), Path("OUT"))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_tarball(spec: HostSpec) -> Path:
    """The cached root file system of ``spec`` (built with mmdebstrap, ~25-90 s, if missing)."""
    cache = hosts_cache()
    out = cache / f"{spec.name}-{rootfs_key(spec)}.tar"
    with locked(cache / f".{spec.name}.lock"):
        if out.is_file():
            return out
        staging = out.with_name(f"{out.stem}.partial.tar")
        with (cache / f"{spec.name}.log").open("w") as log:
            container.mmdebstrap(spec.suite, sorted(PACKAGES), staging, log)
        os.replace(staging, out)
        # Checkouts of other package lists may share the cache: the three newest stay.
        others = sorted(
            (p for p in cache.glob(f"{spec.name}-*.tar") if p != out and ".partial" not in p.name),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in others[2:]:
            old.unlink()
    return out


def _container_init(nspawn_pid: int) -> int | None:
    """The container's systemd: the descendant of nspawn that is PID 1 in its own namespace
    (nspawn's first child is an intermediate process that forks it and goes away)."""
    pending = [nspawn_pid]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    pending += [int(c) for c in (task / "children").read_text().split()]
        if pid == nspawn_pid:
            continue
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and line.split()[1:] == [str(pid), "1"]:
                    return pid
    return None


class HostCommandError(ExternalCommandError):
    """A command inside a host failed; the message holds its output's tail."""


@dataclass
class Host:
    """A booted host: run commands in it, write files into it, reboot it, power it off."""

    spec: HostSpec
    root: Path
    machine: str
    log_path: Path
    # On a fleet bed's bridge (llamanix.testbed.fleet) instead of loopback only; every boot,
    # a reboot's too, joins it again.
    bridge: container.Bridge | None = None
    # A cgroup of its own (external/cgroups.py), where one process boots several hosts.
    cgroups: tuple[Path, ...] = ()
    pid: int = 0
    _nspawn: Child | None = field(default=None, repr=False)
    _log: IO[str] | None = field(default=None, repr=False)

    # --- lifecycle -------------------------------------------------------------------------

    def boot(self, timeout_s: float = 120.0) -> None:
        """Start the container and wait until its systemd says the system is up."""
        self._log = self.log_path.open("a")
        self._nspawn = container.nspawn_boot(
            self.root, self.machine, self._log, self.bridge, self.cgroups
        )
        deadline = time.monotonic() + timeout_s
        while not self.pid:
            if self._nspawn.poll() is not None:
                raise ExternalCommandError(
                    f"{self.spec.name}: systemd-nspawn exited with {self._nspawn.returncode} "
                    f"before booting; see {self.log_path}"
                )
            init = _container_init(self._nspawn.pid)
            if init is not None:
                self.pid = init
            elif time.monotonic() > deadline:
                raise ExternalCommandError(f"{self.spec.name}: no systemd after {timeout_s:g}s")
            else:
                time.sleep(0.1)
        while True:
            done = container.nsenter(
                self.pid, ["systemctl", "is-system-running", "--wait"], timeout_s=timeout_s
            )
            state = done.stdout.strip()
            if state in ("running", "degraded"):
                self._like_a_real_host()
                return
            if time.monotonic() > deadline:
                raise ExternalCommandError(
                    f"{self.spec.name}: system is {state!r}, not up ({done.stderr.strip()}); "
                    f"see {self.log_path}"
                )
            time.sleep(0.2)

    def _like_a_real_host(self) -> None:
        """Undo what nspawn does that a real host does not have. nspawn covers /proc/kmsg with a
        FIFO (a bind mount of a file it has deleted, for the container's journal); a user
        manager cannot mask that with ProtectKernelLogs= and every user unit then fails with
        226/NAMESPACE. On a real host /proc/kmsg is procfs' own file."""
        container.nsenter(self.pid, ["umount", "/proc/kmsg"], timeout_s=30)

    def _wait_exit(self, timeout_s: float) -> int | None:
        if self._nspawn is None:
            return None
        return wait_exit(self._nspawn, timeout_s)

    def _closed(self) -> None:
        self._nspawn = None
        self.pid = 0
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """End the container for sure: its PID 1 (and so every process in it), then nspawn."""
        if self._nspawn is None:
            return
        for pid in (self.pid, self._nspawn.pid):
            if pid:
                signal_process(pid, signal.SIGKILL)
            if self._wait_exit(10.0) is not None:
                break
        self._closed()

    def poweroff(self, timeout_s: float = 60.0) -> None:
        if self._nspawn is None:
            return
        if self._nspawn.poll() is None:
            with contextlib.suppress(ExternalCommandError):
                container.nsenter(self.pid, ["systemctl", "poweroff", "--no-block"], timeout_s=30)
        if self._wait_exit(timeout_s) is None:
            self.kill()
        else:
            self._closed()

    def reboot(self, timeout_s: float = 120.0) -> None:
        """``systemctl reboot`` inside: nspawn exits (133, "reboot") and the same root boots.
        The way down may take up to ``SHUTDOWN_WAIT_S``: systemd itself kills a unit that
        does not stop in its stop timeout (a Debian 13 user manager hung on its exit.target
        once, and user@.service waits 120 s)."""
        assert self._nspawn is not None, "reboot of a host that is not running"
        container.nsenter(self.pid, ["systemctl", "reboot", "--no-block"], timeout_s=30)
        code = self._wait_exit(max(timeout_s, SHUTDOWN_WAIT_S))
        if code is None:
            self.kill()
            raise ExternalCommandError(f"{self.spec.name}: did not go down for the reboot")
        self._closed()
        self.boot(timeout_s)

    @property
    def running(self) -> bool:
        return self._nspawn is not None and self._nspawn.poll() is None

    # --- inside the host -------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
        timeout_s: float = 300.0,
        check: bool = True,
    ) -> Finished:
        """Run ``argv`` inside as root, or as ``user`` with that user's login environment (its
        runtime directory and bus, so ``systemctl --user`` reaches its manager)."""
        uid = None
        env_extra = env
        if user is not None:
            uid = self.uid_of(user)
            env = {**self.user_env(user, uid), **(env_extra or {})}
        else:
            # Root's login environment, not this machine's: nothing of the caller leaks in.
            env = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": ROOT_PATH}
            env.update(env_extra or {})
        done = container.nsenter(
            self.pid, argv, uid=uid, env=env, input_text=input_text, timeout_s=timeout_s
        )
        if check and done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise HostCommandError(
                f"{self.spec.name}: {' '.join(argv)} exited with {done.returncode}:\n{tail}"
            )
        return done

    def sh(self, script: str, **kw: object) -> Finished:
        return self.run(["sh", "-euc", script], **kw)  # type: ignore[arg-type]

    def uid_of(self, user: str) -> int:
        for line in self.path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2])
        raise ExternalCommandError(f"{self.spec.name}: no user {user}")

    def user_env(self, user: str, uid: int) -> dict[str, str]:
        runtime = f"/run/user/{uid}"
        return {
            "HOME": f"/home/{user}",
            "USER": user,
            "LOGNAME": user,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "XDG_RUNTIME_DIR": runtime,
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus",
        }

    def path(self, inside: str) -> Path:
        """Where a path of the host lies in this machine's file system. Persistent paths only:
        the container's /run and /tmp are its own tmpfs, seen only from inside."""
        return self.root / inside.lstrip("/")

    def write(self, inside: str, data: str | bytes, mode: int = 0o644, owner: int = 0) -> None:
        """Replace ``inside`` atomically, as a package upgrade replaces a file: a program that
        is running keeps its old copy."""
        target = self.path(inside)
        missing = [d for d in (target.parent, *target.parent.parents) if not d.exists()]
        target.parent.mkdir(parents=True, exist_ok=True)
        for directory in missing:
            # The directories made on the way belong to the file's owner, as `install -D` run
            # by that user would make them.
            os.chown(directory, owner, owner)
        if isinstance(data, str):
            data = data.encode()
        staged = target.with_name(f".{target.name}.llamanix-tmp")
        staged.write_bytes(data)
        os.chmod(staged, mode)
        os.chown(staged, owner, owner)
        os.replace(staged, target)

    def journal(self, unit: str, user_unit: bool = False) -> str:
        """The unit's journal since boot, as root reads it (a user unit's too)."""
        argv = ["journalctl", "--no-pager", "-o", "cat", "-b"]
        argv += ["--user-unit", unit] if user_unit else ["-u", unit]
        return self.run(argv, check=False).stdout


def unpack(spec: HostSpec, workdir: Path) -> Path:
    """A private, writable copy of the cached root file system under ``workdir``."""
    root = workdir / "root"
    root.mkdir(parents=True)
    with tarfile.open(rootfs_tarball(spec)) as tar:
        # The archive is ours (mmdebstrap's output): device nodes and ownership must survive.
        extract_trusted(tar, root, numeric_owner=True)
    (root / "etc/hostname").write_text(f"{spec.name}\n")
    # As Debian's installer writes it: sudo resolves the host's own name.
    with (root / "etc/hosts").open("a") as hosts_file:
        hosts_file.write(f"127.0.1.1\t{spec.name}\n")
    return root


@contextlib.contextmanager
def booted(name: str, workdir: Path) -> Iterator[Host]:
    """A freshly unpacked, booted host; powered off (or killed) and removed on the way out."""
    spec = spec_of(name)
    workdir.mkdir(parents=True, exist_ok=True)
    root = unpack(spec, workdir)
    machine = f"llamanix-{spec.name}-{os.getpid()}"
    host = Host(spec, root, machine, workdir / "console.log")
    try:
        host.boot()
        yield host
    finally:
        host.poweroff()
        shutil.rmtree(root, ignore_errors=True)


# --- installing what a user installs ----------------------------------------------------------


def requirements_of(project: Path) -> list[str]:
    """The project's runtime dependencies, as pyproject.toml lists them (their one source)."""
    data = tomllib.loads((project / "pyproject.toml").read_text())
    return [str(r) for r in data["project"]["dependencies"]]


def dependency_wheels(python: str, requirements: Sequence[str]) -> Path:
    """Wheels of ``requirements`` for CPython ``python``, downloaded once and cached."""
    key = hashlib.sha256(json.dumps([python, sorted(requirements)]).encode()).hexdigest()[:16]
    out = hosts_cache() / "wheels" / f"cp{python.replace('.', '')}-{key}"
    with locked(hosts_cache() / ".wheels.lock"):
        if (out / ".complete").is_file():
            return out
        staging = Path(tempfile.mkdtemp(prefix="wheels.", dir=out.parent.parent))
        pip.download(python, requirements, staging)
        (staging / ".complete").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, out)
    return out


def install_llamanix(host: Host, project_wheel: Path, dependencies: Path) -> None:
    """A venv made by the distribution's python3 at /opt/llamanix, filled offline."""
    wheels = host.path(WHEELS)
    wheels.mkdir(parents=True, exist_ok=True)
    for whl in [project_wheel, *dependencies.glob("*.whl")]:
        shutil.copy2(whl, wheels / whl.name)
    host.run(["python3", "-m", "venv", VENV])
    host.run(
        [f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--find-links", WHEELS,
         f"{WHEELS}/{project_wheel.name}"],
        env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip


def install_llama_server(host: Host, binary: Path, name: str = "llama-server") -> str:
    """The CPU llama-server (static, needs libgomp1) under /usr/local/bin; its path there."""
    inside = f"/usr/local/bin/{name}"
    host.write(inside, binary.read_bytes(), mode=0o755)
    host.run(["ldconfig"])
    return inside


def add_user(host: Host, user: str = USER, linger: bool = True) -> int:
    """A normal login user, with lingering so its manager runs without a session."""
    host.run(["useradd", "--create-home", "--uid", str(USER_UID), "--shell", "/bin/sh", user])
    if linger:
        host.run(["loginctl", "enable-linger", user])
        deadline = time.monotonic() + 60
        bus = f"/run/user/{USER_UID}/bus"
        while host.run(["test", "-S", bus], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ExternalCommandError(f"{host.spec.name}: {user}'s manager did not start")
            time.sleep(0.2)
    return USER_UID


def shell(name: str, workdir: Path, project: Path | None, binary: Path | None) -> int:
    """Boot ``name``, install what the tests install, and open a root shell in it."""
    with booted(name, workdir) as host:
        if project is not None:
            wheel_dir = workdir / "dist"
            wheel = pip.wheel(project, wheel_dir)
            deps = dependency_wheels(host.spec.python, requirements_of(project))
            install_llamanix(host, wheel, deps)
        if binary is not None:
            install_llama_server(host, binary)
        return container.nsenter_interactive(host.pid, ["/bin/bash", "-l"])
