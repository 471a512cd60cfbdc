"""Claim holders over Celery's remote control (guarantee 30).

A claim names the worker process that holds it (``node/pid/task id``). Before a claim is
taken over, the taker asks that worker with the ``saga_claim_holder`` control command,
addressed to the holder's node only. The holder's main process, which knows which task
each of its pool processes runs, answers:

- ``absent``: none of its processes runs that task any more;
- ``held``: it still runs it, and the lease was renewed just now (from the main process,
  which reaches the store as well as the body's process does);
- ``stopped``: it runs it but cannot reach the store to renew the lease, so it stopped the
  body's pool process before anyone else may run the step (fencing);
- ``unstoppable``: the same, under a pool whose bodies cannot be stopped (threads, solo):
  the claim stays with it until it can renew or finishes.

A pool process that dies (SIGKILL, the OOM killer, ``os._exit``) cannot give up its claims:
its worker's main process does it as soon as Celery reports the loss (``pool_loss``), so
the redelivered message runs at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from celery import Celery, current_task
from kombu.exceptions import ChannelError

from celery_saga.decisions.takeover import Answer
from celery_saga.records import Attempt
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.heartbeat import LeaseState
from celery_saga.runtime.holders import HeldClaim, Holders, holder_name, parse_holder
from celery_saga.store.transient import describe_store_error
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.saga_header import HEADER

logger = logging.getLogger("celery_saga")

COMMAND = "saga_claim_holder"
#: Asked of every worker before the recovery sweep sends a run's message again.
RUNS_COMMAND = "saga_runs_running"
#: Seconds the sweep waits for the workers' answers (each only looks at what it runs; as
#: for a live lease's holder, a busy main process gets two). A worker silent that long
#: counts as running none of them.
ASK_RUNS_TIMEOUT = 2.0
#: Seconds a taker waits for the answer about a live lease (the holder only looks it up),
#: and about a lapsed one (the holder first tries to renew it, then may stop the body).
ASK_LIVE_TIMEOUT = 2.0
#: (Not shorter, and no quick ping first: a holder's main process answers one taker at a
#: time, and may spend a renewal budget on another taker's question before this one's.)
ASK_LAPSED_TIMEOUT = 10.0
#: Seconds the holder's main process tries to renew a lapsed lease before it concludes that
#: it cannot reach the store, and waits for a stopped pool process to be gone.
RENEW_BUDGET = 5.0
STOP_WAIT = 2.0
#: The AMQP reply code of a passive declare of a queue that does not exist.
NOT_FOUND = 404
#: How a cancelled run's body is stopped: the signal of Celery's soft time limit, which
#: the body sees as ``SoftTimeLimitExceeded`` (its ``finally`` blocks still run).
STOP_SIGNAL = "SIGUSR1"


class CeleryHolders(Holders):
    """Names this process after the Celery task it runs, and asks other workers of ``app``."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def me(self) -> str:
        request = getattr(current_task, "request", None)
        node = getattr(request, "hostname", None)
        if not node:
            return super().me()
        return holder_name(str(node), os.getpid(), getattr(request, "id", None))

    def ask(self, claim: HeldClaim) -> Answer:
        parsed = parse_holder(claim.holder or "")
        if parsed is None or parsed[2] == "-" or parsed[1] == os.getpid():
            return super().ask(claim)  # no worker to ask, or this very process
        node, pid, task_id = parsed
        arguments = {
            "kind": claim.kind,
            "execution_id": claim.execution_id,
            "name": claim.name,
            "attempt": claim.attempt,
            "pid": pid,
            "task_id": task_id,
            "lease_live": claim.lease_live,
            "holder": claim.holder,
        }
        timeout = ASK_LIVE_TIMEOUT if claim.lease_live else ASK_LAPSED_TIMEOUT
        if not claim.lease_live and self._mailbox_gone(node):
            return Answer.SILENT  # its worker's connection to the broker is gone with it
        try:
            replies = self.app.control.broadcast(
                COMMAND,
                arguments=arguments,
                destination=[node],
                reply=True,
                timeout=timeout,
                limit=1,
            )
        except Exception as error:
            logger.warning("could not ask %s about its claim: %r", node, error)
            return Answer.UNASKED
        for reply in replies or ():
            answer = (reply.get(node) or {}).get("answer")
            if answer in Answer._value2member_map_:
                return Answer(answer)
        return Answer.SILENT

    def running(self, execution_ids: Collection[str]) -> dict[str, set[str]] | None:
        """This process's own, and every worker's answer over the remote control. On the
        in-process broker only this process can run anything; a broker without broadcasts
        (no remote control) leaves nobody else to ask, as before this question existed."""
        running = super().running(execution_ids)
        assert running is not None
        try:
            with self.app.connection_for_write() as connection:
                transport = connection.transport
                if transport.driver_type == "memory" or not _broadcasts(transport):
                    return running
            replies = self.app.control.broadcast(
                RUNS_COMMAND,
                arguments={"execution_ids": sorted(execution_ids)},
                reply=True,
                timeout=ASK_RUNS_TIMEOUT,
            )
        except Exception as error:
            logger.warning("could not ask the workers what they run: %r", error)
            return None
        for reply in replies or ():
            for answer in reply.values():
                for execution_id, holders in ((answer or {}).get("running") or {}).items():
                    running.setdefault(str(execution_id), set()).update(map(str, holders))
        return running

    def _mailbox_gone(self, node: str) -> bool:
        """On RabbitMQ: whether the remote-control queue of ``node`` is gone. The broker
        deletes it when the worker's connection closes, so a worker that died needs no
        answer to be waited out; anywhere else (or if the broker cannot say) False."""
        mailbox = self.app.control.mailbox
        try:
            with self.app.connection_for_write() as connection:
                if connection.transport.driver_type != "amqp":
                    return False
                channel = connection.channel()
                try:
                    channel.queue_declare(queue=mailbox.get_queue(node).name, passive=True)
                except ChannelError as error:
                    return bool(getattr(error, "code", None) == NOT_FOUND)
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()
        except Exception as error:
            logger.debug("could not look for the mailbox of %s: %r", node, error)
        return False

    def stop(self, holder: str) -> None:
        """Revoke the holder's task with the soft time limit's signal: Celery stops the body
        there (prefork), and Flower shows the task as REVOKED, as for any revoke."""
        parsed = parse_holder(holder)
        if parsed is None or parsed[2] == "-":
            return
        try:
            self.app.control.revoke(
                parsed[2], terminate=True, signal=STOP_SIGNAL, destination=[parsed[0]]
            )
        except Exception as error:  # the body stops at its next cancelled() check
            logger.warning("could not ask %s to stop task %s: %r", parsed[0], parsed[2], error)


