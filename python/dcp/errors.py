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
  DATA_LOSS                       CheckpointCorruptError
  FAILED_PRECONDITION             CheckpointNotADirectoryError
                                  (NotADirectoryError) for a save whose
                                  path has a file where a directory goes
  anything else                   CheckpointException

Engine messages name options as Python passes them (`overwrite=True`).

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
object raises CheckpointIdMissingError (a ValueError and, as the seed's
error, a RuntimeError).
"""

from __future__ import annotations

import os
import re
import traceback

from . import _lib

__all__ = [
    "CheckpointException", "CheckpointValueError", "CheckpointNotFoundError",
    "CheckpointFileNotFoundError", "CheckpointExistsError",
    "CheckpointPermissionError", "CheckpointTimeoutError",
    "CheckpointNotImplementedError", "CheckpointCorruptError",
    "CheckpointNotADirectoryError", "CheckpointIdMissingError",
]

_CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class CheckpointException(Exception):
    """A save, load or metadata read failed.

    Seed signature: CheckpointException(msg, failures). `failures` maps a
    rank to (exception, traceback.StackSummary).
    """

    def __init__(self, msg: str, failures=None, code: int = _lib.UNKNOWN):
        super().__init__(msg)
        self.msg = msg
        self.failures = dict(failures or {})
        self.code = code

    @property
    def code_name(self) -> str:
        return _CODE_NAMES.get(self.code, "UNKNOWN_CODE")

    def __str__(self) -> str:
        return self.msg

    def __reduce__(self):  # Pickles across processes (PROCESS writer).
        return (_rebuild, (type(self), self.msg, self.failures, self.code))


def _rebuild(cls, msg, failures, code):
    return cls(msg, failures, code)


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


class CheckpointNotImplementedError(CheckpointException, NotImplementedError):
    """UNIMPLEMENTED."""


class CheckpointCorruptError(CheckpointException):
    """DATA_LOSS: checksum mismatch, truncated or undecodable data; the
    message names the file."""


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
}


def exception_class(code: int) -> type[CheckpointException]:
    return _BY_CODE.get(code, CheckpointException)


# An engine option in a message, spelled as C and C++ set it.
_C_OPTION = re.compile(
    r"(?<![\w:])(overwrite|flatten_state_dict|use_collectives|no_dist)"
    r"=(true|false)\b")


def python_spelling(message: str) -> str:
    """`message` with the engine's options spelled as Python passes them
    (`overwrite=True`, not `overwrite=true`)."""
    return _C_OPTION.sub(
        lambda m: f"{m.group(1)}={m.group(2).capitalize()}", message)


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


def file_in_the_way(path, kind: str) -> CheckpointException | None:
    """For a `kind` ("load" or "save") at plain file system path `path` (not
    a URI of the storage registry, such as mega://DIR): the error when a
    file stands where the checkpoint's directory goes, else None. A load
    of a file gets CheckpointFileNotFoundError (NOT_FOUND) saying how to
    read it; a save through a file, CheckpointNotADirectoryError
    (FAILED_PRECONDITION)."""
    path = os.fspath(path)
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
    # The first path that exists, from `path` up: a directory, or a file
    # where one must be made.
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    if os.path.isdir(here) or not os.path.exists(here):
        return None  # a directory, or a dangling link: the engine reports
    what = "is a file" if here == os.path.abspath(path) else \
        f"is under {here}, a file"
    return from_status(
        _lib.FAILED_PRECONDITION,
        f"cannot save to {path}: it {what}, not a directory; choose a "
        "directory path for the checkpoint", cls=CheckpointNotADirectoryError)
