"""One exception class per kind of failure, each carrying the server's message.

Every error the package raises is a KvcacheError. Arguments refused before any call (a
payload of the wrong size, a token id out of range) raise InvalidArgumentError, which is
also a ValueError.
"""
from typing import Any, Dict, Optional, Type

import grpc


class KvcacheError(Exception):
    """Base class. `code` is the gRPC status code (None for client-side checks)."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class NotFoundError(KvcacheError):
    """A namespace, chunk or lease that does not exist (or is another tenant's)."""


class PermissionDeniedError(KvcacheError):
    """A missing or unknown bearer token, or a call the tenant may not make."""


class InvalidArgumentError(KvcacheError, ValueError):
    """A request the server (or this client, before sending) refuses as malformed."""


class FailedPreconditionError(KvcacheError):
    """The server cannot do this now (a parent chunk not cached, a tier it lacks)."""


class AlreadyExistsError(KvcacheError):
    """The thing exists already, with other settings."""


class UnavailableError(KvcacheError):
    """The server cannot be reached, or did not answer in time."""


class ResourceExhaustedError(KvcacheError):
    """A limit was reached: capacity, leases, calls in flight, message size."""


class DataLossError(KvcacheError):
    """Bytes that do not verify, on the server or in an answer this client checked."""


class InternalError(KvcacheError):
    """The server failed (I/O, a bug); the request may be retried."""


_BY_CODE: Dict[Any, Type[KvcacheError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
}


def from_rpc_error(error: Any) -> KvcacheError:
    """The KvcacheError for a grpc.RpcError (or grpc.aio.AioRpcError)."""
    code = error.code()
    cls = _BY_CODE.get(code, InternalError)
    details = error.details() or code.name
    return cls(f"{code.name}: {details}", code)


_BY_NUMBER: Dict[int, Any] = {c.value[0]: c for c in grpc.StatusCode}


def from_status(code: int, details: Optional[str]) -> KvcacheError:
    """The KvcacheError for a status by its number (a call made outside grpcio: the
    native fetch), worded as from_rpc_error words it."""
    status = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(status, InternalError)
    return cls(f"{status.name}: {details or status.name}", status)
