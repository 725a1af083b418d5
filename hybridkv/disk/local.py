"""Local-disk backend: one file per blob under ``root``; publish = temp, fsync, rename, fsync dir.

Only regular files are blobs.  A FIFO, device, symlink or directory under a blob's name is
never opened for reading in a blocking way (lstat first, then O_NOFOLLOW | O_NONBLOCK and an
fstat of what was opened), never followed, never replaced and never deleted: reads, sizes
and removals of it raise NotRegular, and listings leave it out and count it.

All file-system calls go through a ``FileOps`` object so the fault matrix can inject EIO,
ENOSPC or a crash before rename by passing a subclass -- no global patching.
"""
import errno
import os
import secrets
import stat
import threading
import time

from hybridkv.disk.backend import NotRegular

TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


def _kind(mode):
    for test, what in ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return what
    return "special file"


def require_regular(st, name):
    """``st`` (an os.stat_result) when it is a regular file, else NotRegular."""
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(name, _kind(st.st_mode))
    return st


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

    def scandir(self, path):
        """[(name, is a regular file)] without following symlinks."""
        with os.scandir(path) as it:
            return [(d.name, d.is_file(follow_symlinks=False)) for d in it]

    def lstat(self, path):
        return os.lstat(path)

    def fstat(self, fd):
        return os.fstat(fd)


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
        self._check_replaceable(dst, name)
        fd = self.ops.open(tmp, TEMP_FLAGS)
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

    def _check_replaceable(self, path, name):
        """A rename may replace a regular file (ours) or nothing, never anything else."""
        try:
            require_regular(self.ops.lstat(path), name)
        except FileNotFoundError:
            pass

    def open_read(self, name):
        path = self._path(name)
        require_regular(self.ops.lstat(path), name)      # a FIFO or device is never opened
        try:
            fd = self.ops.open(path, READ_FLAGS)
        except OSError as e:
            if e.errno == errno.ELOOP:                   # swapped for a symlink meanwhile
                raise NotRegular(name, "symlink") from None
            raise
        try:
            require_regular(self.ops.fstat(fd), name)    # swapped for a FIFO meanwhile
        except BaseException:
            self.ops.close(fd)
            raise
        return _LocalReader(self.ops, fd)

    def size(self, name):
        return require_regular(self.ops.lstat(self._path(name)), name).st_size

    def list_blobs(self):
        """(names of regular files, how many other entries were left out); dot-files
        (temp files) are neither."""
        entries = [(n, reg) for n, reg in self.ops.scandir(self.root) if not n.startswith(".")]
        return [n for n, reg in entries if reg], sum(not reg for _, reg in entries)

    def names(self):
        return self.list_blobs()[0]

    def remove(self, name):
        path = self._path(name)
        try:
            require_regular(self.ops.lstat(path), name)
            self.ops.unlink(path)
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
                st = self.ops.lstat(path)
                old = now - st.st_mtime > STALE_TEMP_S
                if stat.S_ISREG(st.st_mode) and (pid <= 0 or not _pid_alive(pid) or old):
                    self.ops.unlink(path)
                    n += 1
            except FileNotFoundError:
                pass
        return n
