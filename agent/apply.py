"""Applying a snapshot bundle on this host (the agent rules in docs/design.md).

verify checksum -> refuse a lower number -> resolve secrets -> back up -> stage
the files in the target's filesystem -> validate the staged tree -> swap each file
into place (rename) and remove stale files -> reload (start if not running) ->
probe the service's health (agent/health.py), when a probe is configured.
A validate command that does not name the staged tree ({staged}) checks files in
place: then the files are written in place first and validated there.
On failure (an unhealthy service included): restore the backup and reload
(warning); with nothing to restore, write the safe fallback (warning), else
failed. Any OSError (read-only target, full state directory) ends in an outcome
too, never in an exception. The server never sends commands: validate, reload,
start and the health command are configured on this host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shlex
import signal
import stat
import subprocess
import time

from agent import drift, health, references, stopping
from agent import files as fs
from agent.references import SecretError
from agent.state import State

logger = logging.getLogger("agent.apply")

SUCCEEDED, WARNING, FAILED = "succeeded", "warning", "failed"
STAGED_PLACEHOLDER = "{staged}"


@dataclasses.dataclass
class Outcome:
    status: str
    message: str
    # The health probe's result (Health.report()) when one ran.
    health: dict | None = None


@dataclasses.dataclass
class Commands:
    validate: str | None = None
    reload: str | None = None
    start: str | None = None
    timeout_s: float = 120.0
    # Names of the agent's environment variables commands also get (--command-env).
    passthrough_env: tuple = ()


def content_checksum(entries, secret_file_mode=None) -> str:
    """The server's checksum: sha256 over a JSON array of [path, content] sorted by path,
    each sealed secret placeholder written as its reference; with a declared secret
    file mode, over {"files": that array, "secret_file_mode": mode}
    (configlang/rendering.py)."""
    pairs = [[f["path"], references.unsealed(f["content"])]
             for f in sorted(entries, key=lambda f: f["path"])]
    canonical = json.dumps(
        pairs if secret_file_mode is None
        else {"files": pairs, "secret_file_mode": secret_file_mode},
        ensure_ascii=False, separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What commands get of the agent's environment (docs/agents.md), besides --command-env.
COMMAND_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def stages(command: str | None) -> bool:
    """Whether a validate command checks the staged tree (else: files in place)."""
    return bool(command) and (STAGED_PLACEHOLDER in command
                              or "BELLWETHER_STAGED_DIR" in command)


def command_environment(environ, *, target_dir: str, number, passthrough=(),
                        staged: str | None = None) -> dict:
    """The environment of validate/reload/start: an allowlist of the agent's own
    variables, none naming a place inside the target directory; PATH without
    relative entries or entries inside the target directory; Python told not to
    put the working or script directory nor the user's site on its path."""
    env = {}
    for name, value in environ.items():
        if name in COMMAND_ENV or name.startswith("LC_") or name in passthrough:
            if name != "PATH" and os.path.isabs(value) and _under(value, target_dir):
                continue
            env[name] = value
    entries = [e for e in env.get("PATH", DEFAULT_PATH).split(os.pathsep)
               if os.path.isabs(e) and not _under(e, target_dir)]
    env["PATH"] = os.pathsep.join(entries) or DEFAULT_PATH
    env.update(BELLWETHER_TARGET_DIR=target_dir, BELLWETHER_SNAPSHOT=str(number or ""),
               PYTHONSAFEPATH="1", PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    if staged:
        env["BELLWETHER_STAGED_DIR"] = staged
    return env


# After a stop signal, how long a command's process group has to end on SIGTERM
# before it is killed (SIGKILL).
STOP_GRACE_S = 5.0


def end_process_group(process: subprocess.Popen, name: str,
                      grace_s: float = STOP_GRACE_S) -> None:
    """End a command the agent is leaving (it is stopping): SIGTERM to its process
    group, then, once the command has exited or after `grace_s`, SIGKILL to what is
    left of the group. The command is reaped last, so its pid (the group's id) is
    never another's while the group is signalled."""
    logger.warning("stopping: ending the %s command (pid %s) and its process group",
                   name, process.pid)
    with contextlib.suppress(OSError):  # OSError: the group is gone
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not _exited(process.pid):
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)  # what ignored SIGTERM, or outlived it
    process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    logger.warning("stopping: ended the %s command (pid %s) and its process group",
                   name, process.pid)


