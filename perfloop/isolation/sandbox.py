"""Confining a process that runs kernel code, with Linux's Landlock (kernel 5.13 and later).

`confine(write, read)` restricts the calling process, and every process it starts, for good:
files may be written, created, removed or renamed only beneath the `write` folders, and, when
`read` is given, read or executed only beneath those and the `read` folders. Nothing the
process does afterwards lifts it. perfloop applies it first thing in each child that runs
kernel code (perfloop/child/bootstrap.py), from what the parent names in PERFLOOP_CONFINE: the
child's own work folder and caches for writes; the Python environment, the system, the
kernel's folder and perfloop for reads. So kernel code cannot rewrite the record, the table,
the run's state, git's refs or hooks, perfloop's own files or another child's work, and cannot
import code from places no experiment commits.

From Landlock's ABI 6 on, a confined process also cannot signal a process outside its
sandbox (another launcher, the timer: no SIGSTOP of the incumbent's launcher). Landlock is
called through its three system calls with ctypes: Python has no released binding
(the `landlock` package on PyPI is an alpha, 1.0.0.dev). Where the kernel has no Landlock (or a
container's seccomp forbids it), `confine` does nothing and says so; the record names which.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every arch
_VERSION = 1 << 0            # landlock_create_ruleset flag: ask for the ABI version
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14   # ABI 2, ABI 3

READS = EXECUTE | READ_FILE | READ_DIR


class _Ruleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


# ABI 6: no signal to, and no abstract unix socket of, a process outside this sandbox (another
# launcher, the timer, perfloop)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """Landlock's ABI version here, 0 where there is none."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(version), 0)


def _writes(version: int) -> int:
    out = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK
           | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM)
    if version >= 2:
        out |= REFER
    if version >= 3:
        out |= TRUNCATE
    return out


def confine(write: list[str], read: list[str] | None = None, devices: list[str] | tuple[str, ...] = ()) -> str:
    """Restrict this process (see the module's text); returns what was done, in a few words.
    `devices`: files (and folders of files) that may be opened for writing, but nothing made,
    removed or truncated there; with them, files in SHARED_MEMORY may be opened for writing
    and removed, not made. Nothing else of the repository may even be listed: a launcher that
    listed its folders watched the timer's progress file grow."""
    version = abi()
    if version < 1:
        return "none: this kernel has no Landlock (writes and reads are not confined)"
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    writes = _writes(version)
    handled = writes | (READS if read is not None else 0)
    attr = _Ruleset(handled, 0, _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET if version >= 6 else 0)
    size = ctypes.sizeof(attr) if version >= 6 else ctypes.sizeof(ctypes.c_uint64)
    fd = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if fd < 0:
        return f"none: landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        # its own /proc entry too: CUDA's driver writes there when it makes a context (on an
        # H100 under Landlock ABI 7, cudaGetDeviceCount failed with error 304 without it)
        for path in [*write, f"/proc/{os.getpid()}"]:
            _allow(libc, fd, path, writes | (READS if read is not None else 0))
        for path in devices:
            _allow(libc, fd, path, WRITE_FILE)
        if devices:
            _allow(libc, fd, SHARED_MEMORY, WRITE_FILE | REMOVE_FILE)
        for path in read or ():
            _allow(libc, fd, path, READS)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return "none: prctl(PR_SET_NO_NEW_PRIVS) failed"
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return f"none: landlock_restrict_self failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    kind = "writes and reads" if read is not None else "writes"
    scoped = ", signals scoped" if version >= 6 else ""
    return f"landlock ABI {version}: {kind} confined{scoped}"