def answer_holder(parts: WorkerParts, state: Any, **arguments: Any) -> dict[str, str]:
    """The ``saga_claim_holder`` command, in the holder's main process."""
    from celery.worker import state as worker_state

    task_id, pid = str(arguments["task_id"]), int(arguments["pid"])
    request = next(
        (r for r in list(worker_state.active_requests) if r.id == task_id and r.worker_pid == pid),
        None,
    )
    if request is None or (pid != os.getpid() and not process_running(pid)):
        return {"answer": Answer.ABSENT.value}  # its process died, or the task is over
    if arguments.get("lease_live"):
        return {"answer": Answer.HELD.value}
    renewed = _renew_within(parts, arguments, RENEW_BUDGET)
    if renewed is LeaseState.HELD:
        return {"answer": Answer.HELD.value}
    if renewed is LeaseState.ENDED:
        return {"answer": Answer.ABSENT.value}
    # The store cannot be reached from here (or the claim is someone else's already): the
    # body must stop before anyone else may run the step.
    what = f"{arguments['kind']} {arguments['name']!r} of execution {arguments['execution_id']}"
    if pid == os.getpid():
        logger.error("%s: its lease cannot be renewed and its pool cannot stop it", what)
        return {"answer": Answer.UNSTOPPABLE.value}
    _stop_process(pid)
    logger.warning(
        "%s: its lease could not be renewed (the saga store is unreachable from this "
        "worker); its pool process %d was stopped so that it runs elsewhere, once",
        what,
        pid,
    )
    return {"answer": Answer.STOPPED.value}


def _broadcasts(transport: Any) -> bool:
    """Whether Celery's remote control can reach every worker over this transport."""
    implements = getattr(transport, "implements", None)
    return "fanout" in (getattr(implements, "exchange_type", None) or ())


def answer_runs(state: Any, **arguments: Any) -> dict[str, Any]:
    """The ``saga_runs_running`` command: the runs asked about with a saga message running
    in this worker -> the holder names of those messages (read from the requests its pool
    runs, not from the store: a claim the store lost is named nowhere else)."""
    from celery.worker import state as worker_state

    wanted = set(arguments.get("execution_ids") or ())
    running: dict[str, list[str]] = {}
    for request in list(worker_state.active_requests):
        header = saga_header_of(request)
        if header is None or str(header["id"]) not in wanted or not request.worker_pid:
            continue
        holder = holder_name(str(request.hostname), int(request.worker_pid), request.id)
        running.setdefault(str(header["id"]), []).append(holder)
    return {"running": running}


def saga_header_of(request: Any) -> dict[str, Any] | None:
    """The saga header of a request the worker holds, if it is a saga message."""
    headers = getattr(request, "_request_dict", None) or {}
    header = headers.get(HEADER) or (headers.get("headers") or {}).get(HEADER)
    return header if isinstance(header, dict) and "id" in header else None


def _renew_within(
    parts: WorkerParts, arguments: dict[str, Any], budget: float
) -> LeaseState | None:
    """Renew the asked-about lease from this process, retrying for ``budget`` s; None: the
    store could not be reached in time. Runs on a thread: a connection attempt to a cut
    store must not hold the worker's event loop longer than the budget."""
    renewals = parts.executor.renewals
    execution_id, name, attempt = (
        str(arguments["execution_id"]),
        str(arguments["name"]),
        int(arguments["attempt"]),
    )
    holder = arguments.get("holder")  # not sent by a taker of an earlier release
    renew: Callable[[Any], LeaseState]
    if arguments["kind"] == "reversal":
        renew = renewals.of(Attempt.reversal(execution_id, name, attempt, None, holder))
    else:
        # Its position and what its claim stored are not known here: a claim the store
        # lost is written back by the body's own heartbeat, not from this process.
        step = Attempt(execution_id, name, 0, 0, attempt, None, holder)
        renew = renewals.of(step, None)
    lease = timedelta(seconds=parts.settings.lease_seconds)
    result: Future[LeaseState | None] = Future()

    def attempt_renewals() -> None:
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            try:
                result.set_result(renew(get_clock().now() + lease))
                return
            except Exception as error:
                logger.debug("renewal for a taker failed: %s", describe_store_error(error))
                time.sleep(0.5)
        result.set_result(None)

    threading.Thread(target=attempt_renewals, name="saga-holder-renewal", daemon=True).start()
    try:
        return result.result(timeout=budget + 1.0)
    except Exception:
        return None


def _stop_process(pid: int) -> None:
    """SIGKILL the pool process running the body, and wait (boundedly) until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline and process_running(pid):
        time.sleep(0.02)


def process_running(pid: int) -> bool:
    """Whether process ``pid`` is alive (not gone, and not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False