def _exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class Applier:
    def __init__(self, *, target_dir: str, state_dir: str, commands: Commands, save,
                 environ=None, secret_allow=None, probe: health.Probe | None = None,
                 sleep=time.sleep):
        self.target_dir = target_dir
        self.state_dir = state_dir
        self.backup_dir = os.path.join(state_dir, "backup")
        # Commands run here: an empty directory of the agent's, never the target's.
        self.run_dir = os.path.join(state_dir, "run")
        self.commands = commands
        self.save = save  # persists the State
        self.environ = os.environ if environ is None else environ
        self.secret_allow = secret_allow
        self.temp_key = fs.temp_key(state_dir)
        self.probe = probe if probe is not None and probe.is_configured else None
        self.sleep = sleep  # between health attempts
        # While restoring drifted files: the modes they were written with.
        self.modes: dict = {}
        # The secrets the apply under way resolved: never in what it reports or logs.
        self.secret_values: set = set()

    # --- commands ---------------------------------------------------------------

    def _run(self, name: str, command: str | None, number, staged: str | None = None, *,
             timeout_s: float | None = None, keep_output: bool = False) -> tuple:
        """(ok, why) of running `command`; with `keep_output`, (ok, the end of what
        it printed), a failure's exit status first."""
        timeout_s = self.commands.timeout_s if timeout_s is None else timeout_s
        if not command:
            return True, ""
        env = command_environment(self.environ, target_dir=self.target_dir, number=number,
                                  passthrough=self.commands.passthrough_env, staged=staged)
        if staged:
            command = command.replace(STAGED_PLACEHOLDER, shlex.quote(staged))
        process = None
        try:
            fs.make_directories(self.run_dir, fs.PRIVATE_DIRECTORY_MODE)
            # Its own process group, so a timeout or a stop ends the command and its
            # children; a stop signal while it starts waits until its pid is known.
            with stopping.deferred():
                process = subprocess.Popen(command, shell=True, cwd=self.run_dir, env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
            # Bytes, decoded leniently: a command may print anything (a binary answer,
            # another locale's message) and that must never break the apply.
            stdout, stderr = (references.redact(out.decode("utf-8", "replace"),
                                                self.secret_values)
                              for out in process.communicate(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return False, f"{name} timed out after {timeout_s:g}s"
        except OSError as exc:
            if process is None:
                return False, f"{name} could not start: {exc}"
            end_process_group(process, name)
            return False, f"{name} failed: {exc}"
        except BaseException as exc:  # stopping (SIGINT, SIGTERM): nothing it started
            if isinstance(exc, stopping.Stopped):  # survives
                exc.announce()
            if process is not None:
                end_process_group(process, name)
            raise
        if keep_output:
            printed = health.tail("\n".join(p.strip() for p in (stdout, stderr) if p.strip()))
            if process.returncode != 0:
                return False, f"exited {process.returncode}" + (f": {printed}" if printed
                                                                else "")
            return True, printed
        if process.returncode != 0:
            output = (stderr or stdout).strip().splitlines()
            detail = f": {output[-1]}" if output else ""
            return False, f"{name} exited {process.returncode}{detail}"
        return True, ""

    def _reload(self, number) -> tuple:
        ok, why = self._run("reload", self.commands.reload, number)
        if not ok and self.commands.start:
            logger.info("reload failed (%s); starting instead", why)
            return self._run("start", self.commands.start, number)
        return ok, why

    def _activate(self, number, *, validated: bool = False) -> tuple:
        if not validated:
            command = self.commands.validate
            # A command naming the staged tree checks the files in place here.
            ok, why = self._run("validate", command, number,
                                staged=self.target_dir if stages(command) else None)
            if not ok:
                return ok, why
        return self._reload(number)

    def _healthy(self, number) -> health.Health | None:
        """The health probe's result after a reload; None when none is configured."""
        if self.probe is None:
            return None

        def run_command(command, timeout_s):
            return self._run("probe", command, number, timeout_s=timeout_s,
                             keep_output=True)

        result = health.check(self.probe, run_command, self.sleep,
                              redact=lambda text, cut=False: references.redact(
                                  text, self.secret_values, cut=cut))
        (logger.info if result.ok else logger.warning)("#%s: %s", number, result.describe())
        return result

    # --- apply ------------------------------------------------------------------

    def apply(self, bundle: dict, state: State, record=None) -> Outcome:
        """Apply `bundle`. `record(state, outcome)` may add to the state (the report
        to send, the push id handled): it is saved in the same write as the result,
        so a crash can never keep one without the other. A state directory that
        cannot be written does not lose the outcome: it is returned (and reported)."""
        try:
            outcome = self._apply(bundle, state)
        except Exception as exc:  # a host fault or a bug no step expected: an outcome too
            logger.exception("applying #%s failed", bundle.get("number"))
            outcome = self._unexpected(bundle, state, exc)
        finally:
            self.secret_values = set()
        if record is not None:
            record(state, outcome)
        try:
            self.save(state)
        except OSError as exc:
            logger.error("cannot save the state (%s); the outcome is kept in memory", exc)
        return outcome

    def _unexpected(self, bundle: dict, state: State, exc: Exception) -> Outcome:
        """After an error no step expected: the files of the apply under way are put
        back (and reloaded), never left half-applied; the outcome says so."""
        number = bundle.get("number")
        why = references.redact(f"{type(exc).__name__}: {exc}"[:300], self.secret_values)
        if state.in_progress is None:
            return Outcome(FAILED, f"#{number}: {why}")
        not_restored = self._restore_interrupted(state)
        if not_restored:
            return Outcome(FAILED, f"#{number} failed ({why}); {not_restored}")
        if state.active_number is not None:
            self._reload(state.active_number)
        return Outcome(WARNING, f"#{number} failed ({why}); restored the previous files")

    def restore(self, bundle: dict, state: State, *, modes: dict) -> Outcome:
        """Apply the active snapshot's `bundle` again over hand-edited files (the
        restore drift policy), each file with the mode it was written with."""
        self.modes = modes
        try:
            return self.apply(bundle, state)
        finally:
            self.modes = {}

    def _written(self, bundle: dict, state: State, paths, receiving) -> None:
        """Record what a successful apply wrote, for drift checks: hashes and modes,
        the files that received a secret, and the bundle as sent (no secret in it)."""
        state.written = drift.written(self.target_dir, paths)
        state.secret_files = sorted(receiving)
        state.drift = []
        try:
            drift.keep_bundle(self.state_dir, bundle)
        except OSError as exc:
            logger.warning("cannot keep the applied bundle (%s): drift is reported "
                           "without line counts", exc)

    @staticmethod
    def _malformed(bundle) -> bool:
        def files_ok(entries):
            return isinstance(entries, list) and all(
                isinstance(e, dict) and isinstance(e.get("path"), str)
                and isinstance(e.get("content"), str) for e in entries)
        return not (isinstance(bundle.get("number"), int) and isinstance(bundle.get("checksum"),
                    str) and files_ok(bundle.get("files"))
                    and files_ok(bundle.get("fallback_files", [])))

    def _apply(self, bundle: dict, state: State) -> Outcome:
        if self._malformed(bundle):
            return Outcome(FAILED, "the bundle is malformed; nothing was written")
        number, checksum = bundle["number"], bundle["checksum"]
        try:
            # Every path this apply writes or removes is a plain relative path inside
            # the target: also the previous snapshot's (a directory replaced by a link
            # leaving it). Each write checks its path again where it writes it.
            for path in [e["path"] for e in bundle["files"] + bundle.get("fallback_files",
                                                                         [])] \
                    + list(state.managed_files):
                fs.inside(self.target_dir, path)
        except ValueError as exc:
            return Outcome(FAILED, f"#{number}: {exc}; nothing was written")
        if content_checksum(bundle["files"], bundle.get("secret_file_mode")) != checksum:
            return Outcome(FAILED, f"#{number}: the bundle's files do not match its checksum")
        if state.active_number is not None and number < state.active_number:
            return Outcome(FAILED, f"refusing #{number}: lower than the active "
                                   f"#{state.active_number}")
        try:
            secret_mode = references.secret_file_mode(bundle)
            entries, receiving, self.secret_values = references.resolve(
                bundle, self.environ, self.secret_allow)
        except (SecretError, ValueError) as exc:
            return Outcome(FAILED, f"#{number}: {exc}; nothing was written")
        pending = self._restore_interrupted(state)
        if pending:
            return Outcome(FAILED, f"#{number}: {pending}; nothing was written")

        new_paths = [e["path"] for e in entries]
        try:
            manifest = fs.backup(self.target_dir, new_paths + state.managed_files,
                                 self.backup_dir)
        except OSError as exc:
            return Outcome(FAILED, f"#{number}: backing up the current files to "
                                   f"{self.backup_dir} failed ({exc}); nothing was written")
        state.in_progress = {"number": number, "checksum": checksum, "manifest": manifest}
        try:
            self.save(state)
        except OSError as exc:
            state.in_progress = None  # never change files a crash could not undo
            return Outcome(FAILED, f"#{number}: recording the apply in the state directory "
                                   f"failed ({exc}); nothing was written")
        staged = None
        modes = dict.fromkeys(receiving, secret_mode)
        if stages(self.commands.validate):
            try:
                staged = self._stage(entries, modes)
                ok, why = self._run("validate", self.commands.validate, number,
                                    staged=staged)
            except (OSError, ValueError) as exc:
                self._drop_staging()
                return self._recover(bundle, state, f"staging failed: {exc}", touched=False)
            except BaseException:  # stopping: no staged tree is left behind
                self._drop_staging()
                raise
            if not ok:
                self._drop_staging()
                return self._recover(bundle, state, why, touched=False)
        try:
            # Stale files first: a new file may take the place of an old directory.
            for stale in sorted(set(state.managed_files) - set(new_paths)):
                fs.remove_file(fs.inside(self.target_dir, stale), self.target_dir)
            if staged:
                fs.swap_in(staged, self.target_dir, new_paths)
            else:
                for entry in entries:
                    self._write(entry, secret_mode=modes.get(entry["path"]))
        except (OSError, ValueError) as exc:
            logger.warning("#%s: writing failed: %s; restoring", number, exc)
            return self._recover(bundle, state, f"writing failed: {exc}")
        finally:
            if staged:
                self._drop_staging()
        ok, why = self._activate(number, validated=staged is not None)
        probed = self._healthy(number) if ok else None
        if probed is not None and not probed.ok:
            ok, why = False, probed.describe()
        reported = None if probed is None else probed.report()
        if ok:
            state.active_number, state.active_checksum = number, checksum
            state.active_label = bundle.get("label")
            state.managed_files = sorted(new_paths)
            self._written(bundle, state, new_paths, receiving)
            state.in_progress = None  # saved by apply(), with what record() adds
            healthy = ("" if probed is None else
                       f"; health {probed.probe} passed after {probed.attempts} attempt(s)")
            return Outcome(SUCCEEDED, f"applied #{number} ({len(entries)} file(s)){healthy}",
                           health=reported)
        logger.warning("#%s failed: %s; restoring", number, why)
        outcome = self._recover(bundle, state, why)
        outcome.health = reported
        return outcome

    # --- staging ------------------------------------------------------------------

    def _stage(self, entries, modes: dict) -> str:
        """Write the snapshot's files into a fresh staging directory on the target's
        filesystem, each with the mode it will have in place (`modes`: of the files
        receiving secrets); returns the directory."""
        self._drop_staging()
        staged = fs.make_staging(self.target_dir, self.temp_key)
        for entry in entries:
            self._write(entry, secret_mode=modes.get(entry["path"]), root=staged)
        return staged

    def _drop_staging(self) -> None:
        try:
            fs.remove_staging(self.target_dir, self.temp_key)
        except OSError as exc:
            logger.warning("cannot remove the staging directory: %s", exc)

    def _write(self, entry: dict, *, secret_mode: int | None = None,
               root: str | None = None) -> None:
        """Write one file (under `root`: staged), keeping the mode of the file it
        replaces in the target. A file holding a resolved secret gets `secret_mode`
        (0600, or what the environment declared), whatever the mode of the file it
        replaces. The path is checked inside the directory it is written to."""
        live = fs.inside(self.target_dir, entry["path"])
        try:  # the file itself: a link there is replaced, and lends no mode
            info = os.lstat(live)
            mode = info.st_mode & 0o7777 if stat.S_ISREG(info.st_mode) else 0o644
        except (FileNotFoundError, NotADirectoryError):
            mode = 0o644
        mode = self.modes.get(entry["path"], mode)
        if secret_mode is not None:
            mode = secret_mode
        if root is None:
            fs.write_atomic(live, entry["content"].encode("utf-8"), mode=mode)
        else:  # the staged tree stays private until its files are swapped in
            fs.write_atomic(fs.inside(root, entry["path"], "the staged directory"),
                            entry["content"].encode("utf-8"), mode=mode,
                            directory_mode=fs.PRIVATE_DIRECTORY_MODE)

    # --- failure ------------------------------------------------------------------

    def _recover(self, bundle: dict, state: State, why: str, *,
                 touched: bool = True) -> Outcome:
        """After a failure: put the previous files back (`touched`: the target was
        changed) and reload them; with nothing to restore, the safe fallback."""
        number = bundle["number"]
        manifest = state.in_progress["manifest"]
        if touched:
            try:
                fs.restore(self.target_dir, manifest, self.backup_dir)
            except (OSError, ValueError) as exc:
                # Kept in progress: the next apply (or start) restores before anything.
                return Outcome(FAILED, f"#{number} failed ({why}); restoring the previous "
                                       f"files failed too ({exc})")
        state.in_progress = None
        # Something was restored (a snapshot of ours, or files already on the host):
        # reload it. Only a host with nothing at all gets the safe fallback.
        if state.active_number is not None or manifest["existed"]:
            restored = (f"#{state.active_number}" if state.active_number is not None
                        else "the files that were there")
            if not touched:
                kept = f"#{state.active_number} stays" if state.active_number is not None \
                    else "the files that were there stay"
                return Outcome(WARNING, f"#{number} failed ({why}); nothing was changed, "
                                        f"{kept}")
            ok, reload_why = self._reload(state.active_number)
            if ok:
                return Outcome(WARNING, f"#{number} failed ({why}); restored {restored}")
            return Outcome(FAILED, f"#{number} failed ({why}); restored {restored} "
                                   f"but {reload_why}")
        return self._fallback(bundle, state, why)

    def _fallback(self, bundle: dict, state: State, why: str) -> Outcome:
        number = bundle["number"]
        fallback = bundle.get("fallback_files") or []
        if not fallback:
            return Outcome(FAILED, f"#{number} failed ({why}); nothing to restore and no "
                                   "fallback")
        try:
            for entry in fallback:
                self._write(entry)
        except (OSError, ValueError) as exc:
            return Outcome(FAILED, f"#{number} failed ({why}); writing the safe fallback "
                                   f"failed too ({exc})")
        state.managed_files = sorted(e["path"] for e in fallback)
        ok, fallback_why = self._activate(number)
        if ok:
            return Outcome(WARNING, f"#{number} failed ({why}); wrote the safe fallback")
        return Outcome(FAILED, f"#{number} failed ({why}); the safe fallback failed too "
                               f"({fallback_why})")

    def _restore_interrupted(self, state: State) -> str | None:
        """Put back the files of an apply that was interrupted or could not be
        undone; None when done (or nothing to do), else why it could not."""
        if state.in_progress is None:
            return None
        try:
            fs.restore(self.target_dir, state.in_progress["manifest"], self.backup_dir)
        except (OSError, ValueError) as exc:
            return (f"the files of the interrupted apply of #{state.in_progress['number']} "
                    f"could not be restored ({exc})")
        state.in_progress = None
        try:
            self.save(state)
        except OSError as exc:
            logger.error("cannot save the state (%s)", exc)
        return None

    def recover_interrupted(self, state: State) -> str | None:
        """After a crash mid-apply: put the old files back, so the host never runs a
        mix of old and new files; the next cycle applies the snapshot again. A host
        fault here is logged; the next apply tries again before changing anything."""
        try:
            staged = fs.remove_staging(self.target_dir, self.temp_key)
            removed = (fs.remove_temp_files(self.target_dir, self.temp_key)
                       if os.path.isdir(self.target_dir) else 0)
        except OSError as exc:
            return f"cannot remove leftover temp files: {exc}"
        if state.in_progress is None:
            if staged or removed:
                return (f"removed {removed} leftover temp file(s)"
                        f"{' and an unvalidated staged snapshot' if staged else ''}")
            return None
        number = state.in_progress["number"]
        pending = self._restore_interrupted(state)
        if pending:
            return pending
        if state.active_number is not None:
            self._reload(state.active_number)
        return (f"an apply of #{number} was interrupted; "
                f"{'removed an unvalidated staged snapshot and ' if staged else ''}"
                "restored the previous files")
