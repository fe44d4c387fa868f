"""Exceptions of dcp.

Every failure the engine reports for a save, load or metadata read raises a
CheckpointException (the seed's exception), so `except CheckpointException`
catches them all. The class raised is a subclass chosen by the status code,
which also derives from the matching Python built-in, so code written for
plain Python errors keeps working:

  INVALID_ARGUMENT, OUT_OF_RANGE  CheckpointValueError      (ValueError)
  NOT_FOUND                       CheckpointNotFoundError   (LookupError)
                                  for a key a load asks for;
                                  CheckpointFileNotFoundError
                                  (FileNotFoundError) when the checkpoint
                                  itself is missing (a load of a file
                                  rather than a directory too) and for a
                                  save's directory that cannot be made
  ALREADY_EXISTS                  CheckpointExistsError     (FileExistsError)
  PERMISSION_DENIED               CheckpointPermissionError (PermissionError)
  DEADLINE_EXCEEDED               CheckpointTimeoutError    (TimeoutError)
  UNIMPLEMENTED                   CheckpointNotImplementedError
                                  (NotImplementedError)
  RESOURCE_EXHAUSTED              CheckpointResourceError   (OSError)
                                  the disk is full (ENOSPC, EDQUOT, EFBIG)
                                  or memory ran out; .errno is set when the
                                  message names the cause
  DATA_LOSS                       CheckpointCorruptError
  FAILED_PRECONDITION             CheckpointNotADirectoryError
                                  (NotADirectoryError) for a save whose
                                  path has a file where a directory goes
  anything else                   CheckpointException

Engine messages name options as Python passes them (`overwrite=True`,
`FileSystemWriter(thread_count=...)` rather than the C structs' fields).

A distributed save or load that fails on any rank raises on every rank
(dcp.process_group agree); where the first failing rank's exception was
a standard built-in the class by code is not (a TypeError for a value
that cannot be saved is INVALID_ARGUMENT, CheckpointValueError), the
class raised also derives from that built-in (also_builtin), so
`except TypeError` catches it as in one process.

`.code` is the dcp status code (absl::StatusCode's number), `.code_name` its
name, and `.failures` maps each failing rank to (exception, StackSummary) as
in the seed; the StackSummary is empty for a failure inside the engine (no
Python frames). A failure of this process alone (a single-process save, or
a local error the engine did not share with other ranks) has one entry,
{rank: (an exception of the same class, code and message, StackSummary())}
with this process's rank in the operation's group (0 without a group, as
the seed's no_dist); that exception has no failures of its own, so the
whole stays picklable.

A directory written by torch.distributed.checkpoint (its .metadata is a
Python pickle) raises CheckpointNotImplementedError saying so (see
foreign_checkpoint_error), not CheckpointCorruptError.

Errors found in Python before the engine is called (an object that cannot
be saved without allow_pickle, a key that is not a str or int) raise plain
TypeError/ValueError naming the key; neither checkpoint_id nor a storage
object (or an empty checkpoint_id) raises CheckpointIdMissingError (a
ValueError and, as the seed's error, a RuntimeError). A path that is not
a str, bytes or os.PathLike raises TypeError naming the argument; one
holding a NUL byte, which the C library would cut there, raises
CheckpointValueError (a ValueError, as os functions raise) naming it
(checked_path).
"""

from __future__ import annotations

import builtins
import errno
import os
import re
import sys
import traceback

from . import _lib

__all__ = [
    "CheckpointException", "CheckpointValueError", "CheckpointNotFoundError",
    "CheckpointFileNotFoundError", "CheckpointExistsError",
    "CheckpointPermissionError", "CheckpointTimeoutError",
    "CheckpointNotImplementedError", "CheckpointCorruptError",
    "CheckpointNotADirectoryError", "CheckpointIdMissingError",
    "CheckpointResourceError",
]

_CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


def _torchs_checkpoint_exception():
    """torch.distributed.checkpoint's CheckpointException class when the
    program has imported that package (a program that names the class in
    an except clause has), else None. Looked up, never imported: importing
    torch's checkpoint package takes about half a second."""
    api = sys.modules.get("torch.distributed.checkpoint.api")
    found = getattr(api, "CheckpointException", None)
    return found if isinstance(found, type) and \
        issubclass(found, BaseException) else None


