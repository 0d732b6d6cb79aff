"""Every exception of the daemon is defined in memento_sessions.errors, and its docstring's tree is the code's."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import memento_sessions
from memento_sessions import errors
from memento_sessions.auth import AuthError
from memento_sessions.embedded.datadir import DataDirLocked
from memento_sessions.embedded.process import EmbeddedStartError
from memento_sessions.kg.loader import BadRecord


def defined_exceptions() -> dict[str, type[errors.MementoError]]:
    """module:name -> class, for every MementoError defined in the package outside the client (whose errors are
    its own, client/errors.py) and the hook's stdlib-only wire (cli/wire.py imports nothing of the package)."""
    found: dict[str, type[errors.MementoError]] = {}
    for info in pkgutil.walk_packages(memento_sessions.__path__, "memento_sessions."):
        if info.name.startswith("memento_sessions.client") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, errors.MementoError) and value.__module__ == info.name:
                found[f"{info.name}:{name}"] = value
    return found


def test_every_exception_is_defined_in_errors() -> None:
    elsewhere = [name for name in defined_exceptions() if not name.startswith("memento_sessions.errors:")]
    assert elsewhere == []


def test_the_old_names_are_the_same_classes() -> None:
    assert (AuthError, DataDirLocked, EmbeddedStartError, BadRecord) == (
        errors.AuthError, errors.DataDirLocked, errors.EmbeddedStartError, errors.BadRecord)


def test_the_docstring_tree_is_the_class_tree() -> None:
    doc = errors.__doc__ or ""
    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^( *)(?:\+-- )?([A-Z]\w+)(?:\s|$)", line)
        if not match or not hasattr(errors, match[2]):
            continue
        depth = len(match[1])
        while parents and parents[-1][0] >= depth:
            parents.pop()
        if parents:
            drawn[match[2]] = parents[-1][1]
        parents.append((depth, match[2]))
    actual = {name: cls.__base__.__name__ for name, cls in vars(errors).items()
              if inspect.isclass(cls) and issubclass(cls, errors.MementoError) and cls is not errors.MementoError
              and cls.__base__ is not None}
    assert drawn == actual
    assert drawn["BackendUnavailable"] == "RpcError"


def test_every_rpc_error_keeps_its_code() -> None:
    """The API's error codes, as each class declares it (`class NotFound(RpcError, code=-32004)`)."""
    codes = {name: cls.code for name, cls in vars(errors).items()
             if inspect.isclass(cls) and issubclass(cls, errors.RpcError)}
    assert codes == {"RpcError": -32603, "ParseError": -32700, "InvalidRequest": -32600, "MethodNotFound": -32601,
                     "InvalidParams": -32602, "Forbidden": -32001, "NotFound": -32004, "Conflict": -32009,
                     "RateLimited": -32029, "BackendUnavailable": -32050}
    assert errors.Conflict("full", {"reason": "session_full"}).to_dict() == {
        "code": -32009, "message": "full", "data": {"reason": "session_full"}}
    assert errors.NotFound("gone").to_dict() == {"code": -32004, "message": "gone"}


def test_the_client_raises_the_class_of_every_code() -> None:
    from memento_sessions.client.errors import rpc_error

    for cls in errors.RpcError.__subclasses__():
        raised = rpc_error({"code": cls.code, "message": "m", "data": {"k": 1}})
        assert type(raised) is cls and raised.code == cls.code and raised.data == {"k": 1}
    unknown = rpc_error({"code": -32099, "message": "new"})
    assert type(unknown) is errors.RpcError and unknown.code == -32099
