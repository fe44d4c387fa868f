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
a local error the engine did not share with other ranks) has {}.

Errors found in Python before the engine is called (an object that cannot
be saved without allow_pickle, a key that is not a str or int) raise plain
TypeError/ValueError naming the key.
"""

from __future__ import annotations

import traceback

from . import _lib

__all__ = [
    "CheckpointException", "CheckpointValueError", "CheckpointNotFoundError",
    "CheckpointFileNotFoundError", "CheckpointExistsError",
    "CheckpointPermissionError", "CheckpointTimeoutError",
    "CheckpointNotImplementedError", "CheckpointCorruptError",
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
                what: str | None = None) -> CheckpointException:
    """The exception for a failed C call: `rank_failures` is
    [(rank, code, message)] from dcp_last_error_rank_failure."""
    failures = {}
    for rank, rcode, rmsg in rank_failures:
        failures[rank] = (exception_class(rcode)(rmsg, None, rcode),
                          traceback.StackSummary())
    msg = f"{what}: {message}" if what else message
    return exception_class(code)(msg, failures, code)