def _adopt_torchs_class() -> None:
    """Once the program has imported torch.distributed.checkpoint: makes
    CheckpointException (so every dcp exception class) also derive from
    torch's CheckpointException, by giving it a second base. Every dcp
    exception, made before or after, is then an instance of torch's class
    too; classes stay the same objects."""
    global _adopted
    if _adopted:
        return
    torchs = _torchs_checkpoint_exception()
    if torchs is None:
        return
    if not issubclass(CheckpointException, torchs):
        try:
            CheckpointException.__bases__ = (Exception, torchs)
        except TypeError:
            # No order of the classes fits (a class of the program's that
            # derives from torch's and then dcp's): tried again next time.
            return
    _adopted = True


_adopted = False


class CheckpointException(Exception):
    """A save, load or metadata read failed.

    Seed signature: CheckpointException(msg, failures). `failures` maps a
    rank to (exception, traceback.StackSummary).

    In a program that has imported torch.distributed.checkpoint, dcp's
    exceptions are also instances of torch's CheckpointException (this
    class gains it as a second base when the first dcp exception is made
    after that import), so `except
    torch.distributed.checkpoint.CheckpointException` catches dcp's
    failures as it catches torch's; `except Exception` still does.
    """

    def __init__(self, msg: str, failures=None, code: int = _lib.UNKNOWN):
        _adopt_torchs_class()
        super().__init__(msg)
        self.msg = msg
        self.failures = dict(failures or {})
        self.code = code

    # (A property, as torch's class has one of this name without a setter.)
    @property
    def failures(self) -> dict:
        return self._failures

    @failures.setter
    def failures(self, value) -> None:
        self._failures = value

    @property
    def code_name(self) -> str:
        return _CODE_NAMES.get(self.code, "UNKNOWN_CODE")

    def __str__(self) -> str:
        return self.msg

    def __reduce__(self):  # Pickles across processes (PROCESS writer).
        mixed = type(self).__dict__.get("_dcp_also")
        if mixed is not None:  # an also_builtin class: rebuilt by parts
            return (_rebuild_also, (*mixed, self.msg, self.failures,
                                    self.code))
        return (_rebuild, (type(self), self.msg, self.failures, self.code))


def _rebuild(cls, msg, failures, code):
    return cls(msg, failures, code)


def _rebuild_also(cls, extra, msg, failures, code):
    return also_builtin(cls, extra)(msg, failures, code)


class CheckpointValueError(CheckpointException, ValueError):
    """INVALID_ARGUMENT or OUT_OF_RANGE: a shape, dtype or kind differs from
    the checkpoint's, a bad option, an unsupported tensor."""


class CheckpointNotFoundError(CheckpointException, LookupError):
    """NOT_FOUND: a key the state dict asks for is not in the checkpoint."""


class CheckpointFileNotFoundError(CheckpointNotFoundError, FileNotFoundError):
    """NOT_FOUND: there is no checkpoint at checkpoint_id (a load), or its
    directory cannot be made (a save)."""


class CheckpointExistsError(CheckpointException, FileExistsError):
    """ALREADY_EXISTS: a checkpoint is there and overwrite=False."""


class CheckpointPermissionError(CheckpointException, PermissionError):
    """PERMISSION_DENIED."""


class CheckpointTimeoutError(CheckpointException, TimeoutError):
    """DEADLINE_EXCEEDED: a peer or the store did not answer in time."""


# strerror texts of the causes of RESOURCE_EXHAUSTED, as the engine's
# messages end (absl's ErrnoToStatus appends strerror).
_RESOURCE_ERRNOS = tuple((os.strerror(e), e) for e in (
    errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM))


class CheckpointResourceError(CheckpointException, OSError):
    """RESOURCE_EXHAUSTED: the disk is full (or a quota or file-size limit
    was reached) or memory ran out; nothing was committed. An OSError, as
    Python's own writes raise; `.errno` is ENOSPC, EDQUOT, EFBIG or ENOMEM
    when the message names that cause, else None. `.strerror` is the
    message."""

    def __init__(self, msg: str, failures=None, code: int = _lib.UNKNOWN):
        super().__init__(msg, failures, code)
        self.strerror = msg
        self.errno = next((e for text, e in _RESOURCE_ERRNOS
                           if text in (msg or "")), None)


class CheckpointNotImplementedError(CheckpointException, NotImplementedError):
    """UNIMPLEMENTED."""


class CheckpointCorruptError(CheckpointException):
    """DATA_LOSS: checksum mismatch, truncated or undecodable data; the
    message names the file."""


class CheckpointCorruptValueError(CheckpointCorruptError, ValueError):
    """DATA_LOSS of a saved plain value that cannot be decoded (a damaged
    marked value, a string that is not UTF-8, a failing unpickle); the
    message names the key. Also a ValueError."""