_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> bool:
    """Give up every capability, for good (bounding set, ambient, effective and permitted):
    a process running as root then reads no other process's /proc entries whose owner holds
    more (the timer's environment), raises no priority and no limit (its own or the timer's),
    and regains none by executing a program. Returns whether it held any."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    data = (_CapData * 2)()
    header = _CapHeader(_CAP_VERSION_3, 0)
    held = libc.capget(ctypes.byref(header), data) == 0 and any(
        d.effective or d.permitted for d in data)
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):   # (refused without CAP_SETPCAP: then none was held)
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), (_CapData * 2)())
    return held


def _allow(libc, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # (a folder that is not there needs no rule)
    try:
        if not os.path.isdir(path):
            access &= WRITE_FILE | READ_FILE | EXECUTE | TRUNCATE  # rights a file can hold
        rule = _PathBeneath(access, fd)
        libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_PATH_BENEATH),
                     ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(fd)


ENV = "PERFLOOP_CONFINE"
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys",
          "/dev", "/run", "/var/lib")
# What a child may open for writing in /dev: the null devices, CUDA's device files, and the
# shared memory the timer and torch make in /dev/shm (slots, CUDA IPC reference counts), where
# it may also remove a file (torch unlinks one whose last user it is), never make one: a
# module made there could be imported, and would outlive the experiment.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
SHARED_MEMORY = "/dev/shm"


def device_files() -> list[str]:
    """The files beneath /dev a child may open for writing here: DEVICES and NVIDIA's."""
    import glob

    return [*DEVICES, *sorted(glob.glob("/dev/nvidia*"))]


def environment_reads(root) -> list[str]:
    """What any perfloop child must read besides its own folders: the system, the Python
    environment, the folders on sys.path and PATH outside the repository, and perfloop's own
    package. Nothing of the repository: a judge runs from the run's pinned tree."""
    import site

    root = os.path.realpath(str(root))
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    places = [*SYSTEM, sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
              site.getusersitepackages(), os.path.dirname(os.path.dirname(__file__)), *path]
    # a toolchain's bin/ on PATH needs its prefix (tileiras reads the lib/ and nvvm/ beside
    # it), unless that prefix is the root, a home or a top-level folder
    homes = {os.path.realpath(os.path.expanduser("~")), "/root", "/home"}
    prefixes = {os.path.realpath(os.path.dirname(p.rstrip(os.sep))) for p in path
                if os.path.basename(p.rstrip(os.sep)) == "bin"}
    places += [p for p in prefixes if p.count(os.sep) >= 2 and p not in homes
               and not (p + os.sep).startswith(root + os.sep) and not root.startswith(p + os.sep)]
    places += [p for p in sys.path if p and os.path.isdir(p)
               and not (os.path.realpath(p) + os.sep).startswith(root + os.sep)]
    return sorted({os.path.realpath(p) for p in places if p})


# What a child gets of the environment perfloop was started in: what Python, PyTorch, CUDA and
# the compilers need (names, and prefixes), and the rules' [limits] pass_env; never the rest,
# where a user keeps tokens and keys (a launcher read them in the timer's environment).
PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL",
          "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS",
          "VIRTUAL_ENV", "CONDA_PREFIX", "SOURCE_DATE_EPOCH")
PASSED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "CUDNN_", "CUBLAS",
                   "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "CUTILE_", "OMP_", "MKL_",
                   "OPENBLAS_", "KMP_", "GOMP_", "XDG_", "PERFLOOP_")


def passed_environment(env: dict, extra: tuple = ()) -> dict:
    """The variables of `env` a child gets: PASSED, PASSED_PREFIXES and `extra` (names or
    fnmatch patterns)."""
    import fnmatch

    return {k: v for k, v in env.items()
            if k in PASSED or k.startswith(PASSED_PREFIXES)
            or any(fnmatch.fnmatchcase(k, pattern) for pattern in extra)}


