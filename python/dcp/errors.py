"""Exceptions of dcp.

Every failure the engine reports for a save, load or metadata read raises a
CheckpointException (the seed's exception), so `except CheckpointException`
catches them all. The class raised is a subclass chosen by the status code,
which also derives from the matching Python built-in, so code written for
plain Python errors keeps working:

  INVALID_ARGUMENT, OUT_OF_RANGE  CheckpointValueError      (ValueError)
  NOT_FOUND                       CheckpointNotFoundError   (LookupError);
                                  CheckpointFileNotFoundError
                                  (FileNotFoundError) when the checkpoint
                                  itself is missing
  ALREADY_EXISTS                  CheckpointExistsError     (FileExistsError)
  PERMISSION_DENIED               CheckpointPermissionError (PermissionError)
  DEADLINE_EXCEEDED               CheckpointTimeoutError    (TimeoutError)
  UNIMPLEMENTED                   CheckpointNotImplementedError
                                  (NotImplementedError)
  DATA_LOSS                       CheckpointCorruptError
  anything else                   CheckpointException

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
import traceback

from . import _lib

__all__ = [
    "CheckpointException", "CheckpointValueError", "CheckpointNotFoundError",
    "CheckpointFileNotFoundError", "CheckpointExistsError",
    "CheckpointPermissionError", "CheckpointTimeoutError",
    "CheckpointNotImplementedError", "CheckpointCorruptError",
    "CheckpointIdMissingError",
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
    """NOT_FOUND: there is no checkpoint at checkpoint_id."""


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


def from_status(code: int, message: str, rank_failures=(),
                what: str | None = None, *, rank: int = 0,
                cls: type[CheckpointException] | None = None
                ) -> CheckpointException:
    """The exception for a failed C call: `rank_failures` is
    [(rank, code, message)] from dcp_last_error_rank_failure. When it is
    empty (the failure of this process alone) `.failures` is {rank: (an
    exception of the same class and message, StackSummary())}; `rank` is
    this process's rank in the operation's group (0: none). `cls`: the
    class to raise (default: exception_class(code))."""
    cls = cls or exception_class(code)
    failures = {}
    for r, rcode, rmsg in rank_failures:
        failures[r] = (exception_class(rcode)(rmsg, None, rcode),
                       traceback.StackSummary())
    msg = f"{what}: {message}" if what else message
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