class CheckpointNotADirectoryError(CheckpointException, NotADirectoryError):
    """FAILED_PRECONDITION: a save's checkpoint_id, or a directory above
    it, is a file."""


_BY_CODE = {
    _lib.INVALID_ARGUMENT: CheckpointValueError,
    _lib.OUT_OF_RANGE: CheckpointValueError,
    _lib.NOT_FOUND: CheckpointNotFoundError,
    _lib.ALREADY_EXISTS: CheckpointExistsError,
    _lib.PERMISSION_DENIED: CheckpointPermissionError,
    _lib.DEADLINE_EXCEEDED: CheckpointTimeoutError,
    _lib.UNIMPLEMENTED: CheckpointNotImplementedError,
    _lib.DATA_LOSS: CheckpointCorruptError,
    _lib.RESOURCE_EXHAUSTED: CheckpointResourceError,
}


def exception_class(code: int) -> type[CheckpointException]:
    return _BY_CODE.get(code, CheckpointException)


def _is_standard_builtin(cls) -> bool:
    """Whether `cls` is one of Python's built-in exception classes (not
    Exception itself, nor BaseException-only ones like KeyboardInterrupt)."""
    return isinstance(cls, type) and issubclass(cls, Exception) and \
        cls is not Exception and \
        getattr(builtins, cls.__name__, None) is cls


def builtin_bases(exc_type) -> tuple[type, ...]:
    """The standard built-in exception classes `exc_type` (a class or an
    exception) derives from, the most derived only, in MRO order: (TypeError,)
    for TypeError or a subclass; () for none but Exception."""
    if not isinstance(exc_type, type):
        exc_type = type(exc_type)
    found = [c for c in exc_type.__mro__ if _is_standard_builtin(c)]
    return tuple(c for c in found
                 if not any(d is not c and issubclass(d, c) for d in found))


def builtin_names(error) -> str:
    """builtin_bases(error) as text ("TypeError", "LookupError,
    FileNotFoundError"), what a rank tells the others (builtins_named)."""
    return ",".join(c.__name__ for c in builtin_bases(error))


