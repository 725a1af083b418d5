"""Local-disk backend: one file per blob under ``root``; publish = temp, fsync, rename, fsync dir.

All file-system calls go through a ``FileOps`` object so the fault matrix can inject EIO,
ENOSPC or a crash before rename by passing a subclass -- no global patching.
"""
import errno
import os
import secrets
import threading
import time

TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0


class FileOps:
    """Thin, overridable wrappers over the os calls the backend uses."""

    def open(self, path, flags, mode=0o644):
        return os.open(path, flags, mode)

    def write(self, fd, mv):
        return os.write(fd, mv)

    def fsync(self, fd):
        os.fsync(fd)

    def close(self, fd):
        os.close(fd)

    def replace(self, src, dst):
        os.replace(src, dst)

    def pread_into(self, fd, buf, offset):
        return os.preadv(fd, [buf], offset)

    def fsync_dir(self, path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path):
        os.unlink(path)

    def listdir(self, path):
        return os.listdir(path)

    def size(self, path):
        return os.stat(path).st_size


class _LocalReader:
    """Reads one inode: a rename over the name meanwhile does not mix two versions."""

    def __init__(self, ops, fd):
        self.ops, self.fd = ops, fd

    def read_into(self, offset, buf):
        got, mv = 0, memoryview(buf).cast("B")
        while got < len(mv):
            n = self.ops.pread_into(self.fd, mv[got:], offset + got)
            if n == 0:
                break
            got += n
        return got

    def close(self):
        self.ops.close(self.fd)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalBackend:
    """Blobs as files in one directory.  Names are checked by the tier (hex only); the
    backend additionally refuses path separators and dot-files as a second fence."""
    shared = True   # other processes on this host may publish into the same directory

    def __init__(self, root, ops=None):
        self.root = os.path.abspath(root)
        self.ops = ops or FileOps()
        os.makedirs(self.root, exist_ok=True)

    def _path(self, name):
        if not name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
            raise OSError(errno.EINVAL, "bad blob name", name)
        return os.path.join(self.root, name)

    def put(self, name, parts):
        dst = self._path(name)
        tmp = os.path.join(self.root, f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-"
                                      f"{secrets.token_hex(4)}")
        fd = self.ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        published = False
        try:
            try:
                for part in parts:
                    mv = memoryview(part).cast("B")
                    while len(mv):
                        n = self.ops.write(fd, mv)
                        if n <= 0:
                            raise OSError(errno.EIO, "short write", tmp)
                        mv = mv[n:]
                self.ops.fsync(fd)
            finally:
                self.ops.close(fd)
            self.ops.replace(tmp, dst)
            published = True
            self.ops.fsync_dir(self.root)
        finally:
            if not published:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def open_read(self, name):
        return _LocalReader(self.ops, self.ops.open(self._path(name), os.O_RDONLY))

    def size(self, name):
        return self.ops.size(self._path(name))

    def names(self):
        return [n for n in self.ops.listdir(self.root) if not n.startswith(".")]

    def remove(self, name):
        try:
            self.ops.unlink(self._path(name))
        except FileNotFoundError:
            pass

    def sweep_temp(self):
        """Remove temp files of dead writers (pid gone) or older than STALE_TEMP_S."""
        n, now = 0, time.time()
        for f in self.ops.listdir(self.root):
            if not f.startswith(TEMP_PREFIX):
                continue
            path = os.path.join(self.root, f)
            try:
                pid = int(f[len(TEMP_PREFIX):].split("-")[0])
            except ValueError:
                pid = -1
            try:
                old = now - os.stat(path).st_mtime > STALE_TEMP_S
                if pid <= 0 or not _pid_alive(pid) or old:
                    self.ops.unlink(path)
                    n += 1
            except FileNotFoundError:
                pass
        return n

    def path_of(self, name):
        """Absolute path of a blob (tests and the fault matrix damage files through it)."""
        return self._path(name)
