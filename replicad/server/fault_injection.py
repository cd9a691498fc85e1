"""Fault injection for acceptance tests — NOT part of the production API.

The routes exist only when the daemon runs with ``REPLICAD_FAULT_INJECTION=1`` in its environment (never set
by the config file or the shipped units); otherwise they answer 404 like any unknown path.

* ``POST /_fault/crash_task?task=<name>[&message=…]`` — the named background task raises
  :class:`InjectedFault` before its next unit of work: the supervisor counts the crash, records the error
  and restarts the task after its back-off, exactly as for a real crash.  Answers the task's health
  before the crash as JSON; 404 with code 0 for an unknown task name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from aiohttp import web

from replicad.errors import BadInputError, ReplicadError
from replicad.logging import get_logger
from replicad.tasks import Supervisor

ENV_VAR = "REPLICAD_FAULT_INJECTION"
log = get_logger(__name__)


class InjectedFault(RuntimeError):
    """The exception an injected crash raises inside a background task."""


class UnknownTaskError(ReplicadError):
    code = 0
    http_status = 404


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def add_routes(app: web.Application, supervisor: Callable[[], Supervisor | None]) -> None:
    """Register the fault-injection routes; ``supervisor()`` returns the running supervisor (or None)."""

    async def crash_task(request: web.Request) -> web.Response:
        sup = supervisor()
        name = request.query.get("task", "")
        if not name:
            raise BadInputError("crash_task needs ?task=<name>")
        if sup is None:
            raise UnknownTaskError("the supervisor is not running yet")
        health = sup.health().get(name)
        if health is None:
            known = ", ".join(sorted(sup.health()))
            raise UnknownTaskError(f"no background task named {name!r}; tasks: {known}")
        message = request.query.get("message") or f"fault injected into {name}"
        sup.get(name).inject_fault(InjectedFault(message))
        log.warning("fault_injected", task=name, message=message)
        return web.json_response(health.to_dict())

    app.router.add_post("/_fault/crash_task", crash_task)
    log.warning("fault_injection_enabled", env=ENV_VAR)