def linked_cache(folder, shared) -> str:
    """The compile cache of a child working in `folder` that shares `shared` (its code's
    cache, which warmers fill for the timer's launchers): at the same place in its folder as
    any other child's, <folder>/cache/cutile, so no variable of its environment tells a timed
    launch from a judged one; a link to `shared`, where it writes (Landlock follows it)."""
    os.makedirs(shared, exist_ok=True)
    cache = os.path.join(os.path.realpath(str(folder)), "cache")
    os.makedirs(cache, exist_ok=True)
    link = os.path.join(cache, "cutile")
    os.symlink(os.path.realpath(str(shared)), link)
    return link


def child_environment(env: dict, folder, *, reads: list, root, confined: bool = True) -> dict:
    """`env` for a child that runs kernel code, working in `folder` (made here): its
    temporary files and caches there, and, when `confined`, PERFLOOP_CONFINE naming `folder`
    for writes (and device_files(), for opening only), and `reads` besides the environment
    for reads."""

    folder = os.path.realpath(str(folder))
    for sub in ("tmp", "cache"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    out = dict(env)
    tmp, cache = os.path.join(folder, "tmp"), os.path.join(folder, "cache")
    out.update(TMPDIR=tmp, CUDA_TILE_TEMP_DIR=tmp, XDG_CACHE_HOME=cache,
               TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
               CUDA_CACHE_PATH=os.path.join(cache, "nv"), PYTHONDONTWRITEBYTECODE="1",
               # torch.compile in the child itself: no pool of compile workers beside it
               TORCHINDUCTOR_COMPILE_THREADS="1")
    out.setdefault("CUDA_TILE_CACHE_DIR", os.path.join(cache, "cutile"))
    if confined:
        out[ENV] = json.dumps({"write": [folder, out["CUDA_TILE_CACHE_DIR"]],
                               "devices": device_files(),
                               "read": [*environment_reads(root), *map(str, reads)]})
    return out


def apply_from_environ() -> str:
    """In a child, first thing: confine it as PERFLOOP_CONFINE says, and give up every
    capability unless it says to keep them (then forget the variable, so kernel code does not
    see it); "" when there is none."""

    raw = os.environ.pop(ENV, None)
    if not raw:
        return ""
    wanted = json.loads(raw)
    said = confine(wanted["write"], wanted.get("read"), wanted.get("devices", ()))
    if not wanted.get("keep_capabilities") and drop_capabilities():
        said += "; capabilities dropped"
    return said


@dataclass(frozen=True)
class Confinement:
    """How children that run kernel code are confined: `mode` is the rules' [limits] confine;
    `reads` what they may read besides the environment."""

    mode: str = "off"
    reads: tuple = ()


def confinement_for(mode: str, *reads) -> Confinement:
    """Children that run kernel code may read `reads` (the run's pinned tree, the exports of
    commits they run) and nothing else of the repository: not the working tree, where a file
    no commit holds could be read and later changed, nor the run's work folder, where the
    trusted processes keep their files (a kernel that read the timer's progress file knew
    when the judge's cases were replayed: tests/e2e/test_adversarial.py)."""
    for place in reads:
        os.makedirs(place, exist_ok=True)   # (Landlock grants folders that exist)
    return Confinement(mode, tuple(str(p) for p in reads))


def kernel_env(env: dict, folder, root, confinement: Confinement,
               keep_capabilities: bool = False) -> dict:
    """The environment of a child that runs kernel code in `folder`: its temporary files and
    caches there, and, unless confinement is off, writes only there (and reads only the
    environment and `confinement.reads`, for "read-write"), without capabilities unless
    `keep_capabilities` (a profiler's target, whose counters may need them)."""
    reads = None if confinement.mode != "read-write" else [*confinement.reads, folder]
    out = child_environment(env, folder, reads=reads or [], root=root,
                            confined=confinement.mode != "off")
    if confinement.mode != "off":
        wanted = json.loads(out[ENV])
        if confinement.mode == "write":  # writes confined, reads not
            wanted = {"write": wanted["write"], "devices": wanted["devices"]}
        out[ENV] = json.dumps({**wanted, "keep_capabilities": keep_capabilities})
    return out
