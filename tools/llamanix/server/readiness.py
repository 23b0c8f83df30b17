"""``llamanix readiness``: is a just-started llama-server serving?

Run as the unit's ``ExecStartPost=`` (and by ``up``), so a start only counts once the server
answers: ``GET /health`` is 200 and a one-token completion comes back. It talks to loopback only
and needs no privilege, so an unkeyed unit runs it under the unit's own sandbox. The API key, when
the instance has one, is read from a file (systemd's credential directory), never taken on the
command line or from the environment.

A unit with a key cannot run it sandboxed: before systemd 256 a control process such as
``ExecStartPost=`` gets no readable copy of the unit's credentials (systemd 252, Debian 12,
answers "Permission denied", in system units with ``DynamicUser=`` and in user units alike). Such
units start it with systemd's ``+`` prefix and ``--as-server-user``: outside the sandbox (as root
in a system unit, as the user in a user unit) it opens the key through the server's own view of
the file system (``/proc/PID/root``: exactly the credential the server holds, nothing else),
then becomes the server's user and group, with no supplementary groups and ``no_new_privs``,
before it sends a single request.

Every unit start waits on this process, so it imports no HTTP library: two plain requests on
the standard library's ``http.client`` are all it sends (``scripts/bench-cli`` times it).
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llamanix.core.api_key import read_api_key
from llamanix.core.errors import UserError
from llamanix.core.readiness import deadline_s, files_size
from llamanix.external.process import alive

POLL_S = 0.25


@dataclass(frozen=True)
class ReadinessCheck:
    url: str
    model_files: tuple[str, ...] = ()
    api_key_file: Path | None = None
    # The server's pid ($MAINPID): when it is gone there is nothing to wait for.
    pid: int | None = None
    deadline_s: float | None = None
    # Started as root by the unit's "+" line: read the key as the server sees it, then become the
    # server's user (see the module's docstring).
    as_server_user: bool = False
    # A router: each of these model names must answer a one-token completion, asked one after
    # the other, so each member is loaded (and checked) in turn.
    served_models: tuple[str, ...] = ()

    def effective_deadline_s(self) -> float:
        if self.deadline_s is not None:
            return self.deadline_s
        return float(deadline_s(files_size(self.model_files) or 0))


class NotReady(Exception):
    """The server did not serve in time, or stopped; the message says which, in one line."""


PR_SET_NO_NEW_PRIVS = 38


def become_user_of(pid: int) -> None:
    """Switch this process to the user and group ``pid`` runs as, for good: no supplementary
    groups, and no way back to privilege (setuid from root clears every capability, and
    ``no_new_privs`` stops set-id programs from granting new ones)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as err:
        raise NotReady(f"llama-server (pid {pid}) is gone ({err.strerror})") from None
    ids = {
        line.split(":", 1)[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("Uid:", "Gid:"))
    }
    uid, gid = ids.get("Uid"), ids.get("Gid")
    if uid is None or gid is None:
        raise NotReady(f"llama-server (pid {pid}): no Uid/Gid in /proc/{pid}/status")
    if os.geteuid() == uid:
        # Already the server's user (``llamanix up`` runs both as whoever started it).
        return
    if os.geteuid() != 0:
        raise NotReady(
            f"--as-server-user: llama-server (pid {pid}) runs as uid {uid}, and this check as "
            f"uid {os.geteuid()}, not root"
        )
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise NotReady(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")


def wait_ready(check: ReadinessCheck) -> float:
    """Block until the server serves; returns the seconds it took. Raises NotReady."""
    started = time.monotonic()
    limit = check.effective_deadline_s()
    api_key = None
    key_file = check.api_key_file
    if check.as_server_user:
        if check.pid is None:
            raise NotReady("--as-server-user needs --pid (the server's pid, $MAINPID)")
        if key_file is not None:
            key_file = Path(f"/proc/{check.pid}/root") / key_file.relative_to(key_file.anchor)
    if key_file is not None:
        try:
            api_key = read_api_key(key_file)
        except UserError as err:
            raise NotReady(str(err)) from None
    if check.as_server_user and check.pid is not None:
        become_user_of(check.pid)
    last = "no answer yet"
    # "" = the one model of a plain server, which takes no model name.
    pending = list(check.served_models or ("",))
    probe = _Probe(check.url, api_key, timeout_s=max(10.0, limit))
    while True:
        elapsed = time.monotonic() - started
        if check.pid is not None and not alive(check.pid):
            raise NotReady(f"llama-server (pid {check.pid}) exited before serving ({last})")
        if elapsed > limit:
            raise NotReady(f"{check.url} not serving after {limit:g}s ({last})")
        try:
            health = probe.status("GET", "/health")
            if health != 200:
                last = f"/health answered {health}"
            else:
                while pending:
                    body: dict[str, object] = {"prompt": "Hello", "n_predict": 1, "temperature": 0}
                    if pending[0]:
                        body["model"] = pending[0]
                    done = probe.status("POST", "/completion", body)
                    named = f" for model {pending[0]}" if pending[0] else ""
                    last = f"a one-token completion{named} answered {done}"
                    if done in (401, 403):
                        raise NotReady(f"{check.url}: {last}: check the API key file")
                    if done != 200:
                        if pending[0]:
                            _raise_if_failed(probe, pending[0])
                        break
                    pending.pop(0)
                if not pending:
                    return time.monotonic() - started
        except _Failed as err:
            last = err.kind
        time.sleep(POLL_S)


def _raise_if_failed(probe: _Probe, model: str) -> None:
    """A router that gave up loading a member says so in /models: no use waiting for it."""
    try:
        data = json.loads(probe.body("GET", "/models"))
    except (_Failed, ValueError):
        return
    for entry in data.get("data", []) if isinstance(data, dict) else []:
        if not isinstance(entry, dict) or entry.get("id") != model:
            continue
        status = entry.get("status")
        if isinstance(status, dict) and status.get("failed"):
            code = status.get("exit_code")
            raise NotReady(
                f"{probe.url}: model {model} failed to load"
                + (f" (its llama-server exited with {code})" if code is not None else "")
            )


class _Failed(Exception):
    """A request that got no answer; ``kind`` names how, as the measure client's errors do
    (ConnectError, ReadTimeout, ...), for the one line a failed start prints."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True)
class _Probe:
    """One request at a time to the server at ``url``, each on a fresh connection."""

    url: str
    api_key: str | None
    timeout_s: float

    def status(self, method: str, path: str, body: dict[str, object] | None = None) -> int:
        """The status code of one request (its body read and dropped)."""
        return self._request(method, path, body)[0]

    def body(self, method: str, path: str) -> bytes:
        """The body of one request, whatever its status."""
        return self._request(method, path, None)[1]

    def _request(self, method: str, path: str, body: dict[str, object] | None) -> tuple[int, bytes]:
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=self.timeout_s)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            try:
                conn.connect()
            except TimeoutError:
                raise _Failed("ConnectTimeout") from None
            except OSError:
                raise _Failed("ConnectError") from None
            try:
                conn.request(method, parts.path.rstrip("/") + path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except TimeoutError:
                raise _Failed("ReadTimeout") from None
            except http.client.HTTPException:
                raise _Failed("RemoteProtocolError") from None
            except OSError:
                raise _Failed("ReadError") from None
            return response.status, data
        finally:
            conn.close()