def builtins_named(text) -> tuple[type, ...]:
    """The standard built-in exception classes named in `text` (from
    builtin_names; unknown names are skipped)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    named = (getattr(builtins, n.strip(), None) for n in text.split(","))
    return tuple(c for c in named if _is_standard_builtin(c))


# A message of a rank's Python error as agree passes it: "TypeError: ...",
# possibly after the engine's "rank N: ".
_TYPE_PREFIX = re.compile(r"^(?:rank \d+: )?([A-Za-z_]\w*): ")


def builtins_of_message(message: str) -> tuple[type, ...]:
    """The built-in exception class a rank's "Name: text" failure message
    names (as agree sends a Python error through the engine), or ()."""
    m = _TYPE_PREFIX.match(message or "")
    return builtins_named(m.group(1)) if m else ()


_also_classes: dict = {}


def also_builtin(cls: type[CheckpointException], extra
                 ) -> type[CheckpointException]:
    """`cls`, or a subclass of it that also derives from each built-in
    exception class in `extra` that `cls` does not (so a rank's TypeError,
    agreed on every rank as CheckpointValueError by its code, is still a
    TypeError). Same name, message, `.code` and `.failures`; one class per
    combination (pickled by parts); `cls` where Python cannot combine
    them (instance layouts that conflict, a constructor of other
    arguments)."""
    extra = tuple(c for c in extra if _is_standard_builtin(c) and
                  not issubclass(cls, c))
    if not extra:
        return cls
    for known in (CheckpointFileNotFoundError, CheckpointNotADirectoryError):
        # dcp's own class of both (NOT_FOUND and a FileNotFoundError)
        if issubclass(known, cls) and all(issubclass(known, c)
                                          for c in extra):
            return known
    key = (cls, extra)
    mixed = _also_classes.get(key)
    if mixed is None:
        try:
            mixed = type(cls.__name__, (cls, *extra), {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__, "_dcp_also": (cls, extra)})
            mixed("probe", None, _lib.UNKNOWN)
        except Exception:  # noqa: BLE001 - any failure: the class by code
            mixed = cls
        _also_classes[key] = mixed
    return mixed


# An engine option in a message, spelled as C and C++ set it.
_C_OPTION = re.compile(
    r"(?<![\w:])(overwrite|flatten_state_dict|use_collectives|no_dist)"
    r"=(true|false)\b")

# The C options structs, by what Python passes them to (storage classes'
# constructors; "" for save/load's own keywords).
_C_STRUCTS = {
    "dcp_fs_writer_options_t": "FileSystemWriter",
    "dcp_fs_reader_options_t": "FileSystemReader",
    "dcp_hf_writer_options_t": "HuggingFaceStorageWriter",
    "dcp_hf_reader_options_t": "HuggingFaceStorageReader",
    "dcp_hf_quantized_reader_options_t": "QuantizedHuggingFaceStorageReader",
    "dcp_mega_writer_options_t": "MegaStorageWriter",
    "dcp_mega_reader_options_t": "MegaStorageReader",
    "dcp_process_group_options_t": "ProcessGroup",
    "dcp_save_options_t": "",
    "dcp_load_options_t": "",
}
# A field of one, and the value the engine says it has ("... is 5000;").
_C_FIELD = re.compile(
    r"\b(" + "|".join(_C_STRUCTS) + r")\.(\w+)(?: is (-?\d+);)?")


def _python_field(m) -> str:
    owner, field, value = _C_STRUCTS[m.group(1)], m.group(2), m.group(3)
    if value is not None:
        return f"{owner}({field}={value}):" if owner else \
            f"{field}={value}:"
    return f"{owner}({field}=...)" if owner else field


def python_spelling(message: str) -> str:
    """`message` with the engine's options spelled as Python passes them
    (`overwrite=True`, not `overwrite=true`; `FileSystemWriter(
    thread_count=5000): it must be at most 1024`, not
    `dcp_fs_writer_options_t.thread_count is 5000; it must be ...`)."""
    message = _C_FIELD.sub(_python_field, message)
    return _C_OPTION.sub(
        lambda m: f"{m.group(1)}={m.group(2).capitalize()}", message)


def checked_path(path, argument: str = "checkpoint_id") -> str:
    """`path` (a str, bytes or os.PathLike; bytes decoded as os.fsdecode
    does) as the str the C library gets. TypeError naming `argument` for
    another type; CheckpointValueError (INVALID_ARGUMENT, a ValueError as
    os functions raise) for an embedded NUL byte, where C would cut the
    path, and a save would then replace another checkpoint."""
    try:
        text = os.fsdecode(path)
    except TypeError:
        raise TypeError(
            f"{argument} must be a str, bytes or os.PathLike path, not "
            f"{type(path).__name__}") from None
    if "\0" in text:
        raise from_status(
            _lib.INVALID_ARGUMENT,
            f"{argument} {text!r} contains an embedded null byte",
            cls=CheckpointValueError)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # (bytes that are not UTF-8 decode to lone surrogates)
        raise from_status(
            _lib.INVALID_ARGUMENT,
            f"{argument} {text!r} is not valid UTF-8, which a checkpoint "
            "records its path in", cls=CheckpointValueError) from None
    return text


def from_status(code: int, message: str, rank_failures=(),
                what: str | None = None, *, rank: int = 0,
                cls: type[CheckpointException] | None = None,
                not_found: type[CheckpointException] | None = None
                ) -> CheckpointException:
    """The exception for a failed C call: `rank_failures` is
    [(rank, code, message)] from dcp_last_error_rank_failure. When it is
    empty (the failure of this process alone) `.failures` is {rank: (an
    exception of the same class and message, StackSummary())}; `rank` is
    this process's rank in the operation's group (0: none). `cls`: the
    class to raise (default: exception_class(code)); `not_found`: the
    class of NOT_FOUND, the raised one's and each rank's, where the
    operation makes its meaning plain (a save looks up no key). Messages
    get python_spelling."""
    def class_of(c):
        if c == _lib.NOT_FOUND and not_found is not None:
            return not_found
        return exception_class(c)
    cls = cls or class_of(code)
    failures = {}
    for r, rcode, rmsg in rank_failures:
        rmsg = python_spelling(rmsg)
        failures[r] = (class_of(rcode)(rmsg, None, rcode),
                       traceback.StackSummary())
    msg = python_spelling(f"{what}: {message}" if what else message)
    if not failures:
        failures[rank] = (cls(msg, None, code), traceback.StackSummary())
    return cls(msg, failures, code)


class CheckpointIdMissingError(ValueError, RuntimeError):
    """save/load were given neither checkpoint_id nor a storage object.
    A ValueError (dcp's earlier contract) and a RuntimeError (the seed's
    "`checkpoint_id` must be specified ..." error); raised before the
    engine is called, so not a CheckpointException."""


# The opcode a Python pickle of protocol 2 or later starts with (PROTO),
# followed by the protocol number: torch.distributed.checkpoint's
# FileSystemWriter pickles its Metadata into .metadata.
_PICKLE_PROTO = 0x80


def is_torch_dcp_checkpoint(directory) -> bool:
    """Whether `directory`/.metadata looks like torch.distributed.checkpoint's
    (a Python pickle) rather than dcp's. Reads its first two bytes only;
    False when it cannot be read."""
    try:
        with open(os.path.join(os.fspath(directory), ".metadata"), "rb") as f:
            head = f.read(2)
    except (OSError, TypeError, ValueError):
        return False
    return len(head) == 2 and head[0] == _PICKLE_PROTO and 2 <= head[1] <= 5


def foreign_checkpoint_error(error: CheckpointException, directory
                             ) -> CheckpointException | None:
    """For `error`, a failure reading the FileSystem checkpoint in
    `directory`: a CheckpointNotImplementedError (code UNIMPLEMENTED) saying
    how to convert it when `error` is DATA_LOSS and the directory holds a
    checkpoint written by torch.distributed.checkpoint; else None. Its
    failures name the same ranks as `error`'s. Raise it `from error`."""
    if not isinstance(error, CheckpointException) or \
            error.code != _lib.DATA_LOSS or \
            not is_torch_dcp_checkpoint(directory):
        return None
    directory = os.fspath(directory)
    msg = (f"{directory} holds a checkpoint written by "
           "torch.distributed.checkpoint (its .metadata is a Python "
           "pickle), which dcp does not read. Convert it once: "
           f"dcp.format_utils.torch_dcp_to_dcp({directory!r}, NEW_DIR) "
           "(reads it with torch's DCP in one process), or load it with "
           "torch.distributed.checkpoint.load(state_dict, checkpoint_id="
           f"{directory!r}) and save that state dict with dcp.save("
           "state_dict, checkpoint_id=NEW_DIR)")
    code = _lib.UNIMPLEMENTED
    failures = {r: (CheckpointNotImplementedError(msg, None, code),
                    traceback.StackSummary())
                for r in (error.failures or {0: None})}
    return CheckpointNotImplementedError(msg, failures, code)


_MEGA_SCHEME = "mega://"


def file_in_the_way(path, kind: str) -> CheckpointException | None:
    """For a `kind` ("load" or "save") at plain file system path `path` (or
    a save's mega://DIR; None for other URIs of the storage registry): the
    error when a file stands where the checkpoint's directory goes, else
    None. A load of a file gets CheckpointFileNotFoundError (NOT_FOUND)
    saying how to read it; a save through a file,
    CheckpointNotADirectoryError (FAILED_PRECONDITION). Raises as
    checked_path for a path that is no path or holds a NUL byte."""
    path = checked_path(path)
    if kind == "save" and path.startswith(_MEGA_SCHEME) and \
            len(path) > len(_MEGA_SCHEME):
        return _file_in_the_way_of_save(path, path[len(_MEGA_SCHEME):])
    if "://" in path:
        return None
    if kind == "load":
        if not os.path.isfile(path):
            return None
        if os.path.basename(os.path.normpath(path)) == ".metadata":
            hint = ("pass the directory that holds it: "
                    f"{os.path.dirname(os.path.normpath(path))!r}")
        else:
            hint = ("read a torch.save file with torch.load, or convert it "
                    "once with dcp.format_utils.torch_save_to_dcp("
                    f"{path!r}, NEW_DIR)")
        return from_status(
            _lib.NOT_FOUND,
            f"{path} is a file, not a checkpoint directory; {hint}",
            cls=CheckpointFileNotFoundError)
    return _file_in_the_way_of_save(path, path)


def _file_in_the_way_of_save(path, local) -> CheckpointException | None:
    """file_in_the_way of a save to `path` (as given), whose directory is
    `local` on the file system."""
    # The first path that exists, from `local` up: a directory, or a file
    # where one must be made.
    here = os.path.abspath(local)
    while not os.path.lexists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    if os.path.isdir(here) or not os.path.exists(here):
        return None  # a directory, or a dangling link: the engine reports
    what = "is a file" if here == os.path.abspath(local) else \
        f"is under {here}, a file"
    return from_status(
        _lib.FAILED_PRECONDITION,
        f"cannot save to {path}: it {what}, not a directory; choose a "
        "directory path for the checkpoint", cls=CheckpointNotADirectoryError)
